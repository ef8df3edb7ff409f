// `edl launch` (launch_main.h): static-mode local trainers.
#include "launcher/launch_main.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "edl/base/flags.h"
#include "launcher/launch_options.h"
#include "launcher/launcher.h"

namespace edl::launcher {

namespace {

constexpr int kUsageError = 2;
// How often the wait loop wakes without a signal (to pump --tee output).
constexpr std::chrono::milliseconds kTick{100};
// Bound on the wait for a SIGKILLed trainer to become reapable.
constexpr std::chrono::milliseconds kStopReapAfterKill{5000};

// ---- helpers

// Asks the kernel for a free TCP port on 127.0.0.1 (like torchrun: the port is released again, so
// another process could take it before the trainers bind it).
StatusOr<int> PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket() for a free MASTER_PORT", errno);
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  Status s;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    s = PosixError("binding 127.0.0.1:0 to pick a MASTER_PORT (give --master_port)", errno);
  }
  ::close(fd);
  if (!s.ok()) return s;
  return static_cast<int>(ntohs(addr.sin_port));
}

std::string DefaultLogDir() {
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return std::string("edl-logs/launch-") + buf + "-" + std::to_string(::getpid());
}

// Prints the lines appended to one trainer's log, prefixed (--tee). Reads the file the trainer
// writes, so the trainer's output goes to its log whether or not anybody tees it.
class LogTailer {
 public:
  LogTailer(std::string path, std::string prefix)
      : path_(std::move(path)), prefix_(std::move(prefix)) {}

  // Prints every complete new line; with `final`, also a trailing partial line.
  void Pump(bool final) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[65536];
    ssize_t n;
    while ((n = ::pread(fd, buf, sizeof(buf), offset_)) > 0) {
      offset_ += n;
      pending_.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t start = 0, nl;
    while ((nl = pending_.find('\n', start)) != std::string::npos) {
      std::cout << prefix_ << std::string_view(pending_).substr(start, nl + 1 - start);
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (final && !pending_.empty()) {
      std::cout << prefix_ << pending_ << "\n";
      pending_.clear();
    }
    std::cout.flush();
  }

 private:
  const std::string path_;
  const std::string prefix_;
  off_t offset_ = 0;
  std::string pending_;  // bytes after the last newline printed
};

// Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD in this thread so WaitSignal() can take them synchronously;
// restores the old mask on destruction. Children get a clear mask (launcher.h).
class SignalBlock {
 public:
  SignalBlock() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set_, sig);
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SignalBlock() {
    // Drop pending SIGCHLDs so they are not delivered (and ignored) after we return.
    timespec zero{0, 0};
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    while (::sigtimedwait(&chld, nullptr, &zero) > 0) {
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

  // Waits up to `timeout` for one of the blocked signals; returns it, or 0 on timeout.
  int Wait(std::chrono::milliseconds timeout) const {
    timespec ts{static_cast<time_t>(timeout.count() / 1000),
                static_cast<long>((timeout.count() % 1000) * 1000000)};
    const int sig = ::sigtimedwait(&set_, nullptr, &ts);
    return sig > 0 ? sig : 0;
  }

 private:
  sigset_t set_;
  sigset_t old_;
};

struct Trainer {
  int rank = 0;
  std::string log_path;
  std::unique_ptr<TrainerProcess> process;
  std::optional<ExitInfo> exit;  // set once reaped
};

bool IsStopSignal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

// Reaps whichever trainers have exited. Returns the index of the first failure seen, or -1.
int PollAll(std::vector<Trainer>* trainers) {
  int failed = -1;
  for (size_t i = 0; i < trainers->size(); ++i) {
    Trainer& t = (*trainers)[i];
    if (t.exit) continue;
    ExitInfo info;
    if (!t.process->Poll(&info)) continue;
    t.exit = info;
    if (!info.success() && failed < 0) failed = static_cast<int>(i);
  }
  return failed;
}

bool AllDone(const std::vector<Trainer>& trainers) {
  for (const Trainer& t : trainers) {
    if (!t.exit) return false;
  }
  return true;
}

// Stops every trainer still running: SIGTERM to all at once, up to `grace` for them to exit (a
// second SIGINT/SIGTERM cuts it short), then SIGKILL and reap (bounded, in Stop()).
void StopAll(std::vector<Trainer>* trainers, std::chrono::milliseconds grace,
             const SignalBlock& signals) {
  for (Trainer& t : *trainers) {
    if (!t.exit) t.process->Terminate();
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (PollAll(trainers), !AllDone(*trainers)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (IsStopSignal(signals.Wait(std::min(left, kTick)))) {
      std::cerr << "edl launch: signal again: killing the trainers now" << std::endl;
      break;
    }
  }
  for (Trainer& t : *trainers) {
    if (t.exit) continue;
    std::cerr << "edl launch: rank " << t.rank << " (pid " << t.process->pid()
              << ") still running after SIGTERM; sending SIGKILL" << std::endl;
    t.process->Kill();
    t.exit = t.process->Stop(kStopReapAfterKill);  // reaps; SIGTERM to a dying group is harmless
  }
}

// One start of the whole trainer set: its restart count, MASTER_PORT and rendezvous directory.
struct Attempt {
  int restart_count = 0;
  int port = 0;
  std::string rendezvous_dir;
};

// Starts trainer `rank`; returns an error naming the command.
Status StartTrainer(ProcessLauncher* launcher, const LaunchOptions& opts, const Attempt& attempt,
                    int rank, Trainer* t) {
  EnvContract c;
  c.job_id = opts.rdzv_id;
  c.trainer_id = "local-" + std::to_string(rank);
  c.generation = 0;
  c.slot = rank;
  c.rank = c.local_rank = rank;
  c.world_size = c.local_world_size = opts.num_trainers;
  c.master_addr = "127.0.0.1";
  c.master_port = attempt.port;
  c.rendezvous_dir = attempt.rendezvous_dir;
  c.restart_count = attempt.restart_count;
  c.max_restarts = opts.max_restarts;
  TrainerSpec spec;
  spec.argv = opts.command;
  spec.env = BuildTrainerEnv(c);
  spec.log_path = opts.log_dir + "/trainer-" + std::to_string(rank) + ".log";
  t->rank = rank;
  t->log_path = spec.log_path;
  StatusOr<std::unique_ptr<TrainerProcess>> p = launcher->Start(spec);
  if (!p.ok()) return p.status().WithContext("rank " + std::to_string(rank));
  t->process = std::move(p).value();
  return Status::OK();
}

// How one start of the trainer set ended.
struct Outcome {
  int code = 0;         // edl launch's exit code if nothing follows
  bool failed = false;  // a trainer failed (a restart may follow)
};

// Runs one start of the trainers to its end. `tees` (one per rank, or empty) outlive the attempt,
// so a restart's output continues where the last one's stopped (logs are appended to).
Outcome Supervise(const LaunchOptions& opts, const Attempt& attempt, const SignalBlock& signals,
                  std::vector<std::unique_ptr<LogTailer>>* tees) {
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(opts.stop_grace_s * 1000));
  std::unique_ptr<ProcessLauncher> launcher = NewProcessLauncher();
  std::vector<Trainer> trainers(static_cast<size_t>(opts.num_trainers));
  auto pump = [&](bool final) {
    for (auto& t : *tees) t->Pump(final);
  };
  for (int r = 0; r < opts.num_trainers; ++r) {
    Status s = StartTrainer(launcher.get(), opts, attempt, r, &trainers[r]);
    if (!s.ok()) {
      std::cerr << "edl launch: " << s.ToString() << std::endl;
      trainers.resize(static_cast<size_t>(r));
      StopAll(&trainers, grace, signals);
      return {1, false};  // a command that cannot start does not start on a retry either
    }
  }
  while (true) {
    const int sig = signals.Wait(kTick);
    const int failed = PollAll(&trainers);
    pump(false);
    if (IsStopSignal(sig)) {
      std::cerr << "edl launch: got " << ::sigabbrev_np(sig) << "; stopping all trainers"
                << std::endl;
      StopAll(&trainers, grace, signals);
      pump(true);
      return {128 + sig, false};
    }
    if (failed >= 0) {
      const Trainer& t = trainers[failed];
      std::cerr << "edl launch: rank " << t.rank << " (pid " << t.process->pid()
                << ") failed: " << t.exit->ToString()
                << "; stopping the other trainers. Its log: " << t.log_path << std::endl;
      StopAll(&trainers, grace, signals);
      pump(true);
      return {t.exit->ShellStatus() != 0 ? t.exit->ShellStatus() : 1, true};
    }
    if (AllDone(trainers)) {
      pump(true);
      std::cerr << "edl launch: all " << opts.num_trainers << " trainers exited 0" << std::endl;
      return {0, false};
    }
  }
}

// A local job: the trainer set, started again after a failure while --max_restarts allows.
int RunLocal(LaunchOptions opts) {
  if (opts.log_dir.empty()) opts.log_dir = DefaultLogDir();
  // Static mode even when run from inside a trainer under an edl client: the child would inherit
  // the variables that select elastic or restart mode (edl/runtime/run_mode.h).
  for (const char* name : {env::kClientSocket, env::kRestartMode, env::kJoining}) ::unsetenv(name);
  std::vector<std::unique_ptr<LogTailer>> tees;
  if (opts.tee) {
    for (int r = 0; r < opts.num_trainers; ++r) {
      tees.push_back(
          std::make_unique<LogTailer>(opts.log_dir + "/trainer-" + std::to_string(r) + ".log",
                                      "[rank " + std::to_string(r) + "] "));
    }
  }
  SignalBlock signals;
  for (int restart = 0;; ++restart) {
    Attempt attempt;
    attempt.restart_count = restart;
    attempt.port = opts.master_port;
    if (attempt.port == 0) {  // a fresh one per start: the last start's may linger in TIME_WAIT
      StatusOr<int> free_port = PickFreePort();
      if (!free_port.ok()) {
        std::cerr << "edl launch: " << free_port.status().ToString() << std::endl;
        return 1;
      }
      attempt.port = free_port.value();
    }
    // A fresh rendezvous directory per start, so a static trainer never reads an earlier start's
    // keys (edl/runtime/run_mode.h, static mode); removed when the start ends.
    attempt.rendezvous_dir = "/tmp/edl-launch-rdzv-XXXXXX";
    if (::mkdtemp(attempt.rendezvous_dir.data()) == nullptr) {
      std::cerr << "edl launch: "
                << PosixError("mkdtemp " + attempt.rendezvous_dir, errno).ToString() << std::endl;
      return 1;
    }
    std::cerr << "edl launch: " << opts.num_trainers << " trainers (job " << opts.rdzv_id
              << ", restart " << restart << " of at most " << opts.max_restarts
              << "), MASTER_ADDR=127.0.0.1 MASTER_PORT=" << attempt.port << ", logs in "
              << opts.log_dir << "/trainer-<rank>.log" << std::endl;
    const Outcome out = Supervise(opts, attempt, signals, &tees);
    std::error_code ec;
    std::filesystem::remove_all(attempt.rendezvous_dir, ec);
    if (!out.failed) return out.code;
    if (restart >= opts.max_restarts) {
      if (opts.max_restarts > 0) {
        std::cerr << "edl launch: no restarts left (--max_restarts " << opts.max_restarts << ")"
                  << std::endl;
      }
      return out.code;
    }
    std::cerr << "edl launch: restarting every trainer (" << restart + 1 << " of --max_restarts "
              << opts.max_restarts << ")" << std::endl;
  }
}

// Joining a server: this process becomes `edl client` (the same binary), so signals, exit codes
// and logs are the client's own.
int JoinServer(const LaunchOptions& opts) {
  for (const std::string& note : JoinNotes(opts))
    std::cerr << "edl launch: note: " << note << std::endl;
  std::vector<std::string> args = ClientArgv(opts);
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0) {
    std::cerr << "edl launch: " << PosixError("readlink /proc/self/exe", errno).ToString()
              << std::endl;
    return 1;
  }
  self.resize(static_cast<size_t>(n));
  std::cerr << "edl launch: joining the edl server at " << opts.rdzv_endpoint << " as node "
            << opts.node_name << " with " << opts.num_trainers << " slots (restart mode)"
            << std::endl;
  std::vector<char*> argv;
  argv.push_back(self.data());
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(self.c_str(), argv.data());
  std::cerr << "edl launch: " << PosixError("exec " + self + " client", errno).ToString()
            << std::endl;
  return 1;
}

}  // namespace

int RunLaunchMain(int argc, char** argv) {
  LaunchOptions opts;
  bool help = false;
  Status s = ParseLaunchArgs(argc, argv, &opts, &help);
  if (!s.ok()) {
    std::cerr << "edl launch: " << s.ToString() << "\n\n" << kLaunchUsage << std::endl;
    return kUsageError;
  }
  if (help) return 0;
  return opts.rdzv_endpoint.empty() ? RunLocal(std::move(opts)) : JoinServer(opts);
}

}  // namespace edl::launcher
