#include "jobclient/client_main.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <iostream>
#include <sstream>

#include <glog/logging.h>
#include <boost/asio.hpp>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "edl/net/framed_socket.h"
#include "jobclient/client.h"
#include "jobclient/host_slots.h"

namespace edl::jobclient {
namespace {

constexpr char kUsage[] =
    "usage: edl client --secret_file FILE [flags] -- TRAINER_CMD ARGS...\n\n"
    "The per-node agent: connects to `edl server`, offers this node's slots, and starts/stops\n"
    "trainers (the command from this node's own flags or config, never from the network).";

Status ParseSlots(const std::string& gpus, int slots, ClientOptions* o) {
  if (!gpus.empty() && slots > 0)
    return Status::InvalidArgument("give either --gpus or --slots, not both");
  if (!gpus.empty()) {
    std::stringstream ss(gpus);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0 || v > 65535) {
        return Status::InvalidArgument("--gpus '" + gpus + "': '" + item +
                                       "' is not a GPU index (e.g. --gpus 0,1,2,3)");
      }
      o->slots.push_back(static_cast<int>(v));
    }
    o->gpu_slots = true;
    return Status::OK();
  }
  if (slots < 1 || slots > static_cast<int>(proto::kMaxSlotsPerNode)) {
    return Status::InvalidArgument("--slots must be in 1.." +
                                   std::to_string(proto::kMaxSlotsPerNode) +
                                   " (or give --gpus 0,1,..)");
  }
  for (int i = 0; i < slots; ++i) o->slots.push_back(i);
  return Status::OK();
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// `job_type = NAME = COMMAND...` and `job_flags = NAME = flag,flag,..` (docs/CLUSTER.md, "Job types
// stay on the nodes"): the job types this node runs for a cluster server, each with its settable
// flags.
Status ParseJobTypes(const std::vector<std::string>& types, const std::vector<std::string>& flags,
                     ClientOptions* o) {
  auto split = [](const std::string& item, const char* what, std::string* name, std::string* rest) {
    const size_t eq = item.find('=');
    *name = Trim(item.substr(0, eq));
    *rest = eq == std::string::npos ? "" : Trim(item.substr(eq + 1));
    if (eq == std::string::npos || !proto::IsValidName(*name) || rest->empty()) {
      return Status::InvalidArgument(
          std::string("--") + what + " '" + item + "': write NAME = " +
          (std::string(what) == "job_type" ? "COMMAND ARGS..." : "flag,flag,..") +
          " with NAME of letters, digits, '.', '_', '-'");
    }
    return Status::OK();
  };
  if (types.size() > proto::kMaxJobTypesPerNode) {
    return Status::InvalidArgument("at most " + std::to_string(proto::kMaxJobTypesPerNode) +
                                   " --job_type");
  }
  for (const std::string& item : types) {
    std::string name, command;
    EDL_RETURN_IF_ERROR(split(item, "job_type", &name, &command));
    if (o->job_types.count(name))
      return Status::InvalidArgument("--job_type " + name + " is given twice");
    auto argv = SplitCommandLine(command, "--job_type " + name);
    if (!argv.ok()) return argv.status();
    o->job_types[name].argv = std::move(argv.value());
  }
  for (const std::string& item : flags) {
    std::string name, list;
    EDL_RETURN_IF_ERROR(split(item, "job_flags", &name, &list));
    auto it = o->job_types.find(name);
    if (it == o->job_types.end()) {
      return Status::InvalidArgument("--job_flags " + name + ": no --job_type " + name +
                                     " = COMMAND... is given");
    }
    std::stringstream ss(list);
    std::string flag;
    while (std::getline(ss, flag, ',')) {
      flag = Trim(flag);
      if (!proto::IsValidFlagName(flag) || it->second.settable.size() >= proto::kMaxSettableFlags) {
        return Status::InvalidArgument("--job_flags " + name + ": '" + flag +
                                       "' is not a flag name (a-z, 0-9, "
                                       "'_', starting with a letter), or more than " +
                                       std::to_string(proto::kMaxSettableFlags) + " flags");
      }
      it->second.settable.push_back(flag);
    }
  }
  return Status::OK();
}

// `service = NAME = COMMAND...` (docs/DISTILLATION.md, "Teachers run by the clients"): the teachers
// this node runs.
Status ParseServices(const std::vector<std::string>& items, int slots, ClientOptions* o) {
  if (items.size() > proto::kMaxJobTypesPerNode) {
    return Status::InvalidArgument("at most " + std::to_string(proto::kMaxJobTypesPerNode) +
                                   " --service");
  }
  if (slots < 1 || slots > proto::kMaxTeacherSlots) {
    return Status::InvalidArgument("--teacher_slots must be in 1.." +
                                   std::to_string(proto::kMaxTeacherSlots));
  }
  o->teachers.slots = slots;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    const std::string name = Trim(item.substr(0, eq));
    if (eq == std::string::npos || !proto::IsValidName(name)) {
      return Status::InvalidArgument("--service '" + item +
                                     "': write NAME = COMMAND ARGS... with NAME of "
                                     "letters, digits, '.', '_', '-'");
    }
    if (o->teachers.commands.count(name))
      return Status::InvalidArgument("--service " + name + " is given twice");
    auto argv = SplitCommandLine(Trim(item.substr(eq + 1)), "--service " + name);
    if (!argv.ok()) return argv.status();
    EDL_RETURN_IF_ERROR(CheckServiceCommand(name, argv.value()));
    o->teachers.commands[name] = std::move(argv.value());
  }
  return Status::OK();
}

Status ParseClientFlags(int argc, char** argv, ClientOptions* o, bool* help) {
  po::options_description d("client");
  std::string server, secret_file, gpus, mode, trainer_cmd, state_dir, socket_dir;
  int slots = 0;
  double stop_grace = 10, leave_grace = 30, trainer_timeout = 20;
  std::vector<std::string> rest, job_types, job_flags, services;
  int teacher_slots = 1;
  char host[256] = "node";
  ::gethostname(host, sizeof(host) - 1);
  d.add_options()("server", po::value<std::string>(&server)->default_value("127.0.0.1:8180"),
                  "the server's HOST:PORT, or a comma-separated list of a leader and its standbys "
                  "(tried in turn)")("secret_file", po::value<std::string>(&secret_file),
                                     "cluster secret shared by every node (required)")(
      "node_name", po::value<std::string>(&o->node_name)->default_value(host),
      "this node's unique name")("gpus", po::value<std::string>(&gpus),
                                 "GPU slots, e.g. 0,1,2,3 (sets CUDA_VISIBLE_DEVICES per trainer)")(
      "slots", po::value<int>(&slots)->default_value(0), "CPU slots: run up to N trainers")(
      "mode", po::value<std::string>(&mode)->default_value("inplace"),
      "inplace (trainers link the runtime) | restart (torchrun-style)")(
      "advertise_addr", po::value<std::string>(&o->advertise_addr)->default_value("127.0.0.1"),
      "address of this node that trainers bind and advertise")(
      "socket_path", po::value<std::string>(&o->socket_path),
      "trainers' Unix socket (default <socket_dir>/edl-<node>-<pid>.sock)")(
      "socket_dir", po::value<std::string>(&socket_dir)->default_value("/tmp"),
      "directory of the trainers' Unix socket when --socket_path is not given (a Unix socket path "
      "holds at most 107 bytes)")(
      "state_dir", po::value<std::string>(&state_dir),
      "where the node's session token is kept, <state_dir>/edl-<node>.session, mode 0600, so a "
      "restarted client re-attaches as its node (default: the directory of --socket_path)")(
      "log_dir", po::value<std::string>(&o->log_dir)->default_value("./edl-logs"),
      "this process's log files (stderr keeps every line) and each trainer's, "
      "<log_dir>/<trainer_id>.log")("stop_grace_s",
                                    po::value<double>(&stop_grace)->default_value(10),
                                    "SIGTERM -> SIGKILL grace")(
      "leave_grace_s", po::value<double>(&leave_grace)->default_value(30),
      "time a leaving in-place trainer has to exit by itself")(
      "trainer_timeout_s", po::value<double>(&trainer_timeout)->default_value(20),
      "a trainer whose channel is silent this long is SIGKILLed (one that is stopped, state T, "
      "after 0.4 s: two heartbeats)")("trainer_cmd", po::value<std::string>(&trainer_cmd),
                                      "the trainer command line (or give it after --)")(
      "exit_when_done", po::bool_switch(&o->exit_when_done), "exit 0 once the job finished")(
      "spares", po::value<int>(&o->spares)->default_value(1),
      "warm spares per job (in-place mode): trainer processes that load the data and model and "
      "wait; the next "
      "trainer started here takes one instead of starting cold (0: none; they cost memory, not "
      "compute)")("job_type", po::value<std::vector<std::string>>(&job_types)->composing(),
                  "a job type this node runs for a cluster server (`edl server --cluster`): NAME = "
                  "COMMAND ARGS... (repeat per type)")(
      "job_flags", po::value<std::vector<std::string>>(&job_flags)->composing(),
      "NAME = flag,flag,..: the flags of job type NAME a submission may set (passed as "
      "--flag=value)")("checkpoint_root", po::value<std::string>(&o->checkpoint_root),
                       "a submission's checkpoint_dir flag must lie under this directory (unset: "
                       "it may not be set)")(
      "service", po::value<std::vector<std::string>>(&services)->composing(),
      "a distillation service whose teachers this node runs when the server asks (`edl ctl scale "
      "--service SERVICE N`): "
      "NAME = COMMAND ARGS... (an `edl teacher` command without --service, --name, --server, "
      "--secret_file, "
      "--advertise_host, --exit_with_parent: the client adds them; repeat per service)")(
      "teacher_slots", po::value<int>(&teacher_slots)->default_value(1),
      "teachers this node runs at once (1..64)");
  // The trainer command is everything after `--`, word for word; before it, every word is a flag
  // or a flag's value (a stray word is refused, not taken as the start of a command).
  int flags_end = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      flags_end = i;
      break;
    }
  }
  for (int i = flags_end + 1; i < argc; ++i) rest.emplace_back(argv[i]);
  ParsedFlags pf;
  EDL_RETURN_IF_ERROR(ParseFlags("client", kUsage, d, flags_end, argv, &pf));
  *help = pf.help;
  if (pf.help) return Status::OK();
  EDL_RETURN_IF_ERROR(net::ReadSecretFile(secret_file, &o->secret));
  EDL_RETURN_IF_ERROR(net::ParseHostPortList(server, "--server", &o->servers));
  o->server_host = o->servers[0].first;
  o->server_port = o->servers[0].second;
  if (!proto::IsValidName(o->node_name)) {
    return Status::InvalidArgument("--node_name '" + o->node_name +
                                   "': use letters, digits, '.', '_', '-'");
  }
  if (o->node_name.size() > proto::kMaxNodeNameBytes) {
    return Status::InvalidArgument("--node_name is " + std::to_string(o->node_name.size()) +
                                   " bytes; the limit is " +
                                   std::to_string(proto::kMaxNodeNameBytes) +
                                   " (trainer ids '<node>-s<slot>-<seq>' must fit " +
                                   std::to_string(proto::kMaxNameBytes) + " bytes)");
  }
  EDL_RETURN_IF_ERROR(ParseSlots(gpus, slots, o));
  proto::NodeMode m = proto::NodeMode::kInplace;
  if (!proto::kNodeModeNames.Parse(mode, &m)) {
    return Status::InvalidArgument("--mode must be " + proto::kNodeModeNames.List("") + ", not '" +
                                   mode + "'");
  }
  o->restart_mode = m == proto::NodeMode::kRestart;
  if (o->spares < 0 || o->spares > ClientOptions::kMaxSpares) {
    return Status::InvalidArgument("--spares must be in 0.." +
                                   std::to_string(ClientOptions::kMaxSpares));
  }
  if (!rest.empty() && !trainer_cmd.empty())
    return Status::InvalidArgument(
        "give the trainer command with --trainer_cmd or after --, not both");
  if (rest.empty()) {
    auto argv = SplitCommandLine(trainer_cmd, "--trainer_cmd");
    if (!argv.ok()) return argv.status();
    rest = std::move(argv.value());
  }
  o->trainer_argv = rest;
  EDL_RETURN_IF_ERROR(ParseJobTypes(job_types, job_flags, o));
  EDL_RETURN_IF_ERROR(ParseServices(services, teacher_slots, o));
  o->teachers.secret_file = secret_file;
  o->teachers.advertise_host = o->advertise_addr;
  o->teachers.log_dir = o->log_dir;
  if (o->trainer_argv.empty() && o->job_types.empty() && o->teachers.commands.empty()) {
    return Status::InvalidArgument(
        "no trainer command: give --trainer_cmd \"CMD ARGS\" or `-- CMD ARGS` "
        "(or, for a cluster server, --job_type NAME = COMMAND...)");
  }
  if (stop_grace < 0 || leave_grace < 0 || trainer_timeout <= 0)
    return Status::InvalidArgument("grace periods must be >= 0 and --trainer_timeout_s > 0");
  o->stop_grace_ms = static_cast<int64_t>(stop_grace * 1000);
  o->teachers.stop_grace_ms = o->stop_grace_ms;
  o->leave_grace_ms = static_cast<int64_t>(leave_grace * 1000);
  o->trainer_timeout_ms = static_cast<int64_t>(trainer_timeout * 1000);
  if (o->socket_path.empty()) {
    struct stat st;
    if (socket_dir.empty() || ::stat(socket_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        ::access(socket_dir.c_str(), W_OK | X_OK) != 0) {
      return Status::InvalidArgument("--socket_dir " + socket_dir +
                                     " is not a directory this user can write; "
                                     "create it or choose another (the scripts' EDL_SOCKET_DIR)");
    }
    o->socket_path =
        socket_dir + "/edl-" + o->node_name + "-" + std::to_string(::getpid()) + ".sock";
  }
  if (o->socket_path.size() > 107) {
    return Status::InvalidArgument(
        "the trainers' socket path " + o->socket_path + " is " +
        std::to_string(o->socket_path.size()) +
        " bytes; a Unix socket path holds at "
        "most 107: choose a shorter --socket_dir (the scripts' EDL_SOCKET_DIR) or --socket_path");
  }
  if (state_dir.empty()) {
    const size_t slash = o->socket_path.rfind('/');
    state_dir = slash == std::string::npos ? "."
                : slash == 0               ? "/"
                                           : o->socket_path.substr(0, slash);
  } else if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError("--state_dir " + state_dir, errno);
  }
  o->session_path = state_dir + "/edl-" + o->node_name + ".session";
  return UseLogDir(o->log_dir);  // last: a refused command line leaves no directory behind
}

}  // namespace

int RunClientMain(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  ClientOptions o;
  bool help = false;
  Status s = ParseClientFlags(argc, argv, &o, &help);
  if (!s.ok()) {
    std::cerr << "edl client: " << s.ToString() << "\n";
    return 2;
  }
  if (help) return 0;
  // One client per machine and server, told at once (before any connection attempt); the server
  // applies the same rule to the nodes that reach it (jobserver/node_registry.cc).
  HostSlotClaim claim;
  const std::string server = o.server_host + ":" + std::to_string(o.server_port);
  s = claim.Claim(kHostLockDir, server, o.advertise_addr, o.slots, o.node_name);
  if (!s.ok()) {
    std::cerr << "edl client: " << s.ToString() << "\n";
    return 1;
  }
  if (!claim.paths().empty()) {
    LOG(INFO) << "node " << o.node_name << " holds " << claim.paths().size() << " slot(s) of host "
              << o.advertise_addr << " for " << server << " (" << kHostLockDir
              << "/edl-slot-*.lock)";
  }
  boost::asio::io_context io;
  Client client(&io, o, launcher::NewProcessLauncher(), Clock::Real());
  s = client.Start();
  if (!s.ok()) {
    std::cerr << "edl client: " << s.ToString() << "\n";
    return 1;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (!ec) client.Shutdown(0, "signal " + std::to_string(sig));
  });
  try {
    io.run();
  } catch (const std::exception& e) {
    LOG(ERROR) << "edl client: unexpected exception: " << e.what();
    return 1;
  }
  // The client has shut down (its exit code is decided): a SIGINT/SIGTERM that arrives once
  // `signals` is gone (its destructor restores the default action), while the process exits,
  // must not turn that exit into death by signal. Blocked, it stays pending until the exit.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return client.exit_code();
}

}  // namespace edl::jobclient
