// Client: the `edl client` per-node agent. Connects out to the server (reconnecting with
// backoff), authenticates, advertises its slots, heartbeats, and starts and stops trainers through
// the launcher with the trainer command from its own configuration only (never from the network).
// It notices trainer exits at once (SIGCHLD, plus a periodic poll as a backup) and reports them,
// serves its trainers on a Unix socket (mode 0600) and relays their frames (KV, ready, progress,
// events) to the server, and kills a trainer whose channel heartbeats stop. In place, it keeps warm
// spares (docs/TRAINERS.md "Warm spares"): trainer processes that prepared and wait, one of which
// becomes the next trainer the server starts here (client_spares.cc).
//
// Thread-safety: none. Start on any thread before the io_context runs; everything after, on the
// io_context thread passed in.
#pragma once

#include <unistd.h>

#include <deque>
#include <map>
#include <set>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/base/thread_checker.h"
#include "edl/net/connection.h"
#include "edl/net/handshake.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "jobclient/gpu_utilization.h"
#include "jobclient/teacher_runner.h"
#include "launcher/launcher.h"

namespace edl::jobclient {

struct ClientOptions {
  std::string server_host = "127.0.0.1";
  int server_port = 8180;
  // Every server of --server (a leader and its standbys); empty: server_host:server_port alone.
  // The client tries them in turn (docs/CHECKPOINTS.md "Standby servers").
  std::vector<std::pair<std::string, int>> servers;
  std::string secret;                 // from --secret_file
  std::string node_name;              // unique in the cluster
  std::vector<int> slots;             // slot indices offered
  bool gpu_slots = false;             // true: slot i runs with CUDA_VISIBLE_DEVICES=i
  bool restart_mode = false;          // restart every trainer on every generation (torchrun-style)
  std::string advertise_addr = "127.0.0.1";
  std::string socket_path;            // Unix socket for trainers
  // The node's session token from the server (PROTOCOL.md "Authentication"), kept across restarts
  // so a restarted client re-attaches as its node: <state_dir>/<node>.session, mode 0600. Empty:
  // not kept (a restarted client waits until the server has lost the node).
  std::string session_path;
  std::string log_dir = "./edl-logs"; // <log_dir>/<trainer_id>.log
  int64_t stop_grace_ms = 10000;      // SIGTERM -> SIGKILL
  int64_t leave_grace_ms = 30000;     // a leaving in-place trainer's time to exit by itself
  int64_t trainer_timeout_ms = 20000; // a channel silent this long: SIGKILL, reported as failed
  std::vector<std::string> trainer_argv;  // the server's own job; empty: only cluster jobs
  // Cluster mode: the job types this node runs (`job_type = NAME = COMMAND...`), each with the
  // flags a submission may set (`job_flags = NAME = a,b,..`), and the directory a submission's
  // checkpoint_dir must lie under (empty: none may be set).
  struct JobType {
    std::vector<std::string> argv;
    std::vector<std::string> settable;
  };
  std::map<std::string, JobType> job_types;
  std::string checkpoint_root;
  // The services whose teachers this node runs (`--service NAME = COMMAND...`, `--teacher_slots`);
  // no commands: none.
  TeacherRunnerOptions teachers;
  bool exit_when_done = false;
  int64_t tick_ms = 200;
  // Warm spares kept per job (the server's own job; a cluster job only while it has trainers on
  // this node). In-place mode only; 0: none.
  int spares = 1;
  static constexpr int kMaxSpares = 64;
};

// The last non-empty line of the file at `path` (read from its last 8 KiB), cut to `max` bytes and
// with control bytes replaced, or "" when there is none: why a trainer or spare failed.
std::string LastLogLine(const std::string& path, size_t max);

class Client {
 public:
  // `io` and `clock` are not owned and must outlive the client.
  Client(boost::asio::io_context* io, ClientOptions options,
         std::unique_ptr<launcher::ProcessLauncher> launcher, Clock* clock);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Binds the trainers' socket and starts connecting. IOError naming the socket path on failure.
  Status Start();
  // Stops every trainer (TERM, grace, KILL) and stops the io_context; run() then returns.
  void Shutdown(int exit_code, const std::string& why);
  int exit_code() const { return exit_code_; }

 private:
  // One job this node runs trainers of: its command and the generations the node holds.
  struct JobRun {
    std::vector<std::string> argv;
    proto::GenerationInfo prev, latest;
    int max_world = 0;  // the largest world of its generations seen here: a spare warms up for it
  };
  struct Trainer {
    std::string id;
    std::string job;
    int slot = 0;
    std::unique_ptr<launcher::TrainerProcess> proc;
    int64_t joining_generation = 0;  // >0: a prepared joiner not yet in a committed generation
    bool member = false;             // in the newest committed generation
    bool leaving = false;
    int64_t leave_deadline_us = 0;   // leaving: SIGTERM at this time
    int64_t kill_deadline_us = 0;    // terminated: SIGKILL at this time
    std::shared_ptr<net::Connection> channel;
    bool ever_connected = false;
    int64_t last_heard_us = 0;
    int64_t generation_sent = 0;
    int64_t dropped_events = 0;      // malformed events not relayed (logged: net::LogThis)
  };
  struct StartRequest {
    std::string id;
    std::string job;
    int slot = 0;
    launcher::EnvContract env;
    int64_t joining_generation = 0;
  };

  // ---- server side
  void Connect();
  void ScheduleReconnect(const std::string& why);
  // A frame from the server (proto::ServerFrame) after the handshake; one that does not decode
  // closes the connection (the client reconnects), an error is a refusal (OnRefused).
  void OnServerMessage(const nlohmann::json& msg);
  // Frames before the welcome, through the handshake (edl/net/handshake.h).
  void OnHandshakeFrame(const nlohmann::json& msg);
  // What this client says of its node in its hello.
  proto::Hello OurHello();
  void OnWelcome(const proto::Welcome& w);
  // An error from the server: `proven` when it is the server's (sealed, or with its proof).
  void OnRefused(const Status& s, bool proven);
  void KeepSession(const std::string& token);  // from a welcome: remember and save it
  void RemoveSocket();
  void OnGeneration(const proto::GenerationUpdate& u);
  void OnPrepare(const proto::Prepare& p);
  void OnKill(const proto::Kill& k);
  void OnJobInfo(const proto::JobInfo& info);
  void OnKvReply(proto::KvReply* r);  // relayed to its trainer under the trainer's own req_id
  void SendToServer(const nlohmann::json& msg, bool queue_if_offline);
  void Heartbeat();
  // Cluster mode: the node's CPU use since the previous call (/proc/stat), as node_stats.
  void SendNodeStats();
  // teacher_start / teacher_stop from the server (client_teachers.cc); a refused order is
  // answered with a teacher_exit saying why.
  void OnTeacherOrder(const proto::TeacherOrder& o);
  // Reports teachers that ended (every tick).
  void PollTeachers();
  // The node's teachers; null when it offers no service (made at first use).
  TeacherRunner* Teachers();
  // A distilling trainer's service_watch (client_teachers.cc): asks the server once per service
  // and hands the trainer the newest member list at once when there is one.
  Status OnServiceWatch(Trainer* t, const proto::ServiceWatch& w);
  // The server's service_members: kept and relayed to every trainer watching that service.
  void OnServiceMembers(const proto::ServiceMembers& m);
  void ResendServiceWatches();  // after a welcome: the new connection watches nothing yet

  // ---- trainers
  void AcceptTrainer();
  void OnTrainerMessage(const std::shared_ptr<net::Connection>& conn, std::string* trainer_id,
                        const nlohmann::json& msg);
  void PushGeneration(Trainer* t);
  void StartTrainer(StartRequest req);
  void StartWaiting();
  bool SlotBusy(int slot) const;
  void PollTrainers();
  void ReportExit(const std::string& id, const launcher::ExitInfo& info);
  // The welcome said the server had dropped this node: every trainer it still runs is stale (the
  // others re-formed without it); stop them (TERM, grace, KILL) and say so. The node rejoins afresh.
  // With none running (a fresh client holding an earlier job's token) nothing is lost: INFO.
  void DropStaleTrainers();
  void TerminateTrainer(Trainer* t, int64_t now_us);
  void Tick();
  launcher::EnvContract EnvFor(const std::string& job, const proto::GenerationInfo& g,
                               const proto::MemberInfo& m) const;

  // ---- warm spares (client_spares.cc)
  struct Spare {
    std::string id, job, log_path;
    std::unique_ptr<launcher::TrainerProcess> proc;
    std::shared_ptr<net::Connection> channel;  // set by its spare_hello: prepared and waiting
    int64_t started_us = 0;
    bool released = false;       // terminated by this client: its end is no failure
    int64_t kill_deadline_us = 0;  // released: SIGKILL at this time
  };
  // Per job: spares that ended before they were assigned, in a row, and the back-off they cause.
  struct SpareHealth {
    int failures = 0;
    int64_t next_start_us = 0;
    bool off = false;  // the job's command cannot be a spare (it said trainer_hello)
    // One more failure in a row at `now_us`: the next spare waits 1 s, doubling to 60 s.
    void Failed(int64_t now_us);
  };
  // Starts a spare for every job short of options_.spares, unless a trainer of this node is
  // starting or joining (the spare's preparation would take their CPU) or the job backs off.
  void KeepSpares(int64_t now_us);
  void StartSpare(const std::string& job, int64_t now_us);
  // Gives `req` a prepared spare of its job, if there is one: the assignment is sent, its log file
  // renamed to the trainer's, and its process returned. Null when there is none.
  std::unique_ptr<launcher::TrainerProcess> AssignSpare(const StartRequest& req, const std::string& log_path);
  // A spare_hello (the connection's first frame): the spare is prepared. False: refused (closed).
  bool OnSpareHello(const std::shared_ptr<net::Connection>& conn, const proto::SpareHello& h);
  // A spare that said trainer_hello: its job's command cannot be a spare; spares off for the job.
  void SpareCannotWait(const std::string& spare_id);
  void PollSpares(int64_t now_us);
  // Terminates the spares of `job` ("": every job) and says why.
  void ReleaseSpares(const std::string& job, const std::string& why);
  std::map<std::string, Spare> spares_;  // by spare id; bounded by options_.spares per job
  std::map<std::string, SpareHealth> spare_health_;  // by job
  uint64_t next_spare_ = 1;

  boost::asio::io_context* const io_;  // not owned
  ThreadChecker io_thread_;            // Shutdown and the io_context's handlers
  const ClientOptions options_;
  const std::unique_ptr<launcher::ProcessLauncher> launcher_;
  std::unique_ptr<TeacherRunner> teacher_runner_;  // see Teachers()
  Clock* const clock_;  // not owned
  boost::asio::local::stream_protocol::acceptor trainer_acceptor_;
  boost::asio::signal_set sigchld_;
  boost::asio::steady_timer tick_timer_, heartbeat_timer_, reconnect_timer_;

  std::shared_ptr<net::Connection> server_;
  bool authenticated_ = false;
  std::unique_ptr<net::PeerHandshake> handshake_;  // from the challenge to the welcome
  bool ever_authenticated_ = false;
  int unproven_refusals_ = 0;  // errors before a welcome that the server could not prove
  int64_t failed_connects_ = 0;  // before the first welcome (for the hint in ScheduleReconnect)
  std::string session_;  // the node's session token (from session_path or the last welcome)
  std::string session_path_;  // options_.session_path while this client holds its lock, else ""
  int session_lock_fd_ = -1;
  bool socket_bound_ = false;  // this client created the socket file (and so removes it)
  std::string job_id_ = "edl-job";
  int heartbeat_ms_ = 1000;
  // The first reconnect delay after a lost or refused connection: short, since a standby on the
  // same state directory listens within tens of ms of the leader's exit (STATE.md).
  static constexpr int64_t kFirstReconnectMs = 50;
  int64_t backoff_ms_ = kFirstReconnectMs;                   // reconnect delay, doubling to 1 s
  std::minstd_rand jitter_{static_cast<uint32_t>(::getpid())};  // of the reconnect delays
  std::vector<std::pair<std::string, int>> servers_;  // options_.servers, or server_host:server_port
  size_t server_index_ = 0;                            // the one tried now
  std::string ServerAddr() const;                      // its "host:port"
  uint64_t cpu_busy_prev_ = 0, cpu_total_prev_ = 0;  // /proc/stat at the previous node_stats
  GpuUtilization gpu_;  // NVML when the driver is there (cluster clients only)
  std::deque<nlohmann::json> outbox_;  // exit reports and readiness while disconnected

  std::map<std::string, JobRun> runs_;  // by job id: the server's own job, and cluster jobs
  std::map<std::string, Trainer> trainers_;
  // Members of the newest generation whose process ended here: never started again (pruned to
  // that generation's members, so bounded by this node's slots).
  std::set<std::string> ended_;
  std::deque<StartRequest> waiting_;  // starts waiting for their slot to free up
  uint64_t next_req_id_ = 1;
  std::map<uint64_t, std::pair<std::string, uint64_t>> kv_routes_;  // ours -> (trainer, theirs)
  // Answers every KV request still routed to the server with Unavailable (its connection closed).
  void FailPendingKv(const Status& why);
  std::map<std::string, std::set<std::string>> service_watchers_;  // service -> trainer ids
  std::map<std::string, nlohmann::json> service_members_;         // service -> newest list
  bool done_ = false;
  bool shutting_down_ = false;
  int exit_code_ = 0;
};

}  // namespace edl::jobclient
