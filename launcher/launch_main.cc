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
#include "launcher/launcher.h"

namespace edl::launcher {

namespace {

constexpr int kUsageError = 2;
constexpr int kMaxTrainers = 4096;
// How often the wait loop wakes without a signal (to pump --tee output).
constexpr std::chrono::milliseconds kTick{100};
// Bound on the wait for a SIGKILLed trainer to become reapable.
constexpr std::chrono::milliseconds kReapAfterKill{5000};

const char kUsage[] =
    "usage: edl launch -n N [--log_dir D] [--master_port P] [--stop_grace_s S] [--tee] -- CMD ARGS...\n"
    "\n"
    "Runs N local trainers with no server (static mode, like `torchrun --standalone`). Trainer r gets\n"
    "RANK=r WORLD_SIZE=N LOCAL_RANK=r LOCAL_WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P\n"
    "EDL_JOB_ID=local EDL_TRAINER_ID=local-r EDL_SLOT=r EDL_GENERATION=0, and logs to\n"
    "D/trainer-r.log. If a trainer fails, the others are stopped (SIGTERM, then SIGKILL after\n"
    "--stop_grace_s) and edl launch exits with that trainer's status (code, or 128+signal).";

struct LaunchOptions {
  int num_trainers = 0;
  std::string log_dir;
  int master_port = 0;
  double stop_grace_s = 10;
  bool tee = false;
  std::vector<std::string> command;
  std::string rendezvous_dir;  // fresh per run (EDL_RENDEZVOUS_DIR of the env contract)
};

// ---- flags

// Parses argv into *opts. Returns InvalidArgument naming the bad flag; sets *help on --help.
Status ParseLaunchArgs(int argc, char** argv, LaunchOptions* opts, bool* help) {
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }
  for (int i = split + 1; i < argc; ++i) opts->command.emplace_back(argv[i]);

  po::options_description desc("edl launch");
  desc.add_options()
      ("nproc_per_node,n", po::value<int>(&opts->num_trainers)->required(),
       "number of local trainers to run (required)")
      ("log_dir", po::value<std::string>(&opts->log_dir),
       "directory for trainer-<rank>.log (default ./edl-logs/launch-<time>)")
      ("master_port", po::value<int>(&opts->master_port)->default_value(0),
       "MASTER_PORT for the trainers; 0 picks a free port")
      ("stop_grace_s", po::value<double>(&opts->stop_grace_s)->default_value(10),
       "seconds between SIGTERM and SIGKILL when stopping trainers")
      ("tee", po::bool_switch(&opts->tee),
       "also print every trainer's output on stdout, each line prefixed with [rank r]");
  ParsedFlags flags;
  Status s = ParseFlags("launch", kUsage, desc, split, argv, &flags);
  if (!s.ok() && split == argc) {  // likely a trainer command given without `--`
    return Status::InvalidArgument(s.message() +
                                   "; put the trainer command after `--`: edl launch -n N -- CMD ARGS...");
  }
  EDL_RETURN_IF_ERROR(s);
  *help = flags.help;
  if (*help) return Status::OK();
  if (opts->num_trainers < 1 || opts->num_trainers > kMaxTrainers) {
    return Status::InvalidArgument("-n " + std::to_string(opts->num_trainers) +
                                   ": give between 1 and " + std::to_string(kMaxTrainers) +
                                   " trainers");
  }
  if (opts->master_port < 0 || opts->master_port > 65535) {
    return Status::InvalidArgument("--master_port " + std::to_string(opts->master_port) +
                                   ": give a TCP port in 1..65535, or 0 to pick a free one");
  }
  if (!(opts->stop_grace_s >= 0)) {
    return Status::InvalidArgument("--stop_grace_s must be >= 0 seconds");
  }
  if (opts->command.empty()) {
    return Status::InvalidArgument(
        "no trainer command: put it after `--`, e.g. edl launch -n 2 -- python3 train.py");
  }
  return Status::OK();
}

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
  std::unique_ptr<LogTailer> tee;
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

void PumpTee(std::vector<Trainer>* trainers, bool final) {
  for (Trainer& t : *trainers) {
    if (t.tee) t.tee->Pump(final);
  }
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
    t.exit = t.process->Stop(kReapAfterKill);  // reaps; SIGTERM to a dying group is harmless
  }
}

// Starts trainer `rank`; returns an error naming the command.
Status StartTrainer(ProcessLauncher* launcher, const LaunchOptions& opts, int rank, int port,
                    Trainer* t) {
  EnvContract c;
  c.job_id = "local";
  c.trainer_id = "local-" + std::to_string(rank);
  c.generation = 0;
  c.slot = rank;
  c.rank = c.local_rank = rank;
  c.world_size = c.local_world_size = opts.num_trainers;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.rendezvous_dir = opts.rendezvous_dir;
  TrainerSpec spec;
  spec.argv = opts.command;
  spec.env = BuildTrainerEnv(c);
  spec.log_path = opts.log_dir + "/trainer-" + std::to_string(rank) + ".log";
  t->rank = rank;
  t->log_path = spec.log_path;
  StatusOr<std::unique_ptr<TrainerProcess>> p = launcher->Start(spec);
  if (!p.ok()) return p.status().WithContext("rank " + std::to_string(rank));
  t->process = std::move(p).value();
  if (opts.tee) t->tee = std::make_unique<LogTailer>(spec.log_path, "[rank " + std::to_string(rank) + "] ");
  return Status::OK();
}

// Runs the trainers to completion. Returns the exit code.
int Supervise(const LaunchOptions& opts, int port, const SignalBlock& signals) {
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(opts.stop_grace_s * 1000));
  std::unique_ptr<ProcessLauncher> launcher = NewProcessLauncher();
  std::vector<Trainer> trainers(static_cast<size_t>(opts.num_trainers));
  for (int r = 0; r < opts.num_trainers; ++r) {
    Status s = StartTrainer(launcher.get(), opts, r, port, &trainers[r]);
    if (!s.ok()) {
      std::cerr << "edl launch: " << s.ToString() << std::endl;
      trainers.resize(static_cast<size_t>(r));
      StopAll(&trainers, grace, signals);
      return 1;
    }
  }
  while (true) {
    const int sig = signals.Wait(kTick);
    const int failed = PollAll(&trainers);
    PumpTee(&trainers, false);
    if (IsStopSignal(sig)) {
      std::cerr << "edl launch: got " << ::sigabbrev_np(sig) << "; stopping all trainers" << std::endl;
      StopAll(&trainers, grace, signals);
      PumpTee(&trainers, true);
      return 128 + sig;
    }
    if (failed >= 0) {
      const Trainer& t = trainers[failed];
      std::cerr << "edl launch: rank " << t.rank << " (pid " << t.process->pid() << ") failed: "
                << t.exit->ToString() << "; stopping the other trainers. Its log: " << t.log_path
                << std::endl;
      StopAll(&trainers, grace, signals);
      PumpTee(&trainers, true);
      return t.exit->ShellStatus() != 0 ? t.exit->ShellStatus() : 1;
    }
    if (AllDone(trainers)) {
      PumpTee(&trainers, true);
      std::cerr << "edl launch: all " << opts.num_trainers << " trainers exited 0" << std::endl;
      return 0;
    }
  }
}

}  // namespace

int RunLaunchMain(int argc, char** argv) {
  LaunchOptions opts;
  bool help = false;
  Status s = ParseLaunchArgs(argc, argv, &opts, &help);
  if (!s.ok()) {
    std::cerr << "edl launch: " << s.ToString() << "\n\n" << kUsage << std::endl;
    return kUsageError;
  }
  if (help) return 0;
  if (opts.log_dir.empty()) opts.log_dir = DefaultLogDir();
  int port = opts.master_port;
  if (port == 0) {
    StatusOr<int> free_port = PickFreePort();
    if (!free_port.ok()) {
      std::cerr << "edl launch: " << free_port.status().ToString() << std::endl;
      return 1;
    }
    port = free_port.value();
  }
  // Static mode even when run from inside a trainer under an edl client: the child would inherit
  // the variables that select elastic or restart mode (edl/runtime/run_mode.h).
  for (const char* name : {env::kClientSocket, env::kRestartMode, env::kJoining}) ::unsetenv(name);
  // A fresh rendezvous directory per run, so a static trainer never reads a previous run's keys
  // (edl/runtime/run_mode.h, static mode); removed when the run ends.
  std::string rdzv = "/tmp/edl-launch-rdzv-XXXXXX";
  if (::mkdtemp(rdzv.data()) == nullptr) {
    std::cerr << "edl launch: " << PosixError("mkdtemp " + rdzv, errno).ToString() << std::endl;
    return 1;
  }
  opts.rendezvous_dir = rdzv;
  std::cerr << "edl launch: " << opts.num_trainers << " trainers, MASTER_ADDR=127.0.0.1 MASTER_PORT="
            << port << ", logs in " << opts.log_dir << "/trainer-<rank>.log" << std::endl;
  SignalBlock signals;
  const int code = Supervise(opts, port, signals);
  std::error_code ec;
  std::filesystem::remove_all(rdzv, ec);
  return code;
}

}  // namespace edl::launcher
