// Scheduler: the job's membership logic, with no sockets and no threads, so every decision can be
// unit-tested with a ManualClock. It owns the desired size, the nodes and their slots, the
// committed generation and at most one pending (prepared, not yet committed) generation. Inputs are
// events (a node registers, heartbeats, is lost; a trainer exits or reports ready; the desired
// size changes; time passes); outputs are Actions the server turns into frames and log records.
//
// Invariants:
//  - current().members are ordered by rank; a new generation keeps survivors in their order and
//    appends new trainers (joiners, and restart-mode replacements) at the end.
//  - a slot holds at most one member or pending joiner.
//  - generation numbers grow by one per commit; a pending generation is current+1. After a
//    Restore they continue above every number the previous server issued (max_generation()), so
//    a restarted server never reuses one (jobserver/STATE.md).
//
// Thread-safety: none; the server calls it from its io_context thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobserver/job_state.h"

namespace edl::jobserver {

// Most slots one node may offer (a client's --slots is bounded alike).
constexpr size_t kMaxSlotsPerNode = 4096;

struct SchedulerOptions {
  std::string job_id = "edl-job";
  int min_trainers = 1;       // never start below this; desired sizes are clamped up to it
  // The first generation waits for initial_trainers slots (or join_timeout_us after the first node
  // registered, with at least min_trainers).
  int max_trainers = 0;       // 0: no bound
  int initial_trainers = 0;   // desired size at start; 0: every free slot
  int64_t heartbeat_timeout_us = 5'000'000;  // a node silent this long is lost
  int64_t join_timeout_us = 60'000'000;      // joiners not ready by then are dropped
  int master_port_base = 29500;              // MASTER_PORT = base + generation % 1000
  int64_t backoff_min_us = 1'000'000;        // grow-back delay after a failure, doubling...
  int64_t backoff_max_us = 30'000'000;       // ...up to this; reset after a quiet minute
  // Cluster mode (jobserver/cluster.h): the trainer-id counter shared by every job of the server,
  // so ids are unique across jobs. Not owned; null: the scheduler's own counter.
  uint64_t* shared_trainer_seq = nullptr;
};

// Cluster mode: the slots one job may use on one node (Scheduler::SetAllocation).
struct SlotGrant {
  std::string node, host;
  bool restart_mode = false;
  std::vector<int> slots;
};

struct Action {
  enum class Kind { kPrepare, kCommit, kKill, kDone, kEvent };
  Kind kind = Kind::kEvent;
  std::string node;                 // kPrepare, kKill: the target node
  proto::Prepare prepare;           // kPrepare
  proto::GenerationInfo prev, next; // kCommit: the generation before and the new one
  std::vector<std::string> trainer_ids;  // kKill
  nlohmann::json event;             // kEvent: one events-log record (without time/job)
};

class Scheduler {
 public:
  // `clock` is not owned and must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, Clock* clock);

  // ---- inputs
  // Whether a client presenting session token `session` (empty at a first join) may register as
  // node `name` now. OK for a name the scheduler does not know (a first join; the caller then
  // issues a token) or for the node's own token (a re-attach: the caller first drops the node's
  // old connection, which may be half dead). Unavailable, a retryable refusal, while the name
  // belongs to a client that holds another token (connected, or disconnected and not yet lost):
  // a node name is not an identity, the token is. InvalidArgument for a name too long for its
  // trainer ids (proto::kMaxNodeNameBytes).
  Status CheckAdmission(const std::string& name, const std::string& session) const;
  // The session token of known node `name`; empty when unknown.
  std::string SessionOf(const std::string& name) const;
  // A client registered (after CheckAdmission). A node name whose client is still connected is
  // AlreadyExists. A known, disconnected node is re-attached: its members not in `running` are
  // treated as failed. `session` is kept as the node's token. `generations` (empty: unknown) is
  // parallel to `running`: the generation each trainer is in (a joiner: the one it was prepared
  // for). A reported trainer that is not a member and is in a generation above the current one
  // (a joiner of a change rolled back by a server restart), or that a node unknown to the
  // scheduler runs (the node was lost, or this is a new job), is killed; a member that reports a
  // generation above the current one is treated as failed (the stored state is older than it).
  Status AddNode(const std::string& name, const std::string& host, bool restart_mode,
                 const std::vector<int>& slots, const std::vector<std::string>& running,
                 const std::string& session = "", const std::vector<int64_t>& generations = {});
  void NodeDisconnected(const std::string& name);
  // The node is gone (cluster mode: the cluster's heartbeat timeout): as a heartbeat loss.
  void NodeLost(const std::string& name, const std::string& why) {
    auto it = nodes_.find(name);
    if (it != nodes_.end()) LoseNode(&it->second, why);
  }
  void Heartbeat(const std::string& name);
  void TrainerExited(const std::string& trainer_id, bool success, const std::string& how);
  void TrainerReady(const std::string& trainer_id, int64_t generation);
  void SetDesired(int n, const std::string& reason);
  void AddDesired(int delta, const std::string& reason);
  // SIGKILLs up to `k` running members (highest ranks first) through their clients.
  void KillTrainers(int k);
  // SIGKILLs every running member and, in the same step, commits the empty failure generation, so
  // no survivor re-forms in between (their exits then count as expected). After the failure
  // backoff the job restarts from scratch: the trainers cold-start from the latest checkpoint.
  void KillAllTrainers();
  // Stops the whole job as one decision (jobserver/STATE.md "Stopping a job"): a change being
  // prepared is rolled back and one generation with no members, reason "stop", is committed, so
  // every trainer leaves in place at a step they agree on (rank 0 saves a final checkpoint first)
  // and no failure is recorded; nothing grows or shrinks afterwards. The members still running go
  // to *leaving (the trainers the server waits for). False, committing nothing, when no
  // generation runs (not started yet, finished, or already stopping).
  bool Stop(const std::string& by, std::vector<proto::MemberInfo>* leaving);
  bool stopping() const { return stopping_; }
  // Cluster mode: the slots this job may use, per node (nodes not named keep none; a named node
  // the scheduler does not know is added, connected). Members and joiners on slots no longer
  // granted leave in place, in one commit with `reason`; the desired size becomes the granted
  // total, so the job then grows into its granted free slots.
  void SetAllocation(const std::vector<SlotGrant>& grants, const std::string& reason);
  // Heartbeat loss, join timeout, grow-back, then reconciles membership with the desired size.
  void Tick();

  // Takes the actions produced since the last call, in order.
  std::vector<Action> TakeActions();

  // ---- durable state (jobserver/STATE.md)
  // The job-level fields of `*s` and its nodes (the scaling fields are the server's).
  void Snapshot(JobState* s) const;
  // Resumes a job saved by an earlier server. Its nodes are known but disconnected; until every
  // node holding a member of the current generation has re-attached or been lost (heartbeat
  // timeout, counted from now plus one timeout of grace), membership does not change: survivors
  // are adopted as they report. A change that was being prepared is rolled back (its joiners are
  // killed when their nodes report them); numbers continue above s.max_generation.
  void Restore(const JobState& s);
  // Generations issued from now on are above `g` (e.g. the newest generation in the checkpoint
  // store, so its fence accepts the new trainers' saves).
  void RaiseGenerationFloor(int64_t g) { generation_floor_ = std::max(generation_floor_, g); }
  // Highest generation number issued (committed, prepared or skipped).
  int64_t max_generation() const;
  bool recovering() const { return recovering_; }

  // ---- state
  const proto::GenerationInfo& current() const { return current_; }
  bool has_pending() const { return pending_.active; }
  int desired() const { return desired_; }   // 0: every free slot
  int target() const;                        // desired clamped to min/max and free slots
  int total_slots() const;
  int used_slots() const;
  int connected_nodes() const;
  bool done() const { return done_; }
  bool IsNodeConnected(const std::string& name) const;
  // Authorization of a node's reports (PROTOCOL.md "Client -> server"): true when the scheduler
  // placed `trainer_id` on `node`: a member or pending joiner there, or an id it issued for that
  // node earlier ("<node>-s<slot>-<seq>" with a seq it handed out: a leaving trainer).
  bool PlacedOn(const std::string& trainer_id, const std::string& node) const;
  // A member or pending joiner of `node` now (progress is kept only for these).
  bool IsLiveTrainerOf(const std::string& trainer_id, const std::string& node) const;
  bool IsLiveTrainer(const std::string& trainer_id) const {
    return FindMember(trainer_id) != nullptr || pending_.joiner_ids.count(trainer_id) > 0;
  }
  const std::string& NodeOfTrainer(const std::string& id) const;
  std::vector<std::string> NodeNames() const;
  nlohmann::json Summary() const;  // for `edl ctl status`

 private:
  struct Node {
    std::string name, host;
    bool restart_mode = false;
    std::vector<int> slots;
    bool connected = false;
    int64_t last_heard_us = 0;
    int order = 0;  // registration order: placement fills nodes in this order
    std::string session;  // the token its client proves itself with on a re-attach
  };
  struct Pending {
    bool active = false;
    int64_t generation = 0;
    int64_t started_us = 0;
    std::string reason;
    std::vector<proto::MemberInfo> joiners;
    // The ids in `joiners` and their nodes, for O(1) lookups: a large growth gets thousands of
    // reports about its joiners, each checked against its sender.
    std::unordered_map<std::string, std::string> joiner_ids;
    std::set<std::string> ready;
  };

  // current_'s member `trainer_id` (O(1): every report from a node is checked against it), or null.
  const proto::MemberInfo* FindMember(const std::string& trainer_id) const;
  void SetCurrent(proto::GenerationInfo g);  // current_ = g, and its index

  void Reconcile();
  bool StartBarrierPassed(int target) const;
  void Grow(int count);
  void Shrink(int count, const std::string& reason);
  void RemoveMembers(const std::set<std::string>& gone, const std::string& reason, bool failure);
  void AbortPending(const std::string& why);
  void MaybeCommitPending(bool timed_out);
  void Commit(std::vector<proto::MemberInfo> members, const std::string& reason, bool failure,
              int64_t stall_us);
  void NoteFailure();
  void LoseNode(Node* node, const std::string& why);
  std::vector<proto::MemberInfo> FreeSlots(int count) const;
  std::string NewTrainerId(const std::string& node, int slot);
  std::set<std::pair<std::string, int>> TakenSlots() const;
  void Emit(Action a) { actions_.push_back(std::move(a)); }
  void EmitEvent(nlohmann::json e);
  int64_t NextGeneration() const { return std::max(current_.generation, generation_floor_) + 1; }
  uint64_t& TrainerSeq() { return options_.shared_trainer_seq ? *options_.shared_trainer_seq : next_trainer_seq_; }
  uint64_t TrainerSeq() const {
    return options_.shared_trainer_seq ? *options_.shared_trainer_seq : next_trainer_seq_;
  }
  void UpdateRecovery();

  const SchedulerOptions options_;
  Clock* const clock_;  // not owned

  std::map<std::string, Node> nodes_;
  int next_node_order_ = 0;
  int64_t first_node_us_ = -1;
  int desired_ = 0;
  std::string desired_reason_ = "start";
  bool need_grow_back_ = false;   // a failure shrank the job; the next growth is "grow_back"
  int64_t grow_blocked_until_us_ = 0;
  int64_t backoff_us_ = 0;
  int64_t last_failure_us_ = 0;
  proto::GenerationInfo current_;               // changed only by SetCurrent
  std::unordered_map<std::string, size_t> current_index_;  // trainer id -> position in current_
  Pending pending_;
  std::set<std::string> finished_;  // members that exited 0: training is complete for them
  bool done_ = false;
  uint64_t next_trainer_seq_ = 1;
  int64_t generation_floor_ = 0;  // numbers issued by earlier servers (Restore) or seen in the store
  bool stopping_ = false;         // Stop() committed the stop generation: no more changes
  bool recovering_ = false;       // restored; waiting for the current members' nodes (Restore)
  std::vector<Action> actions_;
};

}  // namespace edl::jobserver
