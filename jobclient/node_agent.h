// NodeAgent: every decision of a node's `edl client`, with no sockets, no Asio, no processes, no
// files and no clock of its own (a Clock is injected), so each rule can be unit-tested with a
// ManualClock. The Client (client.h) is its shell: it owns the server connection (handshake,
// reconnect), the trainers' Unix socket, the launcher and the processes, and turns what happens
// there into inputs; after each input it takes the agent's actions (TakeActions) and carries them
// out, in order.
//
// The agent owns: the runs (per job: its command and the generations this node holds), the
// trainers (slot, membership, leave and stop deadlines, channel, liveness), the starts waiting for
// their slot, the members that ended (never started again), the warm spares and their back-off
// (docs/TRAINERS.md "Warm spares", node_agent_spares.cc), the KV routes (a trainer's request id
// rewritten into one of the node's, the reply sent back under the trainer's own), the services the
// trainers watch and the outbox: frames that must reach the server (exits, readiness, events) are
// queued while it is away and sent once on the next welcome.
//
// Inputs: the server connection came up (the welcome) or went down; a server frame (decoded by the
// shell); a frame or the close of a trainer channel, named by the shell's ChannelId; a process
// started, could not start, exited, or was found stopped (state T); Tick; Shutdown. Outputs:
// AgentActions.
//
// Invariants:
//  - a trainer or spare in the agent has a process in the shell, from its start action until its
//    exit is reported (OnProcessesExited) or its start failed (OnProcessStartFailed); a handed
//    over spare's process is the trainer's from then on.
//  - a slot holds at most one trainer; a start for a busy slot waits (FIFO) until it frees.
//  - a channel is bound to at most one trainer or spare, by its first frame (trainer_hello or
//    spare_hello); a channel the agent closes is detached from its trainer at once.
//  - every KV route names a request sent on the current server connection; a disconnect answers
//    them all (Unavailable) and forgets them.
//  - the outbox is empty while connected and holds at most max_outbox frames.
//
// Thread-safety: none; the Client calls it from its io_context thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "launcher/launcher.h"

namespace edl::jobclient {

// One connection on the trainers' socket, numbered by the shell; never reused. 0: none.
using ChannelId = uint64_t;

struct NodeAgentOptions {
  // A job type this node runs (cluster mode): its command and the flags a submission may set.
  struct JobType {
    std::vector<std::string> argv;
    std::vector<std::string> settable;
  };
  std::string node_name;               // this node's name, as the server's generations name it
  std::vector<int> slots;              // the slots offered; a prepare naming another is ignored
  bool gpu_slots = false;              // true: slot i runs with CUDA_VISIBLE_DEVICES=i
  bool restart_mode = false;           // restart every trainer on every generation (torchrun-style)
  std::string socket_path;             // the trainers' socket, given to them as EDL_CLIENT_SOCKET
  std::string log_dir = "./edl-logs";  // <log_dir>/<trainer_id>.log
  int64_t stop_grace_ms = 10000;       // SIGTERM -> SIGKILL
  int64_t leave_grace_ms = 30000;      // a leaving in-place trainer's time to exit by itself
  int64_t trainer_timeout_ms = 20000;  // a channel silent this long: SIGKILL, reported as failed
  // A trainer silent this long (default: 2 trainer heartbeats, net::kTrainerHeartbeat) is probed
  // for being stopped (kProbeStopped); a stopped one is killed without waiting out the timeout.
  int64_t stopped_silence_ms = 400;
  std::vector<std::string> trainer_argv;  // the welcome's job's command; empty: only cluster jobs
  std::map<std::string, JobType> job_types;  // cluster mode: by type name; none: no job_info taken
  std::string checkpoint_root;  // a job_info's checkpoint_dir must lie under it; "": none may
  bool exit_when_done = false;  // after Done, shut down once no trainer runs
  // Warm spares kept per job (the welcome's job with trainer_argv set; a cluster job only while it
  // has trainers on this node). In-place mode only; 0: none.
  int spares = 1;
  size_t max_outbox = 10000;  // frames kept while disconnected; more are dropped, counted
};

// One thing the shell does for the agent. Which fields are set depends on `kind`.
struct AgentAction {
  enum class Kind {
    kStartTrainer,  // id, spec: start a trainer process; then OnProcessStarted / StartFailed
    kStartSpare,    // id, spec: start a spare process; the same answers
    // id (the spare) -> to_id (the trainer): send `frame` (its spare_assign) on the spare's
    // `channel` and close it, rename its log `from_log` to `to_log` (the open file is the same),
    // and hold its process as the trainer's from now on (none: OnProcessStartFailed(to_id)).
    kHandOverSpare,
    kTerminate,            // id: SIGTERM to the process group
    kKill,                 // id: SIGKILL to the process group
    kProbeStopped,         // id: if its process is stopped (state T), call OnProcessStopped(id)
    kSendServer,           // frame: to the server (only emitted while connected)
    kCloseServer,          // status: close the server connection (the shell reconnects)
    kSendChannel,          // channel, frame
    kSendAndCloseChannel,  // channel, frame, status: send, then close once written
    kCloseChannel,         // channel, status
    kSetChannelIdle,       // channel, idle_ms: the channel's idle timeout (0: none)
    kShutdown,             // code, why: stop everything and exit (Client::Shutdown)
  };
  Kind kind = Kind::kSendServer;
  std::string id;
  std::string to_id;             // kHandOverSpare
  launcher::TrainerSpec spec;    // kStartTrainer, kStartSpare
  std::string from_log, to_log;  // kHandOverSpare
  ChannelId channel = 0;         // channel kinds, kHandOverSpare
  nlohmann::json frame;          // sends, kHandOverSpare
  Status status;                 // closes
  int64_t idle_ms = 0;           // kSetChannelIdle
  int code = 0;                  // kShutdown
  std::string why;               // kShutdown
};

// How a process ended, as the shell saw it.
struct ProcessExit {
  std::string id;
  launcher::ExitInfo info;
  // The last non-empty line of its log (LastLogLine), "" when none or while shutting down: quoted
  // when the trainer failed, or when a spare ended before it was assigned.
  std::string last_log_line;
};

class NodeAgent {
 public:
  // `clock` is not owned and must outlive the agent.
  NodeAgent(NodeAgentOptions options, Clock* clock);
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // ---- the server connection
  // The handshake is over: `w` is the welcome. Its job is the default job (frames without a job
  // id); every run's generations are forgotten (the server sends the newest in full next); with
  // `w.dropped` every trainer still running is stale and stopped. The outbox is sent, then a
  // service_watch for every watched service.
  void OnServerUp(const proto::Welcome& w);
  // The connection closed (`why`): KV requests still routed to the server are answered
  // Unavailable. Frames to queue go to the outbox from now on. No-op while not connected.
  void OnServerDown(const Status& why);

  // ---- frames from the server (after the welcome)
  // A committed generation: members of this node start (or wait for their slot), joiners it names
  // become members, the rest of this node's trainers of the job leave (in place: leave_grace_ms to
  // exit by themselves; restart mode: SIGTERM), and a prepared joiner it leaves out is killed. A
  // delta that does not apply closes the connection (kCloseServer).
  void OnGeneration(const proto::GenerationUpdate& u);
  void OnPrepare(const proto::Prepare& p);  // starts this node's joiners (EDL_JOINING=1)
  void OnKill(const proto::Kill& k);        // SIGKILLs the named trainers of this node
  // A cluster job's type and flags: accepted only for a type of this node's configuration, with
  // settable flags and a checkpoint_dir under checkpoint_root; a refused job is forgotten.
  void OnJobInfo(const proto::JobInfo& info);
  // Relayed to the trainer that asked, under its own request id; dropped when it is gone.
  void OnKvReply(proto::KvReply r);
  void OnServiceMembers(const proto::ServiceMembers& m);
  void OnStop();  // kShutdown(0)
  void OnDone();  // the job finished: spares are released; with exit_when_done, shut down later

  // ---- the trainers' socket
  // A frame on channel `ch`: the first is trainer_hello (a trainer this agent started) or
  // spare_hello (a spare waiting to be assigned); then a trainer's TrainerFrame alternatives, a
  // spare's heartbeats. Anything else closes the channel; a malformed event is dropped (counted,
  // logged) and the channel stays.
  void OnChannelFrame(ChannelId ch, const nlohmann::json& msg);
  void OnChannelClosed(ChannelId ch, const Status& why);

  // ---- processes
  void OnProcessStarted(const std::string& id, int pid);  // after kStartTrainer / kStartSpare
  // A start (or a hand-over) failed: a trainer's is reported to the server as exit 127 with `why`;
  // a spare's backs its job's spares off.
  void OnProcessStartFailed(const std::string& id, const Status& why);
  // Processes that ended, all found by one poll: trainers first (reported once; a member of the
  // newest generation is never started again), then spares (one not assigned backs off), then the
  // starts waiting for a freed slot. While shutting down each is only logged, and a trainer's end
  // sent (not queued) as it is.
  void OnProcessesExited(const std::vector<ProcessExit>& exits);
  void OnProcessExited(const ProcessExit& e) { OnProcessesExited({e}); }
  // The answer to kProbeStopped: trainer `id`'s process is stopped (state T) and it is silent:
  // SIGKILL (its job re-forms without it).
  void OnProcessStopped(const std::string& id);

  // `now_us`: the agent's clock, read once by the caller for this tick. Leave grace -> SIGTERM,
  // stop grace -> SIGKILL (trainers and released spares), the trainer timeout, stopped probes,
  // spares to start, and the shutdown once the job is done (exit_when_done).
  void Tick(int64_t now_us);
  // The client stops: spares are released and every trainer is sent SIGTERM; the shell then waits
  // for every process and reports each end (OnProcessesExited). Nothing is started afterwards.
  void Shutdown();

  // Takes the actions produced since the last call, in order.
  std::vector<AgentAction> TakeActions();

  // ---- state
  bool connected() const { return connected_; }
  bool has_trainers() const { return !trainers_.empty(); }
  // Fills `h->trainers` and `h->trainer_generations` (PROTOCOL.md "Authentication"): the members
  // of the newest generation this node holds, and prepared joiners, each with its generation.
  void FillHello(proto::Hello* h) const;
  const std::string& job_id() const { return job_id_; }  // the welcome's job
  size_t outbox_size() const { return outbox_.size(); }
  int64_t outbox_dropped() const { return outbox_dropped_; }  // frames lost to a full outbox

 private:
  // One job this node runs trainers of: its command and the generations the node holds.
  struct JobRun {
    std::vector<std::string> argv;
    proto::GenerationInfo prev, latest;
    int max_world = 0;  // the largest world of its generations seen here: a spare warms up for it
  };
  struct Trainer {
    std::string id, job;
    int slot = 0;
    int pid = 0;                     // once started (logs only)
    int64_t start_generation = 0;    // the generation its env names (logs only)
    int64_t joining_generation = 0;  // >0: a prepared joiner not yet in a committed generation
    bool member = false;             // in the newest committed generation
    bool leaving = false;
    int64_t leave_deadline_us = 0;  // leaving: SIGTERM at this time
    int64_t kill_deadline_us = 0;   // terminated: SIGKILL at this time
    ChannelId channel = 0;
    bool ever_connected = false;
    int64_t last_heard_us = 0;
    int64_t generation_sent = 0;
    int64_t dropped_events = 0;  // malformed events not relayed (logged: net::LogThis)
  };
  struct StartRequest {
    std::string id, job;
    int slot = 0;
    launcher::EnvContract env;
    int64_t joining_generation = 0;
  };
  struct Spare {
    std::string id, job, log_path;
    int pid = 0;
    int world = 0;          // the world it warms up for (logs only)
    ChannelId channel = 0;  // set by its spare_hello: prepared and waiting
    int64_t started_us = 0;
    bool released = false;         // terminated by this agent: its end is no failure
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

  // ---- output
  void Emit(AgentAction a) { actions_.push_back(std::move(a)); }
  void EmitProcess(AgentAction::Kind kind, const std::string& id);
  void SendToServer(const nlohmann::json& msg, bool queue_if_offline);
  void SendToChannel(ChannelId ch, const nlohmann::json& msg);
  // Closes channel `ch` and detaches it from its trainer or spare at once.
  void CloseChannel(ChannelId ch, const Status& why);
  void SendAndCloseChannel(ChannelId ch, const nlohmann::json& msg, const Status& why);
  void DetachChannel(ChannelId ch);

  // ---- trainers
  void OnTrainerHello(ChannelId ch, const nlohmann::json& msg);
  void OnTrainerFrame(ChannelId ch, Trainer* t, const nlohmann::json& msg);
  void PushGeneration(Trainer* t);
  void StartTrainer(StartRequest req);
  // Trainer `id` could not start: reported to the server as exit 127 with `why`.
  void ReportStartFailure(const std::string& id, const Status& why);
  void StartWaiting();
  bool SlotBusy(int slot) const;
  void TrainerExited(const ProcessExit& e);
  void ReportExit(const ProcessExit& e);
  void ShutdownExit(const ProcessExit& e);
  // The welcome said the server had dropped this node: every trainer it still runs is stale (the
  // others re-formed without it); stop them (TERM, grace, KILL) and say so.
  void DropStaleTrainers();
  void TerminateTrainer(Trainer* t, int64_t now_us);
  void CheckTrainerDeadlines(int64_t now_us);
  launcher::EnvContract EnvFor(const std::string& job, const proto::GenerationInfo& g,
                               const proto::MemberInfo& m) const;
  std::string LogPath(const std::string& id) const { return options_.log_dir + "/" + id + ".log"; }

  // ---- KV routes and services
  // A trainer's KV request on its channel `ch`: routed to the server under a fresh id of the
  // node's, or answered Unavailable at once while the server is away.
  void OnKvRequest(ChannelId ch, Trainer* t, proto::KvRequest r);
  // Answers every KV request still routed to the server with Unavailable (its connection closed).
  void FailPendingKv(const Status& why);
  // A distilling trainer's service_watch: asks the server once per service and hands the trainer
  // the newest member list at once when there is one.
  Status OnServiceWatch(Trainer* t, const proto::ServiceWatch& w);
  void ResendServiceWatches();  // after a welcome: the new connection watches nothing yet

  // ---- warm spares (node_agent_spares.cc)
  // Starts a spare for every job short of options_.spares, unless a trainer of this node is
  // starting or joining (the spare's preparation would take their CPU) or the job backs off.
  void KeepSpares(int64_t now_us);
  void StartSpare(const std::string& job, int64_t now_us);
  // Hands a prepared spare of `req`'s job over to it, if there is one (kHandOverSpare), whose
  // process becomes the trainer's (*pid). False when there is none.
  bool AssignSpare(const StartRequest& req, const std::string& log_path, int* pid);
  // A spare_hello (the channel's first frame): the spare is prepared. False: refused (closed).
  bool OnSpareHello(ChannelId ch, const proto::SpareHello& h);
  // A spare that said trainer_hello: its job's command cannot be a spare; spares off for the job.
  void SpareCannotWait(const std::string& spare_id);
  void SpareExited(const ProcessExit& e, int64_t now_us);
  void SpareStartFailed(const std::string& id, const Status& why, int64_t now_us);
  void CheckSpareDeadlines(int64_t now_us);
  // Terminates the spares of `job` ("": every job) and says why.
  void ReleaseSpares(const std::string& job, const std::string& why);

  const NodeAgentOptions options_;
  Clock* const clock_;  // not owned

  bool connected_ = false;
  std::string job_id_ = "edl-job";
  std::deque<nlohmann::json> outbox_;  // exit reports, readiness and events while disconnected
  int64_t outbox_dropped_ = 0;
  std::map<std::string, JobRun> runs_;  // by job id: the welcome's job, and cluster jobs
  std::map<std::string, Trainer> trainers_;
  // Members of the newest generation whose process ended here: never started again (pruned to
  // that generation's members, so bounded by this node's slots).
  std::set<std::string> ended_;
  std::deque<StartRequest> waiting_;  // starts waiting for their slot to free up
  // Channel -> the trainer or spare id its hello named ("" before one): bound once, kept until
  // the channel closes.
  std::map<ChannelId, std::string> channels_;
  uint64_t next_req_id_ = 1;
  std::map<uint64_t, std::pair<std::string, uint64_t>> kv_routes_;  // ours -> (trainer, theirs)
  std::map<std::string, std::set<std::string>> service_watchers_;   // service -> trainer ids
  std::map<std::string, nlohmann::json> service_members_;           // service -> newest list
  std::map<std::string, Spare> spares_;  // by spare id; bounded by options_.spares per job
  std::map<std::string, SpareHealth> spare_health_;  // by job
  uint64_t next_spare_ = 1;
  bool done_ = false;
  bool shutting_down_ = false;
  std::vector<AgentAction> actions_;
};

}  // namespace edl::jobclient
