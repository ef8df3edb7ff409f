// Server: the `edl server` daemon. Accepts TCP connections, authenticates each one (edl/net/auth.h),
// registers clients' nodes with the Scheduler, pushes generations (deltas where the node holds the
// previous one), relays prepare/kill to clients, serves the rendezvous KV, keeps per-trainer
// progress, writes the events log and answers `edl ctl`. It never polls clients and never blocks:
// everything runs on one io_context thread, timers included.
//
// Thread-safety: none. Construct, Start and use on the io_context's thread; stop with Shutdown()
// (posted to that thread).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/net/admission.h"
#include "edl/net/connection.h"
#include "jobserver/cluster.h"
#include "jobserver/events_log.h"
#include "jobserver/http_endpoint.h"  // #30: metrics and dashboard
#include "jobserver/job_state.h"
#include "jobserver/kv_store.h"
#include "jobserver/scaling.h"
#include "jobserver/scheduler.h"
#include "jobserver/service_placement.h"
#include "jobserver/service_registry.h"

namespace edl::jobserver {

struct ServerOptions {
  std::string bind = "0.0.0.0";
  int port = 8180;                 // 0: any free port (see port_file)
  std::string port_file;           // when set, the bound port is written here once listening
  std::string secret;              // the cluster secret (from --secret_file)
  std::string events_dir = "./edl-events";
  // The job's durable state (jobserver/STATE.md); empty: kept in memory only (a restarted server
  // starts a new job).
  std::string state_dir;
  // The same state in etcd instead ("etcd://HOST:PORT[,...]"; STATE.md "Backends"), with leader
  // election among the servers of the job: Start() waits as a standby, not listening, until this
  // server leads.
  std::string state_store;
  int64_t lease_ttl_s = 5;         // the leader's etcd lease; a standby takes over within 2x this
  // The trainers' checkpoint store, read once at start: new generations are numbered above the
  // newest one it holds, so its generation fence accepts their saves. Empty: not read.
  std::string checkpoint_dir;
  SchedulerOptions scheduler;
  std::string scale_script;        // path; empty: none
  bool demo_policy = false;        // the EDL demo's periodic policy
  DemoPolicyOptions demo;
  bool exit_when_done = false;     // shut down once the job finished
  // `edl ctl stop`: how long the server waits for the stopped trainers to leave (rank 0 saving a
  // final checkpoint) before it tells the clients to stop whatever still runs.
  int64_t stop_timeout_ms = 300'000;
  // Cluster mode (`--cluster`; README, "Many jobs on one cluster"): no job of the server's own;
  // jobs are submitted with `edl ctl submit` and share the nodes under the cluster policy.
  bool cluster = false;
  ClusterOptions cluster_options;
  int64_t handshake_timeout_ms = 5000;
  int64_t tick_ms = 100;
  // Per-peer bounds (PROTOCOL.md "Limits").
  KvLimits kv;
  size_t max_ctl_queue_bytes = size_t{16} << 20;  // a ctl/watch peer that does not read is dropped
  size_t max_event_bytes = 4096;                  // one trainer event's payload, as JSON
  // Trainer events per client connection: bursts of event_burst, then events_per_second.
  double event_burst = 1000;
  double events_per_second = 100;
  HttpOptions http;  // #30: --http_addr (jobserver/http_endpoint.h); addr "": off
};

class Server {
 public:
  // `io` and `clock` are not owned and must outlive the server.
  Server(boost::asio::io_context* io, ServerOptions options, Clock* clock);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Loads the script, opens the events log, binds and listens. IOError naming the address when
  // the port is taken.
  Status Start();
  int port() const { return port_; }
  // True once the server stopped because it can no longer keep its state (a failed write, a lost
  // leader lease): `edl server` then exits 1.
  bool failed() const { return failed_; }
  // Stops accepting, closes every connection, stops the io_context. `stop_clients`: first tell
  // every client to stop its trainers and exit.
  void Shutdown(bool stop_clients);

 private:
  struct Peer;
  void Accept();
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void OnMessage(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void OnClose(const std::shared_ptr<Peer>& peer, const Status& why);
  void OnHello(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  // Registers the node of an authenticated client hello (session check, re-attach) and sets
  // *session to the node's token for the welcome.
  Status AttachNode(const std::shared_ptr<Peer>& peer, const proto::Hello& hello, std::string* session);
  // Whether `peer`'s node may report about `trainer_id`: the scheduler placed it there (in cluster
  // mode: a live job, whose name *job gets; a leaving trainer's reports are dropped). A refusal is
  // logged (rate-limited per connection) and the frame has no effect.
  bool Authorized(const std::shared_ptr<Peer>& peer, const std::string& what,
                  const std::string& trainer_id, std::string* job);
  // Records a trainer's event in the events log of `job` (empty: the server's own job).
  void OnEvent(const std::shared_ptr<Peer>& peer, const proto::Event& e, const std::string& job);
  // True (and the peer is closed with a logged reason) when a ctl/watch peer does not read.
  bool DropIfNotReading(const std::shared_ptr<Peer>& peer);
  void OnClientMessage(const std::shared_ptr<Peer>& peer, const std::string& type,
                       const nlohmann::json& msg);
  // Keeps a node's measured utilisation (one entry per connected node).
  void OnNodeStats(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void OnCtl(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void OnKv(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void Reject(const std::shared_ptr<Peer>& peer, const Status& why);
  // Logs about peers that have not authenticated, rate-limited (anybody can cause them).
  void LogUnauthenticated(const std::string& line);
  void Tick();
  // `edl ctl stop` of a running job: commits the stop generation (Scheduler::Stop) and waits for
  // its trainers to leave. False when no generation runs (the server then stops at once).
  bool BeginStop(const std::string& by);
  // Once every stopped trainer has left (or --stop_timeout_s passed): tells the clients to exit
  // and shuts down.
  void MaybeEndStop();
  void ApplyScaleEvents(const std::vector<ScaleEvent>& events, const std::string& reason);
  void Dispatch();
  // Opens --state_dir and resumes the job saved there, or starts a new one (STATE.md).
  Status OpenState();
  // The services an earlier server kept (server_services.cc).
  void RestoreServices(const ServicesState& s);
  // Writes the scheduler's and the scaling sources' state (synced) before anything derived from it
  // is sent. False when it cannot: the server then stops (a restarted one resumes from the last
  // state written) rather than push generations it has not kept.
  bool Persist();
  void PushGeneration(const Action& a);
  void SendKill(const Action& a);  // a kKill action, to its node
  void SendToNode(const std::string& node, const nlohmann::json& msg);
  void Record(nlohmann::json event);
  bool HasWatchers() const;  // O(peers); cheap next to the status body it saves building
  void NotifyWatchers(const nlohmann::json& body);
  // At most once a second while trainers report: a "progress" record (rank 0's loss, the sum of
  // images/s, step, epoch, world size) in the events log, for plots of the run.
  void RecordProgress(const nlohmann::json& status);
  nlohmann::json StatusBody() const;
  // Sends the placer's teacher starts and stops to the nodes (service_placement.h).
  void PlaceTeachers();
  // A client's teacher_exit: the placer replaces the teacher.
  void OnTeacherExit(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  // services_.Summary() with each service's desired count and placed teachers.
  nlohmann::json ServicesSummary() const;
  // Progress of generation `g` from its members' reports: how many report, the highest step and
  // epoch, rank 0's loss and accuracy, the sum of images/s.
  static nlohmann::json ProgressSummary(const proto::GenerationInfo& g,
                                        const std::map<std::string, proto::ProgressReport>& reports);

  // ---- cluster mode (server_cluster.cc)
  Status AttachClusterNode(const std::shared_ptr<Peer>& peer, const proto::Hello& hello,
                           std::string* session);
  // After the welcome: every live job the node may run, with its newest generation in full.
  void SendJobsTo(const std::shared_ptr<Peer>& peer);
  // Sends job_info for `job` to `peer` unless it has it already.
  void TellJob(const std::shared_ptr<Peer>& peer, const std::string& job);
  void DispatchCluster();
  void PushJobGeneration(const std::string& job, const Action& a);
  void RecordJob(const std::string& job, nlohmann::json event);
  // submit, jobs, cancel, scale: the reply's status.
  Status OnClusterCtl(const std::shared_ptr<Peer>& peer, const proto::CtlRequest& r);
  nlohmann::json ClusterStatusBody() const;
  // RecordProgress for each running job, in its own events log (the timeline picture reads it).
  void RecordJobsProgress();
  // OpenState / Persist of a cluster server: every submitted job and the nodes (STATE.md, "A
  // cluster server").
  Status OpenClusterState();
  Status SaveClusterState();

  boost::asio::io_context* const io_;  // not owned
  const ServerOptions options_;
  Clock* const clock_;  // not owned
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer tick_timer_;
  int port_ = 0;
  bool shutting_down_ = false;
  bool failed_ = false;

  Scheduler scheduler_;
  ServiceRegistry services_;  // teachers and the students watching them
  ServicePlacer placer_;      // teachers the clients run for `edl ctl scale SERVICE N`
  KvStore kv_;
  EventsLog events_;
  std::optional<ScalingScript> script_;
  std::optional<DemoPolicy> demo_;
  int64_t first_generation_us_ = -1;  // script/policy time zero
  // Script/policy time does not run while a grow is being prepared (see Tick), so a timed event
  // never aborts joiners that are still loading; these track the time spent paused.
  int64_t paused_us_ = 0;
  int64_t last_tick_us_ = -1;
  std::unique_ptr<StateStore> state_;  // null without --state_dir / --state_store
  int64_t last_persist_us_ = 0;
  // A stop in progress (BeginStop): the trainers not yet reported gone, by id -> node; the
  // deadline (-1: not stopping).
  std::map<std::string, std::string> stop_waiting_;
  int64_t stop_deadline_us_ = -1;

  std::map<std::string, std::shared_ptr<Peer>> nodes_;  // connected clients by node name
  std::map<Peer*, std::shared_ptr<Peer>> peers_;        // every open connection
  net::AdmissionControl admission_;                     // bounds pre-auth connections
  net::LogLimiter unauth_log_{20, std::chrono::seconds(10)};
  std::map<std::string, proto::ProgressReport> progress_;  // live trainers only, by id
  uint64_t next_peer_id_ = 1;  // Peer::id, the KV's waiter owner
  bool status_dirty_ = false;
  int64_t last_watch_push_us_ = 0;

  // Cluster mode only.
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, std::string> cluster_sessions_;  // node -> its session token
  std::unique_ptr<ClusterStateWriter> cluster_state_;    // null without --state_dir
  std::map<std::string, std::unique_ptr<EventsLog>> job_events_;  // live jobs' events logs
  std::map<std::string, proto::NodeStats> node_stats_;  // connected nodes' latest report
  // Live trainers' progress, by job then trainer id.
  std::map<std::string, std::map<std::string, proto::ProgressReport>> job_progress_;

  ServerMetrics metrics_{clock_};        // #30: fed below, served by http_
  std::unique_ptr<HttpEndpoint> http_;  // #30: null without --http_addr
};

}  // namespace edl::jobserver
