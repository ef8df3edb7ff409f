// `edl launch`'s command line (launch_options.h).
#include "launcher/launch_options.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "edl/base/flags.h"

namespace edl::launcher {

namespace {

constexpr int kMaxTrainers = 4096;
constexpr int kMaxNodes = 1 << 20;

// A strict decimal integer in [lo, hi].
bool ParseIntIn(const std::string& s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 10) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// HOST:PORT with a non-empty host and a port in 1..65535 ([v6]:PORT allowed).
bool ValidEndpoint(const std::string& e) {
  const size_t colon = e.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  return ParseIntIn(e.substr(colon + 1), 1, 65535, &port);
}

}  // namespace

const char kLaunchUsage[] =
    "usage: edl launch --nproc_per_node N [--nnodes MIN:MAX] [--rdzv_endpoint HOST:PORT]\n"
    "                  [--rdzv_id ID] [--max_restarts K] [--log_dir D] [--tee] -- CMD ARGS...\n"
    "\n"
    "torchrun's flags (docs/PYTORCH.md). Without --rdzv_endpoint: N local trainers\n"
    "and no server (like `torchrun --standalone`). Trainer r gets RANK=r WORLD_SIZE=N "
    "LOCAL_RANK=r\n"
    "LOCAL_WORLD_SIZE=N GROUP_RANK=0 ROLE_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=P\n"
    "TORCHELASTIC_RUN_ID=ID TORCHELASTIC_RESTART_COUNT=k TORCHELASTIC_MAX_RESTARTS=K "
    "EDL_JOB_ID=ID\n"
    "EDL_TRAINER_ID=local-r EDL_SLOT=r EDL_GENERATION=0, and logs to D/trainer-r.log. If a "
    "trainer\n"
    "fails, the others are stopped (SIGTERM, then SIGKILL after --stop_grace_s); while restarts "
    "are\n"
    "left (--max_restarts) every trainer starts again, else edl launch exits with that trainer's\n"
    "status (code, or 128+signal).\n"
    "With --rdzv_endpoint HOST:PORT this node joins the `edl server` there as an `edl client`\n"
    "(restart mode, N CPU slots, --secret_file, --node_name); the server sizes the job.";

Status ParseNodeRange(const std::string& text, int* min, int* max) {
  const size_t colon = text.find(':');
  const std::string lo = colon == std::string::npos ? text : text.substr(0, colon);
  const std::string hi = colon == std::string::npos ? text : text.substr(colon + 1);
  if (!ParseIntIn(lo, 1, kMaxNodes, min) || !ParseIntIn(hi, 1, kMaxNodes, max) || *min > *max) {
    return Status::InvalidArgument("--nnodes " + text +
                                   ": give N or MIN:MAX with 1 <= MIN <= MAX, e.g. --nnodes 1:4");
  }
  return Status::OK();
}

Status ParseLaunchArgs(int argc, char** argv, LaunchOptions* opts, bool* help) {
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }
  for (int i = split + 1; i < argc; ++i) opts->command.emplace_back(argv[i]);

  std::string nnodes = "1";
  po::options_description desc("edl launch");
  desc.add_options()("nproc_per_node,n", po::value<int>(&opts->num_trainers)->required(),
                     "trainers on this node (required)")(
      "nnodes", po::value<std::string>(&nnodes)->default_value("1"),
      "nodes: N or MIN:MAX; a local job has 1, more need --rdzv_endpoint")(
      "rdzv_endpoint", po::value<std::string>(&opts->rdzv_endpoint),
      "HOST:PORT of the `edl server` to join as a client (empty: a local job)")(
      "rdzv_id", po::value<std::string>(&opts->rdzv_id)->default_value("local"),
      "job id of a local job (EDL_JOB_ID, TORCHELASTIC_RUN_ID); a server's is its --job_id")(
      "rdzv_backend", po::value<std::string>(&opts->rdzv_backend),
      "accepted for torchrun command lines: c10d | static | edl (EDL is the rendezvous)")(
      "standalone", po::bool_switch(&opts->standalone),
      "a local job (the default without --rdzv_endpoint)")(
      "max_restarts", po::value<int>(&opts->max_restarts)->default_value(0),
      "local job: restarts of every trainer after a failure before giving up")(
      "log_dir", po::value<std::string>(&opts->log_dir),
      "trainer logs: D/trainer-<rank>.log (local; default ./edl-logs/launch-<time>), "
      "D/<trainer_id>.log (joined; default ./edl-logs)")(
      "master_port", po::value<int>(&opts->master_port)->default_value(0),
      "local job: MASTER_PORT for the trainers; 0 picks a free port (per start)")(
      "stop_grace_s", po::value<double>(&opts->stop_grace_s)->default_value(10),
      "seconds between SIGTERM and SIGKILL when stopping trainers")(
      "tee", po::bool_switch(&opts->tee),
      "local job: also print every trainer's output on stdout, each line prefixed with [rank r]")(
      "secret_file", po::value<std::string>(&opts->secret_file),
      "joining: the cluster secret (default $HOME/.edl/secret)")(
      "node_name", po::value<std::string>(&opts->node_name),
      "joining: this node's unique name (default: the host name)")(
      "advertise_addr", po::value<std::string>(&opts->advertise_addr),
      "joining: the address of this node that other nodes' trainers reach (MASTER_ADDR when "
      "rank 0 is here)");
  ParsedFlags flags;
  Status s = ParseFlags("launch", kLaunchUsage, desc, split, argv, &flags);
  if (!s.ok() && split == argc && s.message().find("config file") == std::string::npos) {
    // likely a trainer command given without `--`
    return Status::InvalidArgument(
        s.message() + "; put the trainer command after `--`: edl launch -n N -- CMD ARGS...");
  }
  EDL_RETURN_IF_ERROR(s);
  *help = flags.help;
  if (*help) return Status::OK();
  if (opts->num_trainers < 1 || opts->num_trainers > kMaxTrainers) {
    return Status::InvalidArgument("-n " + std::to_string(opts->num_trainers) +
                                   ": give between 1 and " + std::to_string(kMaxTrainers) +
                                   " trainers");
  }
  EDL_RETURN_IF_ERROR(ParseNodeRange(nnodes, &opts->min_nodes, &opts->max_nodes));
  if (!opts->rdzv_backend.empty() && opts->rdzv_backend != "c10d" &&
      opts->rdzv_backend != "static" && opts->rdzv_backend != "edl") {
    return Status::InvalidArgument("--rdzv_backend " + opts->rdzv_backend +
                                   ": the edl server is the rendezvous; give --rdzv_endpoint "
                                   "HOST:PORT of an `edl server` (or no backend: a local job)");
  }
  if (opts->max_restarts < 0) {
    return Status::InvalidArgument("--max_restarts " + std::to_string(opts->max_restarts) +
                                   ": give 0 or more restarts");
  }
  if (opts->master_port < 0 || opts->master_port > 65535) {
    return Status::InvalidArgument("--master_port " + std::to_string(opts->master_port) +
                                   ": give a TCP port in 1..65535, or 0 to pick a free one");
  }
  if (!(opts->stop_grace_s >= 0)) {
    return Status::InvalidArgument("--stop_grace_s must be >= 0 seconds");
  }
  if (opts->rdzv_endpoint.empty()) {
    if (opts->min_nodes > 1) {
      return Status::InvalidArgument("--nnodes " + nnodes +
                                     " needs --rdzv_endpoint HOST:PORT of an `edl server`: a "
                                     "local job has one node");
    }
    if (opts->rdzv_id.empty()) {
      return Status::InvalidArgument("--rdzv_id is empty: give the job a name");
    }
    for (const char* flag : {"secret_file", "node_name", "advertise_addr"}) {
      if (flags.vm.count(flag)) {
        return Status::InvalidArgument(
            std::string("--") + flag +
            " is for joining a server: give --rdzv_endpoint HOST:PORT too");
      }
    }
  } else {
    if (opts->standalone) {
      return Status::InvalidArgument(
          "--standalone and --rdzv_endpoint together: drop one (a "
          "local job, or joining that edl server)");
    }
    if (!ValidEndpoint(opts->rdzv_endpoint)) {
      return Status::InvalidArgument("--rdzv_endpoint " + opts->rdzv_endpoint +
                                     ": give HOST:PORT of an `edl server`, e.g. node0:8180");
    }
    if (opts->tee) {
      return Status::InvalidArgument(
          "--tee is for a local job: a joined node's trainers log to "
          "--log_dir/<trainer_id>.log");
    }
    if (flags.vm.count("master_port") && !flags.vm["master_port"].defaulted()) {
      return Status::InvalidArgument(
          "--master_port is for a local job: the edl server gives each "
          "generation its MASTER_PORT");
    }
    if (opts->secret_file.empty()) {
      const char* home = std::getenv("HOME");
      if (home == nullptr || home[0] == '\0') {
        return Status::InvalidArgument(
            "HOME is unset: give --secret_file FILE (the cluster "
            "secret) to join a server");
      }
      opts->secret_file = std::string(home) + "/.edl/secret";
    }
    if (opts->node_name.empty()) opts->node_name = HostName();
  }
  if (opts->command.empty()) {
    return Status::InvalidArgument(
        "no trainer command: put it after `--`, e.g. edl launch -n 2 -- python3 train.py");
  }
  return Status::OK();
}

std::vector<std::string> ClientArgv(const LaunchOptions& opts) {
  std::ostringstream grace;
  grace << opts.stop_grace_s;  // 10, 2.5: no trailing zeros
  std::vector<std::string> a = {
      "client",        "--server",        opts.rdzv_endpoint,
      "--secret_file", opts.secret_file,  "--node_name",
      opts.node_name,  "--slots",         std::to_string(opts.num_trainers),
      "--mode",        "restart",         "--stop_grace_s",
      grace.str(),     "--exit_when_done"};
  if (!opts.advertise_addr.empty()) {
    a.insert(a.end(), {"--advertise_addr", opts.advertise_addr});
  }
  if (!opts.log_dir.empty()) a.insert(a.end(), {"--log_dir", opts.log_dir});
  a.emplace_back("--");
  a.insert(a.end(), opts.command.begin(), opts.command.end());
  return a;
}

std::vector<std::string> JoinNotes(const LaunchOptions& opts) {
  std::vector<std::string> notes;
  const int n = opts.num_trainers;
  if (opts.min_nodes > 1 || opts.max_nodes > 1) {
    notes.push_back("--nnodes " + std::to_string(opts.min_nodes) + ":" +
                    std::to_string(opts.max_nodes) +
                    " is the server's to enforce: start it with "
                    "--min_trainers " +
                    std::to_string(opts.min_nodes * n) + " --max_trainers " +
                    std::to_string(opts.max_nodes * n));
  }
  if (opts.rdzv_id != "local") {
    notes.push_back("--rdzv_id " + opts.rdzv_id +
                    ": the job id (TORCHELASTIC_RUN_ID) is the "
                    "server's --job_id; one server runs one job");
  }
  if (opts.max_restarts > 0) {
    notes.push_back("--max_restarts " + std::to_string(opts.max_restarts) +
                    ": the server restarts "
                    "after every failure, backing off per --backoff_min_s/--backoff_max_s, with no "
                    "count bound (TORCHELASTIC_MAX_RESTARTS=2147483647)");
  }
  return notes;
}

}  // namespace edl::launcher
