// The Boost.Process implementation of ProcessLauncher / TrainerProcess (launcher.h).
//
// Boost.Process (v1) is used only to fork and exec: the child is detached at once and from then on
// we own its pid with waitpid/kill, so Boost never reaps behind the owner's back (no async API, no
// SIGCHLD handler). Boost throws; every throw stops at Start().
#include "launcher/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/close_range.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include <glog/logging.h>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>

namespace edl::launcher {

namespace bp = boost::process;

namespace {

// How long to wait for a SIGKILLed group leader to be reapable. SIGKILL cannot be ignored, so only
// a process stuck in the kernel (D state, e.g. a hung NFS or GPU driver call) takes longer.
constexpr std::chrono::milliseconds kReapAfterKill{5000};

std::string CommandName(const TrainerSpec& spec) {
  return spec.argv.empty() ? std::string("(empty command)") : "`" + spec.argv[0] + "`";
}

ExitInfo FromWaitStatus(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) {
    info.exited = true;
    info.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
  }
  return info;
}

// Resolves argv[0] against `path_env` like execvp does. Returns the path to exec or an error that
// names the command and the fix.
StatusOr<std::string> ResolveCommand(const std::string& cmd, const std::string& path_env) {
  namespace fs = std::filesystem;
  auto check = [&](const std::string& path) -> Status {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return Status::NotFound("trainer command `" + cmd + "`: " + path +
                              " does not exist; check the path in the trainer command");
    }
    if (fs::is_directory(path, ec)) {
      return Status::InvalidArgument("trainer command `" + cmd + "`: " + path +
                                     " is a directory, not a program");
    }
    if (::access(path.c_str(), X_OK) != 0) {
      return Status::IOError("trainer command `" + cmd + "`: " + path + " is not executable (" +
                             std::strerror(errno) + "); fix it with `chmod +x " + path + "`");
    }
    return Status::OK();
  };
  if (cmd.empty()) return Status::InvalidArgument("trainer command is an empty string");
  if (cmd.find('/') != std::string::npos) {
    EDL_RETURN_IF_ERROR(check(cmd));
    return cmd;
  }
  Status first_problem;
  std::stringstream dirs(path_env);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + cmd;
    Status s = check(candidate);
    if (s.ok()) return candidate;
    if (!s.IsNotFound() && first_problem.ok()) first_problem = s;
  }
  if (!first_problem.ok()) return first_problem;
  return Status::NotFound("trainer command `" + cmd + "` was not found in PATH=" + path_env +
                          "; give an absolute path or install it");
}

// Opens `path` for appending (creating it and its parent directories) and returns a FILE* that the
// caller fcloses. The descriptor is close-on-exec; Boost dup2s it onto the child's 1 and 2.
StatusOr<FILE*> OpenLog(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) {
    return Status::IOError("trainer log directory " + parent.string() + ": " + ec.message() +
                           "; choose a writable --log_dir");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return PosixError("trainer log file " + path + " (choose a writable --log_dir)", errno);
  }
  FILE* f = ::fdopen(fd, "a");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    return PosixError("trainer log file " + path, err);
  }
  return f;
}

// Runs in the forked child before exec: async-signal-safe calls only. `parent` is the launcher's
// pid, read before the fork.
void PrepareChild(pid_t parent) {
  // The trainer dies with its launcher (a SIGKILLed `edl client` must not leave orphans training
  // on). The signal comes when the thread that forked exits; the client forks from its one
  // io_context thread. If the launcher died before prctl took effect, the child has been
  // re-parented already and no signal will come: check, and go.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
  ::setpgid(0, 0);  // own process group: a signal to -pid reaches the trainer's workers too
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the launcher may block SIGCHLD/SIGINT/SIGTERM
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);  // daemons ignore SIGPIPE; ignored signals survive exec
  // No descriptor of ours beyond stdio survives exec (a listening socket would outlive us).
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    struct rlimit rl;
    rlim_t max_fd = 65536;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < max_fd) {
      max_fd = rl.rlim_cur;
    }
    for (int fd = 3; fd < static_cast<int>(max_fd); ++fd) {
      const int flags = ::fcntl(fd, F_GETFD);
      if (flags >= 0 && !(flags & FD_CLOEXEC)) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
  }
}

// The launcher's environment with `overrides` applied, as "KEY=VALUE" strings.
std::vector<std::string> MergedEnvironment(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    merged.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  for (const auto& [key, value] : overrides) merged[key] = value;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [key, value] : merged) out.push_back(key + "=" + value);
  return out;
}

// Reaps a child whose exec failed (it exits right after reporting the error). Bounded wait.
void ReapFailedChild(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    const pid_t w = ::waitpid(pid, nullptr, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  LOG(WARNING) << "child " << pid << " whose exec failed did not exit within 5 s; killing it";
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// ---- TrainerProcess

class PosixTrainerProcess final : public TrainerProcess {
 public:
  PosixTrainerProcess(int pid, std::string name) : pid_(pid), name_(std::move(name)) {}
  ~PosixTrainerProcess() override {
    if (reaped_) return;
    Kill();
    if (!WaitReaped(kReapAfterKill)) {
      LOG(ERROR) << "trainer " << name_ << " (pid " << pid_ << ") did not die within "
                 << kReapAfterKill.count()
                 << " ms of SIGKILL; it is probably stuck in the kernel (D state); leaving it";
    }
  }
  PosixTrainerProcess(const PosixTrainerProcess&) = delete;
  PosixTrainerProcess& operator=(const PosixTrainerProcess&) = delete;

  int pid() const override { return pid_; }

  bool Poll(ExitInfo* info) override {
    if (!reaped_) TryReap();
    if (reaped_ && info != nullptr) *info = info_;
    return reaped_;
  }

  void Terminate() override { SignalGroup(SIGTERM); }
  void Kill() override { SignalGroup(SIGKILL); }

  ExitInfo Stop(std::chrono::milliseconds grace) override {
    if (Poll(nullptr)) return info_;
    Terminate();
    if (WaitReaped(grace)) return info_;
    LOG(WARNING) << "trainer " << name_ << " (pid " << pid_ << ") still running " << grace.count()
                 << " ms after SIGTERM; sending SIGKILL to its process group";
    Kill();
    if (WaitReaped(kReapAfterKill)) return info_;
    LOG(ERROR) << "trainer " << name_ << " (pid " << pid_ << ") did not die within "
               << kReapAfterKill.count() << " ms of SIGKILL; it is probably stuck in the kernel";
    ExitInfo pending;
    pending.signal = SIGKILL;
    return pending;
  }

 private:
  void SignalGroup(int sig) {
    if (reaped_) return;  // the pgid may belong to another process by now
    if (::kill(-pid_, sig) != 0 && errno == ESRCH) {
      ::kill(pid_, sig);  // the trainer left its group (setsid): reach at least the trainer
    }
  }

  // Reaps the child if it has exited. First peeks (WNOWAIT) so that the zombie still holds the
  // pgid while the group's leftovers are killed.
  void TryReap() {
    siginfo_t si;
    std::memset(&si, 0, sizeof(si));
    int r;
    do {
      r = ::waitid(P_PID, pid_, &si, WEXITED | WNOHANG | WNOWAIT);
    } while (r != 0 && errno == EINTR);
    if (r != 0) {
      if (errno == ECHILD) MarkLost();
      return;
    }
    if (si.si_pid != pid_) return;  // still running
    ::kill(-pid_, SIGKILL);         // workers it left behind die with it
    int status = 0;
    pid_t w;
    do {
      w = ::waitpid(pid_, &status, 0);  // does not block: the child is a zombie
    } while (w < 0 && errno == EINTR);
    if (w == pid_) {
      info_ = FromWaitStatus(status);
      reaped_ = true;
    } else if (w < 0 && errno == ECHILD) {
      MarkLost();
    }
  }

  void MarkLost() {
    LOG(ERROR) << "trainer " << name_ << " (pid " << pid_
               << ") was reaped by someone else (SIGCHLD ignored or waitpid(-1) in this process); "
                  "its exit status is lost";
    info_ = ExitInfo();
    info_.lost = true;
    reaped_ = true;
  }

  // Polls until reaped or `timeout`; returns reaped_.
  bool WaitReaped(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::milliseconds(1);
    while (!Poll(nullptr)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(20));
    }
    return true;
  }

  const int pid_;
  const std::string name_;  // argv[0], for log lines
  bool reaped_ = false;
  ExitInfo info_;
};

// ---- ProcessLauncher

class BoostProcessLauncher final : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<TrainerProcess>> Start(const TrainerSpec& spec) override {
    if (spec.argv.empty())
      return Status::InvalidArgument("trainer command is empty; give a command");
    auto path_it = spec.env.find("PATH");
    const char* own_path = std::getenv("PATH");
    const std::string path_env = path_it != spec.env.end() ? path_it->second
                                 : own_path != nullptr     ? own_path
                                                           : "/usr/local/bin:/usr/bin:/bin";
    StatusOr<std::string> exe = ResolveCommand(spec.argv[0], path_env);
    if (!exe.ok()) return exe.status();
    std::error_code fs_ec;
    if (!spec.working_dir.empty() && !std::filesystem::is_directory(spec.working_dir, fs_ec)) {
      return Status::NotFound("working directory " + spec.working_dir + " of trainer command " +
                              CommandName(spec) + " does not exist; create it or fix the setting");
    }
    FILE* log = nullptr;
    if (!spec.log_path.empty()) {
      StatusOr<FILE*> opened = OpenLog(spec.log_path);
      if (!opened.ok()) return opened.status();
      log = opened.value();
    }
    StatusOr<int> pid = Spawn(spec, exe.value(), log);
    if (log != nullptr) std::fclose(log);
    if (!pid.ok()) return pid.status();
    return std::unique_ptr<TrainerProcess>(new PosixTrainerProcess(pid.value(), spec.argv[0]));
  }

 private:
  static StatusOr<int> Spawn(const TrainerSpec& spec, const std::string& exe, FILE* log) {
    try {
      // Our own envp, not bp::environment: its find() in Boost 1.74 reads past the end of shorter
      // entries (std::equal over the key's length; AddressSanitizer reports it).
      const std::vector<std::string> env_strings = MergedEnvironment(spec.env);
      std::vector<char*> envp;
      for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
      envp.push_back(nullptr);
      const std::vector<std::string> args(spec.argv.begin() + 1, spec.argv.end());
      const std::string dir = spec.working_dir.empty() ? "." : spec.working_dir;
      std::error_code ec;
      pid_t failed_pid = -1;  // a child whose exec failed: Boost does not reap it, we do
      const pid_t parent = ::getpid();
      auto spawn = [&](auto&&... io) {
        return bp::child(
            bp::exe = exe, bp::args = args, bp::start_dir = dir, bp::std_in < bp::null, io...,
            bp::extend::on_setup = [&](auto& exec) { exec.env = envp.data(); },
            bp::extend::on_exec_setup = [parent](auto&) { PrepareChild(parent); },
            bp::extend::on_error = [&](auto& exec,
                                       const std::error_code&) { failed_pid = exec.pid; },
            ec);
      };
      bp::child child = log != nullptr ? spawn((bp::std_out & bp::std_err) > log) : spawn();
      if (failed_pid > 0) ReapFailedChild(failed_pid);
      if (ec) {
        return PosixError("cannot start trainer command " + CommandName(spec) + " (" + exe + ")",
                          ec.value());
      }
      const int pid = child.id();
      child.detach();  // from here on we own the pid: waitpid/kill in PosixTrainerProcess
      return pid;
    } catch (const std::exception& e) {
      return Status::IOError("cannot start trainer command " + CommandName(spec) + " (" + exe +
                             "): " + e.what());
    }
  }
};

}  // namespace

// ---- ExitInfo

bool ExitInfo::success() const { return exited && code == 0; }

std::string ExitInfo::ToString() const {
  if (lost) return "lost (reaped elsewhere, status unknown)";
  if (exited) return "exit " + std::to_string(code);
  const char* abbrev = ::sigabbrev_np(signal);
  if (abbrev == nullptr) return "killed by signal " + std::to_string(signal);
  return std::string("killed by SIG") + abbrev;
}

int ExitInfo::ShellStatus() const {
  if (lost) return 1;
  if (exited) return code;
  return 128 + signal;
}

std::unique_ptr<ProcessLauncher> NewProcessLauncher() {
  return std::make_unique<BoostProcessLauncher>();
}

}  // namespace edl::launcher
