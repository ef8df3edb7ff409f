// JobMembership: one job's membership, with no sockets, no threads and no nodes of its own, so
// every decision can be unit-tested with a ManualClock. The Cluster (cluster.h) owns one per job:
// it hands the job the slots it may use on each node (SetAllocation, from the cluster's
// NodeRegistry, the one home of node identity and liveness) and routes the nodes' reports to it.
// The membership owns the desired size, the committed generation, at most one pending (prepared,
// not yet committed) generation, the joiners, the trainers that finished and those leaving. Inputs
// are events (a node of its allocation re-attaches, disconnects or is lost; a trainer exits or
// reports ready; the desired size changes; time passes); outputs are Actions the server turns
// into frames and events-log records.
//
// Invariants:
//  - current().members are ordered by rank; a new generation keeps survivors in their order and
//    appends new trainers (joiners, and restart-mode replacements) at the end.
//  - a slot holds at most one member or pending joiner, and only a slot of the allocation.
//  - generation numbers grow by one per commit; a pending generation is current+1. After a
//    Restore they continue above every number the previous server issued (max_generation()), so
//    a restarted server never reuses one (jobserver/state/STATE.md).
//  - a trainer this job placed on a node and then removed (shrunk, failed, killed) is "leaving"
//    until its node reports its exit or is lost: its node may still report about it.
//
// Thread-safety: none; the server calls it from its io_context thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobserver/state/job_state.h"

namespace edl::jobserver {

struct MembershipOptions {
  std::string job_id = "edl-job";
  int min_trainers = 1;  // never start below this; desired sizes are clamped up to it
  // The first generation waits for initial_trainers slots (or join_timeout_us after the first node
  // was granted, with at least min_trainers).
  int max_trainers = 0;                  // 0: no bound
  int initial_trainers = 0;              // desired size at start; 0: every free slot
  int64_t join_timeout_us = 60'000'000;  // joiners not ready by then are dropped
  int master_port_base = 29500;          // MASTER_PORT = base + generation % 1000
  // Grow-back delay after a failure of what has not yet trained (a joiner, a member before its
  // first step), doubling up to backoff_max_us, reset after a quiet minute. A member that trained
  // and then failed is replaced at once: the back-off is for what keeps failing.
  int64_t backoff_min_us = 1'000'000;
  int64_t backoff_max_us = 30'000'000;
  // The trainer-id counter shared by every job of the server, so ids are unique across jobs (a
  // node's report is routed by the id alone). Not owned; null: the membership's own counter.
  uint64_t* shared_trainer_seq = nullptr;
};

// The slots one job may use on one node (JobMembership::SetAllocation), with what the job needs
// to know of the node.
struct SlotGrant {
  std::string node, host;
  bool restart_mode = false;
  std::vector<int> slots;
  bool connected = true;  // disconnected: its free slots are not offered to joiners
  int order = 0;          // the node's registration order: placement fills nodes in this order
};

struct Action {
  enum class Kind { kPrepare, kCommit, kKill, kDone, kEvent };
  Kind kind = Kind::kEvent;
  std::string node;                      // kPrepare, kKill: the target node
  proto::Prepare prepare;                // kPrepare
  proto::GenerationInfo prev, next;      // kCommit: the generation before and the new one
  std::vector<std::string> trainer_ids;  // kKill
  // kEvent: one events-log record (without time/job), built from its struct (events.h) by Record.
  nlohmann::json event;

  // The kEvent action of record `e` (an events.h struct).
  template <typename E>
  static Action Record(const E& e) {
    static_assert(std::is_enum_v<decltype(E::kType)>,
                  "an events-log record is built from its events.h struct");
    Action a;
    a.kind = Kind::kEvent;
    a.event = e.ToJson();
    return a;
  }
};

class JobMembership {
 public:
  // `clock` is not owned and must outlive the membership.
  JobMembership(const MembershipOptions& options, Clock* clock);
  // Whether `n` trainers is a size this job may be asked for (`edl ctl scale N`): within
  // --min_trainers..--max_trainers. InvalidArgument naming the bounds and the flags otherwise.
  Status CheckSize(int n) const;

  // ---- inputs
  // The slots this job may use, per node (nodes not named keep none). Members and joiners on slots
  // no longer granted leave in place, in one commit with `reason`. `desired`: the new desired size
  // (a many-jobs policy grants exactly what the job should run); none: the desired size stays
  // (a one-job server's job is granted every slot and sized by its flags, script and ctl).
  void SetAllocation(const std::vector<SlotGrant>& grants, const std::string& reason,
                     std::optional<int> desired = std::nullopt);
  // A node of the allocation re-attached (its client reconnected): its members not in `running`
  // are treated as failed. `running` are the trainers of this job the client reports (members,
  // joiners and leavers of this job on that node); `generations`
  // (empty: unknown) is parallel: the generation each is in (a joiner: the one it was prepared
  // for). A member that reports a generation above the current one is failed (the stored state
  // is older than it) and killed, as is a non-member above the current generation (a joiner of a
  // change a server restart rolled back).
  void NodeAttached(const std::string& name, const std::vector<std::string>& running,
                    const std::vector<int64_t>& generations = {});
  // The node's client connection closed (the server saw it close, in its own lifetime): its free
  // slots are not offered, and its members count as dead as soon as a member of another node
  // reports the current generation failed (CommFailed, ReformFailed).
  void NodeDisconnected(const std::string& name);
  // The node is gone (the cluster's heartbeat timeout): its members fail, it leaves the allocation.
  void NodeLost(const std::string& name, const std::string& why);
  void TrainerExited(const std::string& trainer_id, bool success, const std::string& how);
  void TrainerReady(const std::string& trainer_id, int64_t generation);
  // Member `trainer_id` could not re-form the current generation `generation` (its rendezvous or
  // state sync failed and nothing newer was committed): the members are committed again as a
  // failure generation, at most once per backoff_min_us, so they re-form without waiting out their
  // generation wait. Reports about an older generation, or from a non-member, change nothing.
  // While the job finishes (a member exited 0), the unfinished members leave instead (a
  // generation of the finished ones, reason "finish"), and the job finishes. The same happens
  // without a report once every unfinished member is a joiner that never stepped: training ended
  // before their first step, and their peers are gone (TrainerExited).
  // Before any retry, members on nodes whose connection closed are taken as dead (as CommFailed).
  void ReformFailed(const std::string& trainer_id, int64_t generation);
  // Member `trainer_id` (its report authorized as its own node's) could not complete a collective
  // of generation `generation` (event "comm_failed"; the current one, or an older one that a
  // trainer's exit report superseded meanwhile): a peer died. A client's death takes its trainers
  // with it, and the server learns of theirs only when the restarted client re-attaches or the
  // node's heartbeat times out (seconds the survivors would wait). So when a node holding members
  // lost its connection in this server's lifetime and has not re-attached, its members are taken as
  // dead now: one failure generation without them (record members_lost_with_node). A client that
  // only lost its connection gets back trainers the job no longer has; they leave or are killed
  // when it re-attaches. Other reports (about a generation before the node closed, from a
  // non-member, while restoring, stopping or finishing) change nothing but the memory of the
  // report, which a connection that closes later in that generation still uses.
  void CommFailed(const std::string& trainer_id, int64_t generation);
  // Member `trainer_id` took a step (its progress report or its first step as a joiner): from now
  // on its failure is replaced without the back-off.
  void TrainerStepped(const std::string& trainer_id);
  // A pending joiner the cluster refuses (its configuration differs from the job's): killed, the
  // change goes on without it, and no joiner is placed on its node again until the node
  // re-attaches (a client restarted, perhaps with the right configuration) or is lost.
  void RefuseJoiner(const std::string& trainer_id, const std::string& why);
  void SetDesired(int n, const std::string& reason);
  void AddDesired(int delta, const std::string& reason);
  // SIGKILLs up to `k` running members (highest ranks first) through their clients.
  void KillTrainers(int k);
  // SIGKILLs every running member and, in the same step, commits the empty failure generation, so
  // no survivor re-forms in between (their exits then count as expected). After the failure
  // backoff the job restarts from scratch: the trainers cold-start from the latest checkpoint.
  void KillAllTrainers();
  // Stops the whole job as one decision (jobserver/state/STATE.md "Stopping a job"): a change being
  // prepared is rolled back and one generation with no members, reason "stop", is committed, so
  // every trainer leaves in place at a step they agree on (rank 0 saves a final checkpoint first)
  // and no failure is recorded; nothing grows or shrinks afterwards. The members still running go
  // to *leaving (the trainers the server waits for). False, committing nothing, when no
  // generation runs (not started yet, finished, or already stopping).
  bool Stop(const std::string& by, std::vector<proto::MemberInfo>* leaving);
  bool stopping() const { return stopping_; }
  // Join timeout, grow-back, then reconciles membership with the desired size.
  void Tick();

  // Takes the actions produced since the last call, in order.
  std::vector<Action> TakeActions();

  // ---- durable state (jobserver/state/STATE.md)
  // The job-level fields of `*s` (its nodes are the cluster's; the scaling fields the server's).
  void Snapshot(JobState* s) const;
  // Resumes a job saved by an earlier server on its saved allocation (`grants`; the nodes not
  // connected yet). Until every node holding a member of the current generation has re-attached or
  // been lost, membership does not change: survivors are adopted as they report. A change that was
  // being prepared is rolled back (its joiners are killed when their nodes report them); numbers
  // continue above s.max_generation.
  void Restore(const JobState& s, const std::vector<SlotGrant>& grants);
  // Generations issued from now on are above `g` (e.g. the newest generation in the checkpoint
  // store, so its fence accepts the new trainers' saves).
  void RaiseGenerationFloor(int64_t g) { generation_floor_ = std::max(generation_floor_, g); }
  // Highest generation number issued (committed, prepared or skipped).
  int64_t max_generation() const;
  bool recovering() const { return recovering_; }

  // ---- state
  const proto::GenerationInfo& current() const { return current_; }
  bool has_pending() const { return pending_.active; }
  int desired() const { return desired_; }  // 0: every free slot
  int target() const;                       // desired clamped to min/max and free slots
  int total_slots() const;
  int used_slots() const;
  bool done() const { return done_; }
  // Authorization of a node's reports (PROTOCOL.md "Client -> server"): true when this job placed
  // `trainer_id` on `node` and it may still run: a member or pending joiner there, or a trainer of
  // that node leaving.
  bool PlacedOn(const std::string& trainer_id, const std::string& node) const;
  // A member or pending joiner of `node` now (progress is kept only for these).
  bool IsLiveTrainerOf(const std::string& trainer_id, const std::string& node) const;
  bool IsLiveTrainer(const std::string& trainer_id) const {
    return FindMember(trainer_id) != nullptr || pending_.joiner_ids.count(trainer_id) > 0;
  }
  bool IsMember(const std::string& trainer_id) const { return FindMember(trainer_id) != nullptr; }
  // Whether `node` is in the allocation (its trainers may use the job's rendezvous KV).
  bool HasNode(const std::string& node) const {
    auto it = nodes_.find(node);
    return it != nodes_.end() && !it->second.slots.empty();
  }
  nlohmann::json Summary() const;  // for `edl ctl status`; `nodes` as the allocation sees them

 private:
  struct Node {
    std::string name, host;
    bool restart_mode = false;
    std::vector<int> slots;
    bool connected = false;
    int order = 0;
    // Set while its connection is closed, as the current generation when it closed: closed in
    // this server's lifetime (NodeDisconnected), not re-attached since. A node not yet re-attached
    // after a Restore has none.
    std::optional<int64_t> closed_generation = std::nullopt;
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
  // While finishing: commits the finished members alone (reason "finish"); the others leave.
  // `why` is logged.
  void CommitFinish(const std::string& why);
  void NoteFailure();
  // A member of a connected node reported that a generation failed (failed_report_), one current
  // when or after a node's connection closed: that node's members are removed as dead, in one
  // failure generation. True when any were.
  bool FailMembersOfClosedNodes();
  // Members `gone` failed (called before they are removed): the back-off applies unless every
  // one of them had trained (stepped).
  void NoteMembersFailed(const std::set<std::string>& gone, const std::string& what);
  void OnExit(const std::string& trainer_id, bool success, const std::string& how);
  // Removes pending joiner `trainer_id` from the change being prepared (which goes on without it,
  // or ends when it was the last).
  void DropJoiner(const std::string& trainer_id);
  void EmitKill(const std::string& node, std::vector<std::string> ids);  // and marks them leaving
  void MarkLeaving(const std::string& id, const std::string& node);
  std::vector<proto::MemberInfo> FreeSlots(int count) const;
  std::set<std::pair<std::string, int>> TakenSlots() const;
  std::string NewTrainerId(const std::string& node, int slot);
  void Emit(Action a) { actions_.push_back(std::move(a)); }
  template <typename E>
  void EmitEvent(const E& e) {  // an events.h record
    Emit(Action::Record(e));
  }
  int64_t NextGeneration() const { return std::max(current_.generation, generation_floor_) + 1; }
  uint64_t& TrainerSeq() {
    return options_.shared_trainer_seq ? *options_.shared_trainer_seq : next_trainer_seq_;
  }
  uint64_t TrainerSeq() const {
    return options_.shared_trainer_seq ? *options_.shared_trainer_seq : next_trainer_seq_;
  }
  void UpdateRecovery();

  const MembershipOptions options_;
  Clock* const clock_;  // not owned

  std::map<std::string, Node> nodes_;  // the allocation
  int64_t first_node_us_ = -1;
  int desired_ = 0;
  std::string desired_reason_ = "start";
  bool need_grow_back_ = false;  // a failure shrank the job; the next growth is "grow_back"
  int64_t grow_blocked_until_us_ = 0;
  int64_t backoff_us_ = 0;
  int64_t last_reform_retry_us_ = -1;  // the last commit ReformFailed made
  // The newest report that a generation failed (CommFailed, ReformFailed): its number and reporter.
  // It outlives its generation: a node that closes later in that generation is judged by it.
  struct FailedReport {
    int64_t generation = -1;
    std::string trainer_id;
  } failed_report_;
  int64_t last_failure_us_ = 0;
  proto::GenerationInfo current_;                          // changed only by SetCurrent
  std::unordered_map<std::string, size_t> current_index_;  // trainer id -> position in current_
  Pending pending_;
  std::set<std::string> finished_;  // members that exited 0: training is complete for them
  // Members that took a step (TrainerStepped) since they joined, or that a restored state names.
  std::unordered_set<std::string> stepped_;
  // Members that joined a running job (a grow or a failure's replacement, committed by this
  // server) and have not stepped since: while the job finishes, these alone cannot finish.
  std::unordered_set<std::string> unstepped_joiners_;
  // Trainers removed from the job whose exit their node has not reported: id -> node.
  std::map<std::string, std::string> leaving_;
  // Nodes whose joiner was refused (RefuseJoiner): node -> why; no joiner goes there meanwhile.
  std::map<std::string, std::string> refused_nodes_;
  bool done_ = false;
  uint64_t next_trainer_seq_ = 1;
  int64_t generation_floor_ =
      0;                     // numbers issued by earlier servers (Restore) or seen in the store
  bool stopping_ = false;    // Stop() committed the stop generation: no more changes
  bool recovering_ = false;  // restored; waiting for the current members' nodes (Restore)
  std::vector<Action> actions_;
};

// Most trainers a job keeps as leaving: a node that never reports their exits cannot grow the set
// without bound (past it, one is forgotten per new one; its late reports are refused and logged).
constexpr size_t kMaxLeavingTrainers = kMaxLeavingKept;

}  // namespace edl::jobserver
