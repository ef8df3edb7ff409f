// Control-plane messages: one struct per message type, each with EncodeTo / DecodeFrom /
// DebugString (leveldb version_edit style). DecodeFrom validates every field (presence, type,
// range, length, name characters) and returns Corruption naming the message and the field; it
// never throws. The frame layer (frame.h) carries the encoded JSON objects; PROTOCOL.md explains
// who sends what when.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/batch_policy.h"
#include "edl/base/enum_names.h"
#include "edl/base/status.h"
#include "edl/proto/names.h"
#include "edl/proto/trainer_events.h"

namespace edl::proto {

// Message "type" values.
namespace msg {
inline constexpr char kChallenge[] = "challenge";       // server -> peer, first frame
inline constexpr char kHello[] = "hello";               // peer -> server, answers the challenge
inline constexpr char kWelcome[] = "welcome";           // server -> peer (or client -> trainer)
inline constexpr char kError[] = "error";               // either way, then the sender closes
inline constexpr char kHeartbeat[] = "heartbeat";       // client -> server, trainer -> client
inline constexpr char kGeneration[] = "generation";     // a committed generation (full or delta)
inline constexpr char kPrepare[] = "prepare";           // server -> client: start these joiners
inline constexpr char kKill[] = "kill";                 // server -> client: SIGKILL these trainers
inline constexpr char kTrainerExit[] = "trainer_exit";  // client -> server
inline constexpr char kReady[] = "ready";               // trainer -> client -> server
inline constexpr char kProgress[] = "progress";         // trainer -> client -> server
inline constexpr char kEvent[] = "event";               // trainer -> client -> server (-> watch)
inline constexpr char kKv[] = "kv";                     // trainer -> client -> server
inline constexpr char kKvReply[] = "kv_reply";          // server -> client -> trainer
inline constexpr char kCtl[] = "ctl";                   // ctl -> server
inline constexpr char kCtlReply[] = "ctl_reply";        // server -> ctl
inline constexpr char kStop[] = "stop";                 // server -> client: stop trainers, exit
inline constexpr char kDone[] = "done";                 // server -> client: job finished
inline constexpr char kTrainerHello[] = "trainer_hello";  // trainer -> client, first frame
inline constexpr char kJobInfo[] = "job_info";          // server -> client: a job's type and flags
inline constexpr char kNodeStats[] = "node_stats";      // client -> server: measured utilisation
inline constexpr char kSpareHello[] = "spare_hello";    // spare trainer -> client, first frame
inline constexpr char kSpareAssign[] = "spare_assign";  // client -> spare: the identity it takes
}  // namespace msg

// ---- closed sets on the wire: each enum's names live in its one table, which the encoders write
// and the decoders accept (any other name is refused: Corruption naming the field).

// Who a hello says it is: a node's client, `edl ctl`, a teacher registering its service with the
// server, or a student (watching a service's teachers at the server, or asking a teacher).
enum class Role { kClient, kCtl, kTeacher, kStudent };
inline constexpr EnumNames<Role, 4> kRoleNames({"client", "ctl", "teacher", "student"});
// How a node's client runs trainers: in place (they link the runtime and re-form in place) or
// restart (torchrun-style: every change restarts them).
enum class NodeMode { kInplace, kRestart };
inline constexpr EnumNames<NodeMode, 2> kNodeModeNames({"inplace", "restart"});
enum class KvOp { kSet, kGet, kWait };
inline constexpr EnumNames<KvOp, 3> kKvOpNames({"set", "get", "wait"});
// `edl ctl` commands (submit, jobs and cancel: a cluster server's).
enum class CtlCommand { kStatus, kScale, kWatch, kStop, kSubmit, kJobs, kCancel };
inline constexpr EnumNames<CtlCommand, 7> kCtlCommandNames({"status", "scale", "watch", "stop",
                                                            "submit", "jobs", "cancel"});

inline const char* NameOf(Role r) { return kRoleNames.Name(r); }
inline const char* NameOf(NodeMode m) { return kNodeModeNames.Name(m); }
inline const char* NameOf(KvOp o) { return kKvOpNames.Name(o); }
inline const char* NameOf(CtlCommand c) { return kCtlCommandNames.Name(c); }
// Parts that keep the mode as a flag (restart or not).
inline NodeMode NodeModeOf(bool restart) {
  return restart ? NodeMode::kRestart : NodeMode::kInplace;
}

// Largest host / key accepted on the wire (names and slots: names.h).
constexpr size_t kMaxHostBytes = 253;  // a DNS name
constexpr size_t kMaxKeyBytes = 512;
constexpr size_t kMaxListItems = 100000;
constexpr size_t kMaxValueBytes = 1u << 20;  // a KV value (e.g. an NCCL unique id, a Gloo address)

// Hosts become trainers' MASTER_ADDR and bind addresses: a DNS name (labels of letters, digits,
// '-' and '_', 1..63 bytes each, at most kMaxHostBytes) or an IPv4 / IPv6 literal.
bool IsValidHost(const std::string& s);
// An IPv4 or IPv6 loopback literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool IsLoopbackIp(const std::string& host);
// IsLoopbackIp, or the name localhost (localhost.*): every address is on this machine.
bool IsLoopbackHost(const std::string& host);
// The fix named when two edl clients on one machine offer the same slots (the server's node
// registry and the client's own host-slot claim, jobclient/host_slots.h, refuse the second).
extern const char kOneClientPerMachineFix[];

// CRTP base: Encoded() is EncodeTo's JSON, DebugString() that JSON on one line.
template <typename T>
struct Message {
  nlohmann::json Encoded() const {
    nlohmann::json j;
    static_cast<const T*>(this)->EncodeTo(&j);
    return j;
  }
  std::string DebugString() const {
    return Encoded().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
};

// ---- the generation as every part sees it

struct MemberInfo {
  std::string
      trainer_id;    // stable for the trainer process's life, unique in the job, e.g. "node1-s0-7"
  std::string node;  // node name of its client
  int slot = 0;      // slot / GPU index on that node
  int rank = 0;      // rank in this generation
  std::string host;  // address of that node that trainers bind and advertise
  bool operator==(const MemberInfo& o) const {
    return trainer_id == o.trainer_id && node == o.node && slot == o.slot && rank == o.rank &&
           host == o.host;
  }
};

// The reason of the generation that stops a whole job (`edl ctl stop`): it has no members, every
// trainer leaves in place and rank 0 of the generation before saves a final checkpoint first.
inline constexpr char kStopReason[] = "stop";

struct GenerationInfo : Message<GenerationInfo> {
  int64_t generation = 0;
  std::string job_id;
  std::string reason;  // "start", "script", "policy", "ctl", "failure", "node_loss", "grow_back",
                       // "join_timeout", "stop" (kStopReason), "resume" (first after a stop),
                       // "reform_retry" (a member could not re-form the previous one),
                       // "finish" (the same, while finishing: the unfinished members leave)
  bool failure =
      false;  // true when the change removed a trainer that died or hung: survivors must abort
  std::vector<MemberInfo>
      members;  // ordered by rank; survivors keep relative order, joiners come last
  std::string master_addr;
  int master_port = 0;  // for restart-mode (torchrun-style) trainers

  int world_size() const { return static_cast<int>(members.size()); }
  int RankOf(const std::string& trainer_id) const;  // -1 when not a member (a leaving trainer)
  const MemberInfo* Find(const std::string& trainer_id) const;

  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// A committed generation on the wire: the members of generation `base_generation` minus
// `removed`, followed by `added` (ranks are positions). base_generation == 0 means "from
// nothing": `added` is the whole list. Because survivors keep their relative order and joiners
// come last, a scaling step costs a few bytes per client whatever the world size.
struct GenerationUpdate : Message<GenerationUpdate> {
  int64_t base_generation = 0;
  GenerationInfo header;  // every field but `members`
  std::vector<std::string> removed;
  std::vector<MemberInfo> added;  // rank fields are ignored on decode (recomputed)

  static GenerationUpdate Full(const GenerationInfo& g);
  // The delta from `prev` to `next`, or Full(next) when `next` is not of the delta form.
  static GenerationUpdate Between(const GenerationInfo& prev, const GenerationInfo& next);
  // Applies the update to `*current` (the receiver's latest). FailedPrecondition when it is a
  // delta against a generation other than `current->generation`, or removes an unknown id.
  Status ApplyTo(GenerationInfo* current) const;

  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// ---- handshake

struct Challenge : Message<Challenge> {
  std::string nonce;  // 64 hex chars (32 random bytes), fresh per connection
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

constexpr size_t kSessionTokenBytes = 64;  // hex of 32 random bytes

// A job type a node's own configuration offers (cluster mode): its name and the flags a
// submission may set. The command stays on the node.
constexpr size_t kMaxJobTypesPerNode = 64;
constexpr size_t kMaxSettableFlags = 32;
constexpr size_t kMaxFlagNameBytes = 32;
constexpr size_t kMaxFlagValueBytes = 256;
struct JobTypeDecl {
  std::string name;
  std::vector<std::string> settable;  // flag names: a-z, 0-9, '_', starting with a letter
};
// A flag name as above; a flag value: printable ASCII, at most kMaxFlagValueBytes.
bool IsValidFlagName(const std::string& s);
bool IsValidFlagValue(const std::string& s);
// Empty when `path` is an absolute path without '.' or '..' components under `root` (absolute);
// otherwise the problem and the fix. An empty root allows no checkpoint_dir.
std::string CheckpointDirProblem(const std::string& path, const std::string& root);

struct Hello : Message<Hello> {
  Role role = Role::kClient;
  std::string mac;    // net::HelloMac over every other field and the server's nonce
  std::string nonce;  // the peer's own nonce, for the server's proof in Welcome
  // role kClient only:
  std::string node, host;
  NodeMode mode = NodeMode::kInplace;
  std::vector<int> slots;             // slot / GPU indices this node offers
  std::vector<std::string> trainers;  // trainers this client still runs (after a reconnect)
  // Parallel to `trainers` (same length, or empty from an older client): the generation each is
  // in, a prepared joiner's being the one it was prepared for (a server restart adopts survivors).
  std::vector<int64_t> trainer_generations;
  std::string
      node_token;  // the node's session token from an earlier welcome (64 hex); empty at first join
  // roles kTeacher and kStudent: the service name; kTeacher also fills `node` (the teacher's
  // name, unique in its service), `host` and `port` (where it serves students)
  std::string service;
  int port = 0;
  std::vector<JobTypeDecl> job_types;  // cluster mode: the job types this node runs (may be empty)
  // Role kClient: the services whose teachers this node runs (its --service NAME = COMMAND),
  // how many teachers at once (1..64 when services is not empty), and, after a reconnect, the
  // teachers it still runs as [service, name] pairs (at most teacher_slots).
  std::vector<std::string> services;
  int teacher_slots = 0;
  std::vector<std::pair<std::string, std::string>> teachers;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct Welcome : Message<Welcome> {
  std::string
      mac;  // net::WelcomeMac over every other field and the peer's nonce; empty on Unix sockets
  std::string job_id;
  int heartbeat_ms = 1000;  // how often the peer should send heartbeats
  std::string
      node_token;  // client role: the node's session token (64 hex), to present on reconnect
  // Client role: the client presented a session token for a node the server no longer knows (it
  // was lost past the heartbeat timeout, or the server started a new job): its trainers are stale.
  bool dropped = false;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct ErrorMsg : Message<ErrorMsg> {
  std::string code;  // Status::CodeName
  std::string message;
  std::string mac;  // optional: net::ServerErrorMac, when the server can prove the error
  static ErrorMsg From(const Status& s);
  // The status, with the peer's text escaped and cut (it may come from anybody).
  Status ToStatus() const;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct TrainerHello : Message<TrainerHello> {
  std::string trainer_id;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Warm spares (PROTOCOL.md, "Spares"): a spare trainer process, started by its client with the
// spare id it names here, says it is prepared (data and model loaded) and waits.
struct SpareHello : Message<SpareHello> {
  std::string spare_id;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Client -> spare: the trainer it becomes, as the env contract's variables (name -> value, the
// names of edl/runtime/env_contract.h; at most kMaxSpareEnvVars, values at most
// kMaxSpareEnvValueBytes). The spare then connects again, with a trainer_hello of that identity.
inline constexpr size_t kMaxSpareEnvVars = 64;
inline constexpr size_t kMaxSpareEnvValueBytes = 4096;
struct SpareAssign : Message<SpareAssign> {
  std::map<std::string, std::string> env;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Liveness: a client's heartbeat to the server (which answers with one), and a trainer's to its
// client. No fields.
struct Heartbeat : Message<Heartbeat> {
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);  // any object of type heartbeat
};

// Server -> client: stop every trainer and exit (`edl ctl stop`, a server stopping its clients).
struct Stop : Message<Stop> {
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Server -> client: the one job finished (every member exited 0).
struct Done : Message<Done> {
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// ---- scaling

struct Prepare : Message<Prepare> {
  int64_t generation = 0;  // the pending generation the joiners will belong to
  std::string job_id;
  int world_size = 0;  // of the pending generation
  std::string master_addr;
  int master_port = 0;
  std::vector<MemberInfo> joiners;  // with their ranks in the pending generation
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Server -> client, before any prepare or generation of a job of the cluster: the job's type and
// the flags its submission set (the client runs the type's command from its own configuration).
constexpr char kCheckpointDirFlag[] = "checkpoint_dir";
struct JobInfo : Message<JobInfo> {
  std::string job_id, job_type;
  std::map<std::string, std::string> flags;
  // The trainer's argv for this job on a node whose type runs `command`: the command, then
  // `--flag=value` for every flag, in name order (one argv element each: no shell sees them).
  std::vector<std::string> Argv(const std::vector<std::string>& command) const;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Client -> server, about every heartbeat: the node's measured utilisation since the previous
// report (CPU from /proc/stat). The server sums them for `edl ctl status` (CPU-UTILS, GPU-UTILS).
struct NodeStats : Message<NodeStats> {
  double cpu_busy = 0;   // CPUs busy on average over the interval, 0..cpu_cores
  int cpu_cores = 0;     // 1..kMaxSlotsPerNode*16
  double gpu_util = -1;  // mean GPU utilisation in percent, 0..100; -1: not measured
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct Kill : Message<Kill> {
  std::vector<std::string> trainer_ids;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Longest error line a trainer_exit carries (the trainer's last log line; shown quoted).
constexpr size_t kMaxErrorLineBytes = 512;

struct TrainerExit : Message<TrainerExit> {
  std::string trainer_id;
  bool exited = false;  // true: exited with `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;
  // Optional: a failed trainer's last non-empty log line (at most kMaxErrorLineBytes), so the
  // server can say why a job keeps failing (`edl ctl status`).
  std::string error;
  bool success() const { return exited && code == 0; }
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct Ready : Message<Ready> {
  std::string trainer_id;  // filled in by the client from the trainer's channel
  int64_t generation = 0;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

constexpr int64_t kMaxReportedBatch = int64_t{1} << 31;  // a bound, not a limit of EDL's
struct ProgressReport {
  int64_t generation = 0, step = 0, epoch = 0;
  double loss = 0, images_per_sec = 0;
  int world_size = 0;
  double accuracy = -1;
  // The job's samples committed through `step`, each counted once (epochs * data set + the
  // epoch's cursor): what `rate()` of a counter needs; -1: not reported (an older trainer).
  int64_t samples = -1;
  // What the job measures of itself (edl/runtime/self_measure.h). The gradient noise estimate,
  // the same on every rank: the steps behind it (0: none, and the next three are not sent), the
  // smoothed |G|^2 and tr(Sigma) (finite, either may be below 0 early on: estimates), and their
  // ratio, the noise scale in samples (-1: not meaningful yet).
  int64_t noise_steps = 0;
  double grad_sqr = 0, grad_var = 0, noise_scale = -1;
  // This rank's smoothed forward/backward seconds per sample and all-reduce seconds per step at
  // the current world size; -1: not measured.
  double compute_s_per_sample = -1, sync_s = -1;
  // The job's batch as this trainer runs it (--batch_size and --batch_policy): what the server's
  // goodput model predicts other world sizes by (jobserver/policy/goodput_feed.h). batch 0: not
  // reported (an older trainer), and batch_policy is not sent.
  int64_t batch = 0;  // 0 or 1..kMaxReportedBatch
  BatchPolicy batch_policy = BatchPolicy::kFixedLocal;
};

struct Progress : Message<Progress> {
  std::string trainer_id;
  ProgressReport report;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// A trainer's event (trainer_events.h): `event` is the object as sent, kept for the events log
// and read by nobody; `body` is its typed reading, set by DecodeFrom (a malformed object is
// ev::Malformed there, not a failed frame: the trainer and its node carry on).
struct Event : Message<Event> {
  std::string trainer_id;
  nlohmann::json event = nlohmann::json::object();  // any object, <= frame size
  TrainerEventBody body;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// ---- rendezvous KV

struct KvRequest : Message<KvRequest> {
  uint64_t req_id = 0;
  KvOp op = KvOp::kGet;
  std::string key, value;  // value: set only
  int64_t timeout_ms = 0;  // wait only, 0 .. 1 hour
  std::string job;  // client -> server: the trainer's job (cluster mode); empty: the default job
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct KvReply : Message<KvReply> {
  uint64_t req_id = 0;
  Status status;
  std::string value;
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// ---- ctl

struct CtlRequest : Message<CtlRequest> {
  CtlCommand command = CtlCommand::kStatus;
  int64_t n = 0;        // scale only
  std::string job;      // scale, cancel: the job (cluster mode; scale: empty for the single job)
  std::string service;  // scale: the distillation service whose teachers are scaled (not a job)
  nlohmann::json spec;  // submit: the job (jobserver/policy/job_spec.h decodes it)
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

struct CtlReply : Message<CtlReply> {
  Status status;
  nlohmann::json body = nlohmann::json::object();  // status: the job summary
  void EncodeTo(nlohmann::json* j) const;
  Status DecodeFrom(const nlohmann::json& j);
};

// Status <-> wire code name.
Status StatusFromWire(const std::string& code, const std::string& message);

}  // namespace edl::proto
