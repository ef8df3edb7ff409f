// Server: the `edl server` daemon, a transport shell around the Cluster (cluster.h), the same for
// one job and for many. It accepts TCP connections, authenticates each one (edl/net/auth.h),
// decodes the peers' frames and hands them to the Cluster, carries out the Cluster's actions
// (generations pushed as deltas where the node holds the previous one, prepare/kill relayed to
// clients), keeps the state store written before anything it sends, serves the rendezvous KV,
// writes the events logs and answers `edl ctl`. It never polls clients and never blocks:
// everything runs on one io_context thread, timers included.
//
// A one-job server (`edl server`) is a Cluster whose one job is named by --job_id and sized by the
// server's flags, its scaling script or demo policy and `edl ctl scale N`; a cluster server
// (`edl server --cluster`) runs the jobs `edl ctl submit` gives it. ServerOptions::cluster says
// which (ClusterOptions::one_job); nothing else in the server depends on it.
//
// Thread-safety: none. Construct, Start and use on the io_context's thread; stop with Shutdown()
// (posted to that thread).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/base/thread_checker.h"
#include "edl/net/admission.h"
#include "edl/net/connection.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "jobserver/cluster.h"
#include "jobserver/events/events_log.h"
#include "jobserver/http/http_endpoint.h"
#include "jobserver/kv_store.h"
#include "jobserver/policy/scaling.h"
#include "jobserver/services/service_placement.h"
#include "jobserver/services/service_registry.h"
#include "jobserver/state/job_state.h"

namespace edl::jobserver {

struct ServerOptions {
  std::string bind = "0.0.0.0";
  int port = 8180;        // 0: any free port (see port_file)
  std::string port_file;  // when set, the bound port is written here once listening
  std::string secret;     // the cluster secret (from --secret_file)
  // The server's name (--job_id): its events log <events_dir>/<id>.events.jsonl, its etcd leader
  // key, and the name of a one-job server's job.
  std::string id = "edl-job";
  std::string events_dir = "./edl-events";
  // The durable state (jobserver/state/STATE.md); empty: kept in memory only (a restarted server
  // starts anew).
  std::string state_dir;
  // The same state in etcd instead ("etcd://HOST:PORT[,...]"; STATE.md "Backends"), with leader
  // election among the servers of one id: Start() waits as a standby, not listening, until this
  // server leads.
  std::string state_store;
  int64_t lease_ttl_s = 5;  // the leader's etcd lease; a standby takes over within 2x this
  // --state_dir held by another server: Start() waits, not listening, until that process ends and
  // then takes the directory over (STATE.md "Standby servers"); false: Start() fails instead.
  bool standby = false;
  // Polled while Start() waits as a standby (either backend): true ends the wait with Aborted.
  std::function<bool()> stop_requested;
  // The trainers' checkpoint store, read once at start: the one job's new generations are
  // numbered above the newest one it holds, so its generation fence accepts their saves.
  std::string checkpoint_dir;
  // The jobs and nodes: one_job set (its job_id is `id`) for a one-job server, unset for a
  // cluster server.
  ClusterOptions cluster;
  std::string scale_script;  // path; empty: none (one-job server only)
  bool demo_policy = false;  // the EDL demo's periodic policy (one-job server only)
  DemoPolicyOptions demo;
  bool exit_when_done = false;  // shut down once the one job finished
  // `edl ctl stop`: how long the server waits for the stopped trainers to leave (rank 0 saving a
  // final checkpoint) before it tells the clients to stop whatever still runs.
  int64_t stop_timeout_ms = 300'000;
  int64_t handshake_timeout_ms = 5000;
  int64_t tick_ms = 100;
  // Per-peer bounds (PROTOCOL.md "Limits").
  KvLimits kv;
  size_t max_ctl_queue_bytes = size_t{16} << 20;  // a ctl/watch peer that does not read is dropped
  size_t max_event_bytes = 4096;                  // one trainer event's payload, as JSON
  // Trainer events per client connection: bursts of event_burst, then events_per_second.
  double event_burst = 1000;
  double events_per_second = 100;
  HttpOptions http;  // --http_addr (jobserver/http/http_endpoint.h); addr "": off
};

class Server {
 public:
  // `io` and `clock` are not owned and must outlive the server.
  Server(boost::asio::io_context* io, ServerOptions options, Clock* clock);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Loads the script, opens the events log and the state, binds and listens. IOError naming the
  // address when the port is taken.
  Status Start();
  int port() const { return port_; }
  // True once the server stopped because it can no longer keep its state (a failed write, a lost
  // leader lease): `edl server` then exits 1.
  bool failed() const { return failed_; }
  // Stops accepting, closes every connection, stops the io_context. `stop_clients`: first tell
  // every client to stop its trainers and exit.
  void Shutdown(bool stop_clients);

 private:
  // tests/fuzz/server_driver.h: hands frames of attached peers to OnMessage without sockets and
  // the handshake (the structure-aware fuzz target and its test).
  friend class ServerDriver;
  // Shutdown; `farewell` (when set) is the last frame each client gets: it is written before the
  // connection closes (bounded: Connection::SendAndClose), and the loop stops once every such
  // connection has closed, at most kFarewellDrain after.
  void ShutdownWith(const nlohmann::json* farewell);
  void StopWhenDrained(std::shared_ptr<boost::asio::steady_timer> timer,
                       std::shared_ptr<std::vector<std::shared_ptr<net::Connection>>> draining,
                       std::chrono::steady_clock::time_point give_up);
  struct Peer;
  void Accept();
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void OnMessage(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void OnClose(const std::shared_ptr<Peer>& peer, const Status& why);
  void OnHello(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  // Registers the node of an authenticated client hello with the Cluster (session check,
  // re-attach: its old connection is dropped) and sets *session to the node's token.
  Status AttachNode(const std::shared_ptr<Peer>& peer, const proto::Hello& hello,
                    std::string* session);
  // Whether `peer`'s node may report about `trainer_id` (Cluster::Authorized); *job gets the
  // trainer's job. A refusal is logged (rate-limited per connection) and the frame has no effect.
  bool Authorized(const std::shared_ptr<Peer>& peer, const char* what,
                  const std::string& trainer_id, std::string* job);
  // Records a trainer's event in the events log of `job` (empty: the server's own log).
  void OnEvent(const std::shared_ptr<Peer>& peer, const proto::Event& e, const std::string& job);
  // True (and the peer is closed with a logged reason) when a ctl/watch peer does not read.
  bool DropIfNotReading(const std::shared_ptr<Peer>& peer);
  // A frame of an authenticated client (proto::ClientFrame), decoded and acted on; a frame that
  // does not decode closes the connection (Reject).
  void OnClientMessage(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  void OnCtl(const std::shared_ptr<Peer>& peer, const nlohmann::json& msg);
  // A ctl command about jobs (submit, jobs, cancel, scale): the reply's status.
  Status OnJobCtl(const std::shared_ptr<Peer>& peer, const proto::CtlRequest& r);
  void OnKv(const std::shared_ptr<Peer>& peer, const proto::KvRequest& r);
  void Reject(const std::shared_ptr<Peer>& peer, const Status& why);
  // Logs about peers that have not authenticated, rate-limited (anybody can cause them).
  void LogUnauthenticated(const std::string& line);
  void Tick();
  // `edl ctl stop` of a running one job: commits the stop generation (JobMembership::Stop) and
  // waits for its trainers to leave. False when no generation runs (the server then stops at once).
  bool BeginStop(const std::string& by);
  // Once every stopped trainer has left (or --stop_timeout_s passed): tells the clients to exit
  // and shuts down.
  void MaybeEndStop();
  void ApplyScaleEvents(const std::vector<ScaleEvent>& events, const std::string& reason);
  void Dispatch();
  // Opens --state_dir / --state_store and resumes what it holds, or starts anew (STATE.md).
  Status OpenState();
  // Opens --state_dir; with --standby, first waits while another process holds it.
  Status OpenStateDir(bool* created);
  // The services an earlier server kept (server_services.cc).
  void RestoreServices(const ServicesState& s);
  // Writes the Cluster's and the scaling sources' state (synced) before anything derived from it
  // is sent. False when it cannot: the server then stops (a restarted one resumes from the last
  // state written) rather than push generations it has not kept.
  bool Persist();
  // Sends the commit of `job` to the nodes of its old and new members and those that hold the
  // job; the delta and the full list are encoded at most once each, every node sharing the bytes.
  void PushGeneration(const std::string& job, const Action& a);
  // After the welcome: every job the node may run with its newest generation in full (a finished
  // one job: `done`).
  void SendJobsTo(const std::shared_ptr<Peer>& peer);
  // Sends job_info for `job` to `peer` unless it has it already, or `job` is the one job (the
  // client runs its own trainer command for the job its welcome names).
  void TellJob(const std::shared_ptr<Peer>& peer, const std::string& job);
  void SendKill(const Action& a);  // a kKill action, to its node
  void SendToNode(const std::string& node, const nlohmann::json& msg);
  // The events log of `job` (the server's own log for its own id or an empty job); null when it
  // cannot be opened (logged).
  EventsLog* LogOf(const std::string& job);
  // Appends record `e` (an events.h struct) to LogOf(job) and streams it to watchers.
  template <typename E>
  void Record(const std::string& job, const E& e) {
    static_assert(std::is_enum_v<decltype(E::kType)>,
                  "an events-log record is built from its events.h struct");
    AppendRecord(job, e.ToJson());
  }
  // The same for a record already built (a Cluster action's, a trainer event's).
  void AppendRecord(const std::string& job, nlohmann::json record);
  bool HasWatchers() const;  // O(peers); cheap next to the status body it saves building
  void NotifyWatchers(const nlohmann::json& body);
  // At most once a second while trainers report: a "progress" record per running job (rank 0's
  // loss, the sum of images/s, step, epoch, world size) in its events log, for plots of the run.
  void RecordProgress();
  nlohmann::json StatusBody() const;
  // Sends the placer's teacher starts and stops to the nodes (service_placement.h).
  void PlaceTeachers();
  // A client's teacher_exit: the placer replaces the teacher.
  void OnTeacherExit(const std::shared_ptr<Peer>& peer, const proto::TeacherOrder& exit);
  // services_.Summary() with each service's desired count and placed teachers.
  nlohmann::json ServicesSummary() const;
  int64_t heartbeat_timeout_ms() const { return options_.cluster.heartbeat_timeout_us / 1000; }

  boost::asio::io_context* const io_;  // not owned
  ThreadChecker io_thread_;            // Start, Shutdown and the io_context's handlers
  const ServerOptions options_;
  Clock* const clock_;  // not owned
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer tick_timer_;
  int port_ = 0;
  bool shutting_down_ = false;
  bool failed_ = false;

  Cluster cluster_;
  ServiceRegistry services_;  // teachers and the students watching them
  ServicePlacer placer_;      // teachers the clients run for `edl ctl scale --service SERVICE N`
  KvStore kv_;
  EventsLog events_;  // the server's own log (a one-job server's: its job's)
  std::map<std::string, std::unique_ptr<EventsLog>> job_events_;  // other live jobs' logs
  std::optional<ScalingScript> script_;
  std::optional<DemoPolicy> demo_;
  int64_t first_generation_us_ = -1;  // script/policy time zero
  // Script/policy time does not run while a grow is being prepared (see Tick), so a timed event
  // never aborts joiners that are still loading; these track the time spent paused.
  int64_t paused_us_ = 0;
  int64_t last_tick_us_ = -1;
  std::unique_ptr<StateStore> state_;  // null without --state_dir / --state_store
  std::unique_ptr<ClusterStateWriter> state_writer_;
  int64_t last_persist_us_ = 0;
  // A stop in progress (BeginStop): the trainers not yet reported gone, by id -> node; the
  // deadline (-1: not stopping).
  std::map<std::string, std::string> stop_waiting_;
  int64_t stop_deadline_us_ = -1;
  std::vector<std::shared_ptr<Peer>> stop_callers_;  // ctl peers told how the stop ended

  std::map<std::string, std::shared_ptr<Peer>> nodes_;  // connected clients by node name
  std::map<Peer*, std::shared_ptr<Peer>> peers_;        // every open connection
  net::AdmissionControl admission_;                     // bounds pre-auth connections
  net::LogLimiter unauth_log_{20, std::chrono::seconds(10)};
  uint64_t next_peer_id_ = 1;  // Peer::id, the KV's waiter owner
  bool status_dirty_ = false;
  int64_t last_watch_push_us_ = 0;

  ServerMetrics metrics_{clock_};       // fed by the server, served by http_
  std::unique_ptr<HttpEndpoint> http_;  // null without --http_addr
};

}  // namespace edl::jobserver
