// The events-log records (events_log.h): one struct per record type that the server, the Cluster,
// the JobMembership and the NodeRegistry write, each field typed, and the record types' names in
// one table. A record is only ever built from its struct: ToJson() gives the JSON line's fields
// ("type" and the struct's own; EventsLog::Append adds "time" and "job"). The JSON is the log's
// format, read by scripts/demo.sh, scripts/plot_events.sh, bench/chaos_report.py, metrics.cc and
// the tests: a field's name and JSON type are fixed once written.
//
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/enum_names.h"
#include "edl/proto/messages.h"
#include "jobserver/policy/cluster_policy.h"
#include "jobserver/policy/job_spec.h"

namespace edl::jobserver::events {

enum class Type {
  // the server
  kServerStarted,
  kNewJob,
  kNewCluster,
  kStateMigrated,
  kRestored,
  kNodeDisconnected,
  kNodeDroppedRejoins,
  kStopped,
  kStopComplete,
  kSubmitted,
  kProgress,
  kTrainerEvent,
  // the cluster
  kNodeJoined,
  kStaleTrainers,
  kPolicy,
  kFailing,
  kJobFinished,
  kJobCancelled,
  // a job's membership
  kNodeLost,
  kMembersLostWithNode,
  kDesired,
  kKill,
  kStop,
  kPrepare,
  kPrepareAborted,
  kGeneration,
  kTrainerExit,
  kJoinerExit,
  kJoinerRefused,
  kFailedWhileFinishing,
  kFinished,
  kRecovered,
};
inline constexpr EnumNames<Type, 32> kTypeNames({
    "server_started",
    "new_job",
    "new_cluster",
    "state_migrated",
    "restored",
    "node_disconnected",
    "node_dropped_rejoins",
    "stopped",
    "stop_complete",
    "submitted",
    "progress",
    "trainer_event",
    "node_joined",
    "stale_trainers",
    "policy",
    "failing",
    "job_finished",
    "job_cancelled",
    "node_lost",
    "members_lost_with_node",
    "desired",
    "kill",
    "stop",
    "prepare",
    "prepare_aborted",
    "generation",
    "trainer_exit",
    "joiner_exit",
    "joiner_refused",
    "failed_while_finishing",
    "finished",
    "recovered",
});
inline const char* NameOf(Type t) { return kTypeNames.Name(t); }
// The type of a record as written (its "type" field); false when it has none of these.
bool TypeOf(const nlohmann::json& record, Type* out);

// ---- the server's

struct ServerStarted {
  static constexpr Type kType = Type::kServerStarted;
  int port = 0;
  nlohmann::json ToJson() const;
};

// No state was found: a one-job server starts a new job (new_job), a cluster server an empty
// cluster (new_cluster).
template <Type T>
struct NewState {
  static constexpr Type kType = T;
  std::string state_dir, state_store;  // the server's --state_dir, --state_store
  nlohmann::json ToJson() const {
    return {{"type", NameOf(T)}, {"state_dir", state_dir}, {"state_store", state_store}};
  }
};
using NewJob = NewState<Type::kNewJob>;
using NewCluster = NewState<Type::kNewCluster>;

// The state was in the old one-job layout: read once and rewritten in the current one.
struct StateMigrated {
  static constexpr Type kType = Type::kStateMigrated;
  std::string state;  // where the state is kept
  nlohmann::json ToJson() const;
};

// A cluster server resumed a saved cluster (a job's own resumption is JobRestored).
struct ClusterRestored {
  static constexpr Type kType = Type::kRestored;
  size_t jobs = 0, nodes = 0, ended = 0;
  nlohmann::json ToJson() const;
};

struct NodeDisconnected {
  static constexpr Type kType = Type::kNodeDisconnected;
  std::string node, why;
  nlohmann::json ToJson() const;
};

// A client presented a session token of a node the cluster no longer knows.
struct NodeDroppedRejoins {
  static constexpr Type kType = Type::kNodeDroppedRejoins;
  std::string node;
  size_t stale_trainers = 0;  // the trainers its hello lists
  nlohmann::json ToJson() const;
};

// `edl ctl stop` was accepted.
struct Stopped {
  static constexpr Type kType = Type::kStopped;
  std::string by;
  nlohmann::json ToJson() const;
};

// Rank 0's final checkpoint of a stop, as it reported it (Cluster::FinalCheckpointOf); the names
// are those of stop_complete's "final_checkpoint" and of `edl ctl stop`'s reply.
enum class FinalCheckpoint { kNotReported, kSaved, kFailed };
inline constexpr EnumNames<FinalCheckpoint, 3> kFinalCheckpointNames({"none", "saved", "failed"});

// The stop ended: how many trainers had not left, and rank 0's final checkpoint.
struct StopComplete {
  static constexpr Type kType = Type::kStopComplete;
  int64_t generation = 0;
  size_t not_left = 0;
  FinalCheckpoint final_checkpoint = FinalCheckpoint::kNotReported;
  nlohmann::json ToJson() const;
};

struct Submitted {
  static constexpr Type kType = Type::kSubmitted;
  JobSpec spec;
  nlohmann::json ToJson() const;  // "spec": EncodeJobSpec
};

// A running job's progress (at most one a second while trainers report).
struct Progress {
  static constexpr Type kType = Type::kProgress;
  int reporting = 0;            // members that reported
  int64_t step = 0, epoch = 0;  // the highest
  double loss = 0;              // rank 0's
  double images_per_sec = 0;    // the sum
  double accuracy = -1;         // rank 0's; -1: not reported
  int64_t samples = -1;         // the job's samples committed (the highest report); -1: none
  int64_t generation = 0;
  int world_size = 0;
  nlohmann::json ToJson() const;
};

// A trainer's own event (ReportEvent), relayed by its node: the trainer's fields, then these.
struct TrainerEvent {
  static constexpr Type kType = Type::kTrainerEvent;
  nlohmann::json event =
      nlohmann::json::object();  // its "time" and "job" are dropped (the log's own)
  std::string trainer_id, node;
  nlohmann::json ToJson() const;
};

// ---- the cluster's

struct NodeJoined {
  static constexpr Type kType = Type::kNodeJoined;
  std::string node, host;
  size_t slots = 0;
  proto::NodeMode mode = proto::NodeMode::kInplace;
  std::vector<std::string> job_types;
  nlohmann::json ToJson() const;
};

// Trainers a node runs that belong to no live job (generation unset), or to no generation of the
// job (generation: the job's current one); they are killed.
struct StaleTrainers {
  static constexpr Type kType = Type::kStaleTrainers;
  std::string node;
  std::vector<std::string> trainer_ids;
  std::optional<int64_t> generation;
  nlohmann::json ToJson() const;
};

// A decision of the cluster policy (cluster_policy.h): its fields, then the type.
struct Policy {
  static constexpr Type kType = Type::kPolicy;
  PolicyEvent event;
  nlohmann::json ToJson() const;
};

// A job whose trainers failed the same way kFailingAfter times in a row (cluster.h).
struct Failing {
  static constexpr Type kType = Type::kFailing;
  int exits = 0;
  std::string how, last_error;
  nlohmann::json ToJson() const;
};

// A submitted job ended (job_finished) or was cancelled (job_cancelled).
template <Type T>
struct JobEnded {
  static constexpr Type kType = T;
  std::string job_name;
  nlohmann::json ToJson() const { return {{"type", NameOf(T)}, {"job_name", job_name}}; }
};
using JobFinished = JobEnded<Type::kJobFinished>;
using JobCancelled = JobEnded<Type::kJobCancelled>;

// ---- a job's membership

struct NodeLost {
  static constexpr Type kType = Type::kNodeLost;
  std::string node, why;
  nlohmann::json ToJson() const;
};

// A node's connection closed and a member of another node reported a failed collective of the
// generation: the node's members (trainer_ids) were taken as dead (JobMembership::CommFailed).
struct MembersLostWithNode {
  static constexpr Type kType = Type::kMembersLostWithNode;
  std::string node;
  std::vector<std::string> trainer_ids;
  int64_t generation = 0;
  std::string reporter;  // the member whose collective failed
  nlohmann::json ToJson() const;
};

struct Desired {
  static constexpr Type kType = Type::kDesired;
  int desired = 0;
  std::string reason;
  nlohmann::json ToJson() const;
};

struct Kill {
  static constexpr Type kType = Type::kKill;
  std::vector<std::string> trainers;
  nlohmann::json ToJson() const;
};

// The job stops (`edl ctl stop`): the stop generation follows.
struct Stop {
  static constexpr Type kType = Type::kStop;
  std::string by;
  int64_t generation = 0;  // the last one with members
  size_t trainers = 0;     // leaving
  nlohmann::json ToJson() const;
};

struct Prepare {
  static constexpr Type kType = Type::kPrepare;
  int64_t generation = 0;
  std::string reason;
  size_t joiners = 0;
  nlohmann::json ToJson() const;
};

struct PrepareAborted {
  static constexpr Type kType = Type::kPrepareAborted;
  int64_t generation = 0;
  std::string why;
  nlohmann::json ToJson() const;
};

struct Generation {
  static constexpr Type kType = Type::kGeneration;
  int64_t generation = 0;
  std::string reason;
  bool failure = false;
  int world_size_before = 0, world_size_after = 0;
  // A grow's preparation: from starting its joiners to the commit (they load and warm up while
  // the members train on, so this is not a stall of the job: the trainers' own "stall" events
  // measure that); 0 for a change without joiners.
  double prepare_s = 0;
  nlohmann::json ToJson() const;
};

struct TrainerExit {
  static constexpr Type kType = Type::kTrainerExit;
  std::string trainer_id, how;
  bool success = false;
  nlohmann::json ToJson() const;
};

// A joiner of a pending generation ended before it committed.
struct JoinerExit {
  static constexpr Type kType = Type::kJoinerExit;
  std::string trainer_id, how;
  nlohmann::json ToJson() const;
};

struct JoinerRefused {
  static constexpr Type kType = Type::kJoinerRefused;
  std::string trainer_id, node, why;
  nlohmann::json ToJson() const;
};

struct FailedWhileFinishing {
  static constexpr Type kType = Type::kFailedWhileFinishing;
  std::string trainer_id, how;
  nlohmann::json ToJson() const;
};

struct Finished {
  static constexpr Type kType = Type::kFinished;
  int64_t generation = 0;
  int world_size = 0;
  nlohmann::json ToJson() const;
};

// A job resumed from the saved state (a cluster's resumption is ClusterRestored).
struct JobRestored {
  static constexpr Type kType = Type::kRestored;
  int64_t generation = 0;
  int world_size = 0;
  int64_t max_generation = 0;
  size_t nodes = 0;
  bool done = false;
  nlohmann::json ToJson() const;
};

// After a restore, every member's node re-attached or was lost.
struct Recovered {
  static constexpr Type kType = Type::kRecovered;
  int64_t generation = 0;
  int world_size = 0;
  nlohmann::json ToJson() const;
};

}  // namespace edl::jobserver::events
