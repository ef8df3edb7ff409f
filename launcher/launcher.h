// The launcher: starts and stops one trainer process. A trainer runs in its own process group (so a
// signal reaches the workers it forks too), with the EDL env contract (docs/ARCHITECTURE.md, "Env
// contract") added to the launcher's own environment, stdout and stderr appended to a per-trainer
// log file and stdin from /dev/null. Stopping is SIGTERM to the group, a grace period, then
// SIGKILL.
//
// OS access sits behind ProcessLauncher so the job client can be tested with a fake;
// NewProcessLauncher() is the real one (Boost.Process).
//
// Reaping: nothing here installs a SIGCHLD handler or reaps behind the owner's back. The owner
// (e.g. the job client's asio::signal_set on SIGCHLD) calls Poll() on each child; Poll() reaps with
// waitpid(WNOHANG). A process that has reaped children itself (SIGCHLD set to SIG_IGN, or a
// waitpid(-1)) breaks this contract: Poll() then reports the child as lost (ExitInfo::lost).
//
// Thread-safety: a TrainerProcess is not thread-safe (one owner thread). ProcessLauncher::Start may
// be called from several threads; BuildTrainerEnv is a pure function. A trainer is started with
// PR_SET_PDEATHSIG(SIGKILL), which Linux ties to the *thread* that forked it: call Start from a
// thread that lives as long as the trainers should (the client's io thread, edl launch's main
// thread), never from a short-lived worker, or the trainer dies when that thread exits.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/env_contract.h"

namespace edl::launcher {

// What to run. Every field is copied by Start(); the spec need not outlive the call.
struct TrainerSpec {
  // REQUIRES: not empty. argv[0] is looked up in PATH (the PATH of `env` when it sets one, else the
  // launcher's) when it contains no '/'; the child sees the resolved path as its argv[0].
  std::vector<std::string> argv;
  // Added to (overriding) the launcher's own environment, read at Start() time.
  std::map<std::string, std::string> env;
  // stdout+stderr are appended here; parent directories are created. Empty: inherit the launcher's.
  std::string log_path;
  // The child's working directory. Empty: inherit the launcher's.
  std::string working_dir;
};

// How a child ended.
struct ExitInfo {
  bool exited = false;  // true: exited with `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;
  bool lost = false;  // somebody else reaped the child; its status is unknown (never success)

  bool success() const;  // exited && code == 0
  std::string ToString()
      const;  // "exit 0", "exit 3", "killed by SIGKILL", "lost (reaped elsewhere)"
  // A shell-style exit status for a launcher process: code, 128 + signal, or 1 when lost.
  int ShellStatus() const;
};

// One child process in its own process group (pgid == pid). The destructor SIGKILLs the group if
// the child is still running and reaps it (bounded wait). Not thread-safe: one owner thread.
//
// Invariant: once Poll()/Stop() has reaped the child, no signal is sent to its pgid any more (the
// number may belong to somebody else by then). Before reaping, the zombie keeps the pgid reserved,
// so Poll() kills the group's leftovers (workers the trainer forked) before it reaps the leader.
class TrainerProcess {
 public:
  virtual ~TrainerProcess() = default;
  virtual int pid() const = 0;
  // Non-blocking. Returns true and fills *info once the child has exited (and then on every later
  // call, with the same info); false while it runs. On exit, SIGKILLs what is left of its group.
  virtual bool Poll(ExitInfo* info) = 0;
  virtual void Terminate() = 0;  // SIGTERM to the process group; no-op once reaped
  virtual void Kill() = 0;       // SIGKILL to the process group; no-op once reaped
  // Blocking: SIGTERM to the group, waits up to `grace` for the child to exit, then SIGKILL to the
  // group, and reaps (the wait after SIGKILL is bounded too). Returns how it ended; returns at once
  // if it had already ended.
  virtual ExitInfo Stop(std::chrono::milliseconds grace) = 0;
};

class ProcessLauncher {  // OS access behind an interface (testable with a fake)
 public:
  virtual ~ProcessLauncher() = default;
  // Starts `spec`. Returns the running child, or NotFound/IOError/InvalidArgument naming the
  // command (or log file, or working dir) and the fix when it cannot start: missing binary, not
  // executable, log file not writable, no such working dir. Never throws.
  virtual StatusOr<std::unique_ptr<TrainerProcess>> Start(const TrainerSpec& spec) = 0;
};

// The Boost.Process implementation. The child: own process group, signal mask cleared and SIGPIPE
// back to default, none of the launcher's file descriptors beyond 0-2 (all are marked close-on-exec
// in the child before exec, so a listening socket of the launcher never leaks into a trainer).
std::unique_ptr<ProcessLauncher> NewProcessLauncher();

// ---- env contract: what a trainer learns from its environment. Its one home is
// edl/runtime/env_contract.h (every variable name, BuildTrainerEnv for the parent, ParseTrainerEnv
// for the trainer); the launcher and the job client use it through these names.
using runtime::BuildTrainerEnv;
using runtime::EnvContract;
using runtime::SpareKind;
namespace env = runtime::env;

}  // namespace edl::launcher
