// Client: the `edl client` per-node agent's shell. Connects out to the server (reconnecting with
// backoff), authenticates, advertises its slots, heartbeats, serves its trainers on a Unix socket
// (mode 0600), starts and stops processes through the launcher with the trainer command from its
// own configuration only (never from the network), notices their exits at once (SIGCHLD, plus a
// periodic poll as a backup), keeps the node's session token, reports node statistics and runs the
// node's teachers. Every decision about trainers, warm spares, KV routes, service watchers and
// the outbox is the NodeAgent's (node_agent.h): the client turns what happens on its sockets, its
// processes and its timers into the agent's inputs and carries out the actions it returns.
//
// Thread-safety: none. Start on any thread before the io_context runs; everything after, on the
// io_context thread passed in.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
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
#include "jobclient/node_agent.h"
#include "jobclient/node_stats.h"
#include "jobclient/session_file.h"
#include "jobclient/teacher_runner.h"
#include "jobclient/trainer_socket.h"
#include "launcher/launcher.h"

namespace edl::jobclient {

struct ClientOptions {
  std::string server_host = "127.0.0.1";
  int server_port = 8180;
  // Every server of --server (a leader and its standbys); empty: server_host:server_port alone.
  // The client tries them in turn (docs/CHECKPOINTS.md "Standby servers").
  std::vector<std::pair<std::string, int>> servers;
  std::string secret;         // from --secret_file
  std::string node_name;      // unique in the cluster
  std::vector<int> slots;     // slot indices offered
  bool gpu_slots = false;     // true: slot i runs with CUDA_VISIBLE_DEVICES=i
  bool restart_mode = false;  // restart every trainer on every generation (torchrun-style)
  std::string advertise_addr = "127.0.0.1";
  std::string socket_path;  // Unix socket for trainers
  // The node's session token from the server (PROTOCOL.md "Authentication"), kept across restarts
  // so a restarted client re-attaches as its node: <state_dir>/<node>.session, mode 0600. Empty:
  // not kept (a restarted client waits until the server has lost the node).
  std::string session_path;
  std::string log_dir = "./edl-logs";     // <log_dir>/<trainer_id>.log
  int64_t stop_grace_ms = 10000;          // SIGTERM -> SIGKILL
  int64_t leave_grace_ms = 30000;         // a leaving in-place trainer's time to exit by itself
  int64_t trainer_timeout_ms = 20000;     // a channel silent this long: SIGKILL, reported as failed
  std::vector<std::string> trainer_argv;  // the server's own job; empty: only cluster jobs
  // Cluster mode: the job types this node runs (`job_type = NAME = COMMAND...`), each with the
  // flags a submission may set (`job_flags = NAME = a,b,..`), and the directory a submission's
  // checkpoint_dir must lie under (empty: none may be set).
  using JobType = NodeAgentOptions::JobType;
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
  int exit_code() const { return exit_code_.value_or(0); }

 private:
  // Which server to try next and when: the servers in turn (a leader and its standbys), a delay
  // that doubles once per round over all of them (with jitter), and what the client learnt from
  // its attempts so far.
  class Dialer {
   public:
    explicit Dialer(std::vector<std::pair<std::string, int>> servers);
    const std::pair<std::string, int>& server() const { return servers_[index_]; }
    std::string addr() const;  // the server tried now, as "host:port"
    size_t size() const { return servers_.size(); }
    // The connection was lost or refused: moves on to the next server; the delay before trying
    // it (ms), and a hint on what to check while no server ever answered (else "").
    int64_t Next(std::string* hint);
    void Welcomed();  // a welcome: the delay starts over, refusals are forgotten
    bool ever_welcomed() const { return ever_welcomed_; }
    int Refused() { return ++unproven_refusals_; }  // an unproven refusal; how many in a row

   private:
    const std::vector<std::pair<std::string, int>> servers_;
    size_t index_ = 0;
    int64_t backoff_ms_;
    std::minstd_rand jitter_;
    int64_t failed_connects_ = 0;  // before the first welcome (for the hint)
    bool ever_welcomed_ = false;
    int unproven_refusals_ = 0;  // errors before a welcome that the server could not prove
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
  void SendIfConnected(const nlohmann::json& msg);
  void Heartbeat();
  // Cluster mode: the node's CPU and GPU use since the previous call, as node_stats.
  void SendNodeStats();

  // ---- teachers (client_teachers.cc)
  // teacher_start / teacher_stop from the server; a refused order is answered with a teacher_exit
  // saying why.
  void OnTeacherOrder(const proto::TeacherOrder& o);
  // Reports teachers that ended (every tick).
  void PollTeachers();
  // The node's teachers; null when it offers no service (made at first use).
  TeacherRunner* Teachers();

  // ---- the agent's actions and the processes
  // Carries out the agent's pending actions, in order; what they cause (a start that failed, a
  // channel closed) goes back to the agent and its actions are carried out first.
  void RunAgent();
  void Execute(const AgentAction& a);
  void StartProcess(const AgentAction& a);
  void HandOverSpare(const AgentAction& a);
  // Polls every process and hands the agent those that ended.
  void PollProcesses();
  void Tick();

  boost::asio::io_context* const io_;  // not owned
  ThreadChecker io_thread_;            // Shutdown and the io_context's handlers
  const ClientOptions options_;
  const std::unique_ptr<launcher::ProcessLauncher> launcher_;
  Clock* const clock_;  // not owned
  NodeAgent agent_;
  std::unique_ptr<TeacherRunner> teacher_runner_;  // see Teachers()
  TrainerSocket trainer_socket_;
  boost::asio::signal_set sigchld_;
  boost::asio::steady_timer tick_timer_, heartbeat_timer_, reconnect_timer_;
  Dialer dialer_;
  SessionFile session_;
  NodeStatsSampler stats_;  // cluster clients only
  // The server connection, from its connect until it closes; welcomed while agent_.connected().
  std::shared_ptr<net::Connection> server_;
  std::unique_ptr<net::PeerHandshake> handshake_;  // from the challenge to the welcome
  int heartbeat_ms_ = 1000;                        // the welcome's
  // Trainer and spare processes by id, from their start until their exit was seen.
  std::map<std::string, std::unique_ptr<launcher::TrainerProcess>> procs_;
  std::optional<int> exit_code_;  // set once shutting down
};

}  // namespace edl::jobclient
