#include "jobserver/server_main.h"

#include <atomic>
#include <csignal>
#include <iostream>
#include <sstream>

#include <glog/logging.h>
#include <boost/asio.hpp>

#include "edl/base/flags.h"
#include "edl/net/auth.h"
#include "jobserver/server.h"
#include "jobserver/state/etcd_client.h"

namespace edl::jobserver {
namespace {

constexpr char kServerUsage[] =
    "usage: edl server --secret_file FILE [flags]\n\n"
    "The job server: tracks nodes and trainers, computes generations, pushes them to `edl "
    "client`s,\n"
    "serves the rendezvous KV and answers `edl ctl`. Scaling comes from --scale_script, the EDL "
    "demo\n"
    "policy (--node_ips with --time_interval_to_change), `edl ctl scale N`, and trainer/node "
    "failures.";

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Status ParseServerFlags(int argc, char** argv, ServerOptions* o, bool* help) {
  po::options_description d("server");
  std::string secret_file, node_ips, job_types, http_token_file;
  bool cluster = false;
  double min_change_s = 0;
  std::string policy_kind = "fair";
  MembershipOptions job;
  int64_t max_pending = 0;
  int hb_ms = 5000, join_s = 60, stop_s = 300;
  double backoff_min_s = 1, backoff_max_s = 30;
  int64_t kv_value = 0, kv_keys = 0, kv_bytes = 0, kv_waiters_conn = 0, kv_waiters = 0,
          ctl_queue = 0;
  const KvLimits kv;
  d.add_options()("server_port", po::value<int>(&o->port)->default_value(8180),
                  "TCP port to listen on (0: any free port)")(
      "bind", po::value<std::string>(&o->bind)->default_value("0.0.0.0"), "address to listen on")(
      "port_file", po::value<std::string>(&o->port_file), "write the bound port to this file")(
      "secret_file", po::value<std::string>(&secret_file),
      "cluster secret shared by every node (required)")(
      "job_id", po::value<std::string>(&o->id)->default_value("edl-job"),
      "the job's name (with --cluster: the server's own, naming its events log and etcd leader "
      "key)")("min_trainers", po::value<int>(&job.min_trainers)->default_value(1),
              "fewest trainers to start the job with")(
      "max_trainers", po::value<int>(&job.max_trainers)->default_value(0),
      "most trainers (0: no bound)")("trainers",
                                     po::value<int>(&job.initial_trainers)->default_value(0),
                                     "initial desired size (0: every free slot)")(
      "scale_script", po::value<std::string>(&o->scale_script),
      "scaling script of timed events (see config/*.script)")(
      "node_ips", po::value<std::string>(&node_ips),
      "EDL demo policy: comma-separated node addresses")(
      "gpu_num_of_node", po::value<int>(&o->demo.gpu_num_of_node)->default_value(8),
      "EDL demo policy: GPUs per node, split among its pods, one trainer per GPU")(
      "pod_num_of_node", po::value<int>(&o->demo.pod_num_of_node)->default_value(1),
      "EDL demo policy: pods per node (gpu_num_of_node / pod_num_of_node trainers each)")(
      "time_interval_to_change",
      po::value<int>(&o->demo.time_interval_to_change_s)->default_value(900),
      "EDL demo policy: seconds between changes (the policy runs only with --node_ips; 0: off)")(
      "del_pods_one_step", po::value<int>(&o->demo.del_pods_one_step)->default_value(1),
      "EDL demo policy: pods removed per change")(
      "add_pods_one_step", po::value<int>(&o->demo.add_pods_one_step)->default_value(1),
      "EDL demo policy: pods added per change")("heartbeat_timeout_ms",
                                                po::value<int>(&hb_ms)->default_value(5000),
                                                "a node silent this long is lost")(
      "join_timeout_s", po::value<int>(&join_s)->default_value(60),
      "joiners not ready by then are dropped")(
      "stop_timeout_s", po::value<int>(&stop_s)->default_value(300),
      "`edl ctl stop`: wait this long for the trainers to leave (rank 0 saving a final checkpoint) "
      "before the clients stop them")(
      "backoff_min_s", po::value<double>(&backoff_min_s)->default_value(1, "1"),
      "grow-back delay after a failure of a trainer that had not yet taken a step (a trainer that "
      "trained and then failed is replaced at once); doubles per further failure within a "
      "minute...")("backoff_max_s", po::value<double>(&backoff_max_s)->default_value(30, "30"),
                   "...up to this (set both equal for a fixed delay, e.g. in failure benchmarks)")(
      "kv_max_value_bytes", po::value<int64_t>(&kv_value)->default_value(kv.max_value_bytes),
      "largest rendezvous KV value")(
      "kv_max_keys", po::value<int64_t>(&kv_keys)->default_value(kv.max_keys),
      "most KV keys held at once (old generations' keys are dropped)")(
      "kv_max_bytes", po::value<int64_t>(&kv_bytes)->default_value(kv.max_total_bytes),
      "most KV bytes (keys + values) held at once")(
      "kv_max_waiters_per_connection",
      po::value<int64_t>(&kv_waiters_conn)->default_value(kv.max_waiters_per_owner),
      "most pending KV waits of one client")(
      "kv_max_waiters", po::value<int64_t>(&kv_waiters)->default_value(kv.max_waiters),
      "most pending KV waits in all")(
      "ctl_max_queue_bytes", po::value<int64_t>(&ctl_queue)->default_value(o->max_ctl_queue_bytes),
      "an `edl ctl` (watch) peer with more unread bytes queued is dropped")(
      "events_dir", po::value<std::string>(&o->events_dir)->default_value("./edl-events"),
      "directory of the events log")("state_dir", po::value<std::string>(&o->state_dir),
                                     "directory of the job's durable state (RocksDB, see "
                                     "jobserver/state/STATE.md): a restarted server resumes "
                                     "the job and its running trainers from it (with --cluster: "
                                     "every submitted job; created when missing; "
                                     "empty: state in memory only)")(
      "state_store", po::value<std::string>(&o->state_store),
      "etcd://HOST:PORT[,HOST:PORT...]: keep the job's state in etcd (v3) instead of --state_dir, "
      "with "
      "leader election: several servers of one job (each with its own --server_port) run, one "
      "leads, the "
      "others wait as standbys without listening and take over when the leader's lease ends "
      "(jobserver/state/STATE.md)")(
      "standby", po::bool_switch(&o->standby),
      "--state_dir: when another server holds the directory, wait as its standby (not listening) "
      "and take "
      "over the moment that process ends, on the same --server_port (same host, or a shared "
      "filesystem "
      "whose POSIX locks work; jobserver/state/STATE.md); without it such a start fails")(
      "lease_ttl_s", po::value<int64_t>(&o->lease_ttl_s)->default_value(5),
      "--state_store: TTL of the leader's etcd lease in seconds; a standby takes over within twice "
      "this, a "
      "leader that cannot renew it within this stops")(
      "checkpoint_dir", po::value<std::string>(&o->checkpoint_dir),
      "the trainers' checkpoint store, read at start: generations are numbered above its newest, "
      "so "
      "its fence accepts the new trainers' saves (needed only with a new --state_dir and an old "
      "store)")("log_dir", po::value<std::string>(),
                "this process's log files (stderr keeps every line; default: stderr only)")(
      "exit_when_done", po::bool_switch(&o->exit_when_done), "exit 0 once every trainer finished")(
      "cluster", po::bool_switch(&cluster),
      "run many jobs on the nodes (docs/CLUSTER.md): jobs come from `edl ctl submit`, "
      "not from this server's own job flags")("job_types", po::value<std::string>(&job_types),
                                              "--cluster: comma-separated job types a submission "
                                              "may name before any node offering them has joined "
                                              "(such a job stays pending until one does)")(
      "job_checkpoint_root", po::value<std::string>(&o->cluster.checkpoint_root),
      "--cluster: a submission's checkpoint_dir flag must lie under this absolute directory "
      "(unset: it may not be set)")("max_pending_jobs",
                                    po::value<int64_t>(&max_pending)->default_value(256),
                                    "--cluster: most jobs waiting to start at once; a submission "
                                    "beyond it is refused until some start or are "
                                    "cancelled")(
      "min_change_interval_s", po::value<double>(&min_change_s)->default_value(0, "0"),
      "--cluster: the policy resizes a job at most once per this many seconds (0: no limit)")(
      "policy", po::value<std::string>(&policy_kind)->default_value("fair"),
      "--cluster: how elastic jobs share the slots: fair (weighted max-min on trainer counts) or "
      "goodput "
      "(each slot to the job whose goodput model it raises most, a job without a model by fair "
      "share; "
      "docs/SCHEDULING.md). The server does not feed its trainers' reports to the models yet: "
      "until it "
      "does, goodput sizes every job as fair does")
      // the read-only HTTP endpoint (jobserver/http/http_endpoint.h, docs/WATCHING.md)
      ("http_addr", po::value<std::string>(&o->http.addr),
       "HOST:PORT of the dashboard, /metrics (Prometheus) and /api/status, e.g. 127.0.0.1:8181 "
       "(unset: off; "
       "a non-loopback HOST needs --http_token_file)")(
          "http_token_file", po::value<std::string>(&http_token_file),
          "bearer token that HTTP requests must carry (mode 0600, like --secret_file); required "
          "when "
          "--http_addr is not a loopback address")(
          "http_port_file", po::value<std::string>(&o->http.port_file),
          "write the HTTP port to this file once listening (for --http_addr HOST:0)");
  ParsedFlags pf;
  EDL_RETURN_IF_ERROR(ParseFlags("server", kServerUsage, d, argc, argv, &pf));
  *help = pf.help;
  if (pf.help) return Status::OK();
  if (pf.vm.count("log_dir")) EDL_RETURN_IF_ERROR(UseLogDir(pf.vm["log_dir"].as<std::string>()));
  EDL_RETURN_IF_ERROR(net::ReadSecretFile(secret_file, &o->secret));
  if (!http_token_file.empty() && o->http.addr.empty()) {
    return Status::InvalidArgument("--http_token_file is for --http_addr, which is not given");
  }
  if (!http_token_file.empty()) {
    EDL_RETURN_IF_ERROR(net::ReadTokenFile(http_token_file, "--http_token_file", &o->http.token));
  }
  if (!o->http.addr.empty()) EDL_RETURN_IF_ERROR(CheckHttpOptions(o->http));
  if (o->port < 0 || o->port > 65535)
    return Status::InvalidArgument("--server_port must be in 0..65535");
  EDL_RETURN_IF_ERROR(proto::CheckName("--job_id", o->id, kMaxJobNameBytes));
  if (job.min_trainers < 1) return Status::InvalidArgument("--min_trainers must be >= 1");
  if (job.max_trainers < 0 || (job.max_trainers > 0 && job.max_trainers < job.min_trainers)) {
    return Status::InvalidArgument("--max_trainers must be 0 (no bound) or >= --min_trainers");
  }
  if (job.initial_trainers < 0) return Status::InvalidArgument("--trainers must be >= 0");
  if (hb_ms < 100) return Status::InvalidArgument("--heartbeat_timeout_ms must be >= 100");
  if (join_s < 1) return Status::InvalidArgument("--join_timeout_s must be >= 1");
  if (stop_s < 1) return Status::InvalidArgument("--stop_timeout_s must be >= 1");
  if (!(backoff_min_s >= 0 && backoff_max_s >= backoff_min_s && backoff_max_s <= 3600)) {
    return Status::InvalidArgument(
        "--backoff_min_s/--backoff_max_s: need 0 <= min <= max <= 3600 seconds");
  }
  if (kv_value < 1 || kv_value > static_cast<int64_t>(proto::kMaxValueBytes) || kv_keys < 1 ||
      kv_bytes < kv_value || kv_waiters_conn < 1 || kv_waiters < kv_waiters_conn ||
      ctl_queue < 65536) {
    return Status::InvalidArgument(
        "KV limits: need 1 <= --kv_max_value_bytes <= " + std::to_string(proto::kMaxValueBytes) +
        ", --kv_max_bytes >= --kv_max_value_bytes, --kv_max_keys >= 1, 1 <= "
        "--kv_max_waiters_per_connection <= --kv_max_waiters, --ctl_max_queue_bytes >= 65536");
  }
  if (!o->state_store.empty() && !o->state_dir.empty()) {
    return Status::InvalidArgument(
        "give either --state_dir (local RocksDB) or --state_store (etcd), not both");
  }
  if (o->standby && o->state_dir.empty()) {
    return Status::InvalidArgument(
        "--standby needs --state_dir (with --state_store every server already waits as a "
        "standby while another one leads)");
  }
  if (!o->state_store.empty()) {
    std::vector<EtcdEndpoint> endpoints;
    EDL_RETURN_IF_ERROR(ParseEtcdUrl(o->state_store, &endpoints));
  }
  if (o->lease_ttl_s < 1 || o->lease_ttl_s > 3600)
    return Status::InvalidArgument("--lease_ttl_s must be in 1..3600");
  o->kv.max_value_bytes = static_cast<size_t>(kv_value);
  o->kv.max_keys = static_cast<size_t>(kv_keys);
  o->kv.max_total_bytes = static_cast<size_t>(kv_bytes);
  o->kv.max_waiters_per_owner = static_cast<size_t>(kv_waiters_conn);
  o->kv.max_waiters = static_cast<size_t>(kv_waiters);
  o->max_ctl_queue_bytes = static_cast<size_t>(ctl_queue);
  job.backoff_min_us = static_cast<int64_t>(backoff_min_s * 1e6);
  job.backoff_max_us = static_cast<int64_t>(backoff_max_s * 1e6);
  o->cluster.heartbeat_timeout_us = int64_t{hb_ms} * 1000;
  job.join_timeout_us = int64_t{join_s} * 1'000'000;
  o->stop_timeout_ms = int64_t{stop_s} * 1000;
  o->demo.node_ips = SplitCommas(node_ips);
  if (!(min_change_s >= 0 && min_change_s <= 86400)) {
    return Status::InvalidArgument("--min_change_interval_s must be in 0..86400");
  }
  for (const std::string& t : SplitCommas(job_types)) {
    if (!proto::IsValidName(t))
      return Status::InvalidArgument("--job_types: '" + t + "' is not a name");
    o->cluster.policy.known_types.insert(t);
  }
  const std::string& root = o->cluster.checkpoint_root;
  if (!root.empty() && root[0] != '/') {
    return Status::InvalidArgument("--job_checkpoint_root '" + root + "' is not an absolute path");
  }
  o->cluster.policy.min_change_interval_us = static_cast<int64_t>(min_change_s * 1e6);
  if (!kPolicyKindNames.Parse(policy_kind, &o->cluster.policy.kind)) {
    return Status::InvalidArgument("--policy '" + policy_kind + "': give " +
                                   kPolicyKindNames.List("'"));
  }
  // A job's model comes from its trainers' reports at the sizes it runs (GoodputFeed), and a
  // fixed-local job whose gradients stay on a device never reports a noise scale: held at a
  // probe size it could wait there for ever. Jobs without a model get their whole fair share.
  o->cluster.policy.goodput.probe_trainers = 0;
  job.job_id = o->id;
  o->cluster.job_defaults = job;
  if (!cluster) o->cluster.one_job = job;
  if (max_pending < 1 || max_pending > static_cast<int64_t>(kMaxPolicyJobs)) {
    return Status::InvalidArgument("--max_pending_jobs must be in 1.." +
                                   std::to_string(kMaxPolicyJobs));
  }
  o->cluster.max_pending_jobs = static_cast<size_t>(max_pending);
  // As the original demo's job server: the policy runs on the given nodes; without --node_ips
  // (the original's 127.0.0.1 default is not taken) it is off.
  o->demo_policy = !o->demo.node_ips.empty() && o->demo.time_interval_to_change_s > 0;
  if (o->demo.time_interval_to_change_s < 0)
    return Status::InvalidArgument("--time_interval_to_change must be >= 0");
  if (cluster && (o->demo_policy || !o->scale_script.empty())) {
    return Status::InvalidArgument(
        "--cluster runs submitted jobs only: --scale_script and the demo policy size the "
        "one job of a server without --cluster");
  }
  if (o->demo_policy && !o->scale_script.empty()) {
    return Status::InvalidArgument(
        "use either --scale_script or the demo policy (--time_interval_to_change), not both");
  }
  if (o->demo.del_pods_one_step < 0 || o->demo.add_pods_one_step < 0 ||
      o->demo.pod_num_of_node < 1 || o->demo.gpu_num_of_node < 1 ||
      o->demo.gpu_num_of_node % o->demo.pod_num_of_node != 0) {
    return Status::InvalidArgument(
        "--del_pods_one_step/--add_pods_one_step must be >= 0, --pod_num_of_node >= 1 and "
        "--gpu_num_of_node a multiple of it (each pod gets gpu_num_of_node / "
        "pod_num_of_node GPUs, one trainer per GPU)");
  }
  return Status::OK();
}

// SIGTERM / SIGINT before the server runs its loop: a standby's wait polls this.
std::atomic<bool> g_stop_signal{false};
extern "C" void OnStopSignal(int) { g_stop_signal.store(true); }

}  // namespace

int RunServerMain(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  ServerOptions o;
  bool help = false;
  Status s = ParseServerFlags(argc, argv, &o, &help);
  if (!s.ok()) {
    std::cerr << "edl server: " << s.ToString() << "\n";
    return 2;
  }
  if (help) return 0;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  o.stop_requested = [] { return g_stop_signal.load(); };
  boost::asio::io_context io;
  Server server(&io, o, Clock::Real());
  s = server.Start();
  if (!s.ok() && s.IsAborted() && g_stop_signal.load()) {  // a standby that held nothing
    LOG(INFO) << "edl server: " << s.ToString() << "; signal: exiting";
    return 0;
  }
  if (!s.ok()) {
    std::cerr << "edl server: " << s.ToString() << "\n";
    return 1;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);  // replaces OnStopSignal
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    LOG(INFO) << "edl server: signal " << sig << ", shutting down (trainers keep running)";
    server.Shutdown(/*stop_clients=*/false);
  });
  if (g_stop_signal.load()) {  // it came during Start()
    LOG(INFO) << "edl server: signal during start-up, shutting down (trainers keep running)";
    server.Shutdown(/*stop_clients=*/false);
  }
  try {
    io.run();
  } catch (const std::exception& e) {
    LOG(ERROR) << "edl server: unexpected exception: " << e.what();
    return 1;
  }
  return server.failed() ? 1 : 0;
}

}  // namespace edl::jobserver
