// ClusterPolicy: how one server shares one pool of nodes among many jobs (docs/ARCHITECTURE.md,
// "Many jobs: the cluster policy"). It is pure like the per-job Scheduler (scheduler.h): no
// sockets, no threads, no wall clock (time comes from an injected Clock), so every decision can be
// unit-tested with a ManualClock and replayed by the trace simulator (tools/sched_sim.h).
//
// Inputs: nodes join (slots, and the job types the node's own configuration offers) or are lost;
// jobs are submitted (name, type, min/max trainers, priority, elastic or restart mode, optional
// deadline), scaled (a cap within min..max), finished or cancelled; time passes (Tick).
// Outputs: a target placement per job (trainers per node), and a decision log: every change is a
// PolicyEvent that names its reason.
//
// The policy, applied after every input (one "pass"):
//  1. Repair. A running job that a lost node left below its min (or, in restart mode, below its
//     fixed size) first takes free slots, then reclaims from elastic jobs as in 2. The repair is
//     exempt from the rate limit (the loss already forced a re-form). If it cannot be repaired the
//     job is requeued: all its trainers are released and it is pending again ("requeue").
//  2. Admission (gang start). Pending jobs are considered by priority (higher first), then deadline
//     (earlier first; none last), then submission order; with `priority_order` off, in submission
//     order only (FIFO). A job starts only when its min trainers (a restart-mode job: its fixed
//     size) fit at once on nodes offering its type. With `preempt` on, a pending job may shrink
//     running elastic jobs of lower or equal priority toward their min to make room, never below
//     min, and only jobs the rate limit lets change; lowest priority first, then the job furthest
//     above its fair share. It shrinks nobody unless it then fits. Equal priority counts so that a
//     job arriving at a full cluster of its peers gets its min (and then its share) instead of
//     waiting for one of them to finish; a lower-priority job never shrinks a higher one.
//     A job that cannot start now but could on the live nodes blocks the queue behind it: later
//     jobs that could use any of its nodes wait ("queued behind X"), and it reserves the free slots
//     it will need, so neither they nor growth take them (no starvation of large jobs).
//     A job whose type no live node offers, or that needs more slots than all the nodes offering
//     its type have together, stays pending with that reason and blocks nobody.
//  3. Fair share. The slots left (after restart-mode jobs, jobs the rate limit holds at their size,
//     and reservations) are divided among elastic jobs by weighted max-min fairness with weight =
//     priority: each job starts at its min (without `preempt`, at its current size: nothing
//     shrinks for fairness), and each further slot goes to the job with the lowest size/priority,
//     ties to the higher priority, then to the older job, up to min(max, scale cap). So free slots
//     go first to the more important jobs and are then shared in proportion to priority.
//  4. Apply. Jobs above their share shrink (in place: survivors keep running), then jobs below it
//     grow into free slots, preferring nodes they already use. A job just admitted starts directly
//     at its share, so a start is never followed at once by a re-form.
//  5. Teachers (docs/CLUSTER.md "Teacher services on a cluster": teachers run on whatever capacity
//     is free). The slots no job holds after the pass (FreeSlotsByNode) are where the server runs
//     distillation teachers, one slot each (ServicePlacer::SetCapacity). Teachers are invisible to
//     steps 1-4, so they are the lowest priority: a pending or growing job takes a slot a teacher
//     uses as a free one, before any job is shrunk, and that teacher is stopped; it is placed again
//     when a slot frees up.
//  Restart-mode (non-elastic) jobs are placed at a fixed size (min == max) and never resized.
//  Rate limit: a job that started or changed size less than `min_change_interval_us` ago is not
//  resized by the policy (0: no limit). Node loss and its repair are not policy choices and are not
//  held back. A deadline only orders admission and is logged when it passes ("deadline_passed").
//
// Invariants after every call (CheckInvariants): no node holds more trainers than its slots; every
// trainer is on a live node that offers its job's type; a running elastic job holds between min
// and max trainers, a restart-mode job exactly its size, a pending job none.
//
// Every input is validated first; a refused input returns a Status naming the problem and the fix
// and changes nothing (no event either).
//
// Thread-safety: none; one owner (the server's io_context thread, or the simulator).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"

namespace edl::jobserver {

// Bounds on what a submission or a node may declare (every field may come from a peer).
constexpr size_t kMaxPolicyNameBytes = 128;  // job, node and job-type names
constexpr size_t kMaxPolicyTypesPerNode = 64;
constexpr int kMaxJobTrainers = 65536;
constexpr int kMaxJobPriority = 1000;
constexpr size_t kMaxPolicyJobs = 10000;  // live (pending or running) jobs
constexpr size_t kMaxPolicyNodes = 100000;

struct ClusterPolicyOptions {
  // A job is resized by the policy at most once per this interval (the server's
  // --min_change_interval_s); 0: no limit.
  int64_t min_change_interval_us = 0;
  // Pending jobs may shrink running elastic jobs of lower or equal priority toward their min, and
  // jobs above their fair share shrink for the others. Off: slots move only when they are free.
  bool preempt = true;
  // Admission by priority, then deadline, then submission order. Off: submission order (FIFO).
  bool priority_order = true;
  // Job types the cluster knows before any node declares them (the server's configuration). A
  // type declared by any node that ever joined is known too. A submission naming a type that is
  // not known is refused.
  std::set<std::string> known_types;
};

struct PolicyNode {
  std::string name;
  int slots = 0;
  std::set<std::string> job_types;  // the types this node's configuration can run
};

struct JobSubmission {
  std::string name;
  std::string type;
  int min_trainers = 1;
  int max_trainers = 1;
  int priority = 1;         // 1..kMaxJobPriority, larger is more important; the fair-share weight
  bool elastic = true;      // false: restart mode, fixed size, which needs min == max
  int64_t deadline_us = 0;  // on the policy's clock; 0: none
};

enum class JobPhase { kPending, kRunning };

// Trainers per node, only nodes with at least one.
using Placement = std::map<std::string, int>;

struct PolicyJob {
  JobSubmission spec;
  JobPhase state = JobPhase::kPending;
  Placement placement;
  int size = 0;                // trainers in `placement`
  int cap = 0;                 // the scale request (min..max); starts at max
  std::string pending_reason;  // why a pending job is not running (empty while running)
  int64_t submitted_us = 0;
  int64_t started_us = -1;  // the latest start; -1 while never started
  int64_t last_change_us = -1;
  uint64_t seq = 0;  // submission order
  bool deadline_reported = false;
  std::string pending_code;  // the kind of pending_reason, so a repeat is not logged again
};

struct PolicyEvent {
  int64_t time_us = 0;
  // submit, start, grow, shrink, requeue, pending, scale, finish, cancel, deadline_passed,
  // node_added, node_lost.
  std::string kind;
  std::string job;   // empty for node events
  std::string node;  // node events
  int from = 0;      // job size before and after
  int to = 0;
  Placement placement;  // the job's placement after the change
  std::string reason;
  nlohmann::json ToJson() const;
};

class ClusterPolicy {
 public:
  // `clock` is not owned and must outlive the policy.
  ClusterPolicy(ClusterPolicyOptions options, Clock* clock);

  // ---- inputs; each runs a pass. A refused input changes nothing.
  Status AddNode(const PolicyNode& node);  // AlreadyExists for a live node's name
  Status NodeLost(const std::string& name);
  Status Submit(const JobSubmission& job);
  // A user's request for `n` trainers (min <= n <= max) of an elastic job: the job grows to at
  // most n, and shrinks to n (when the rate limit allows).
  Status Scale(const std::string& name, int n);
  Status Finish(const std::string& name);  // the job's trainers completed
  Status Cancel(const std::string& name);  // a user stopped it (pending or running)
  void Tick();                             // time passed: rate limits expire, deadlines pass

  // Takes the decision log since the last call, in order.
  std::vector<PolicyEvent> TakeEvents();
  // The earliest time a Tick() may change something (a rate limit ending for a job the policy
  // would resize, a deadline); -1 when nothing is waiting on time.
  int64_t NextWakeupMicros() const;

  // ---- durable state (jobserver/STATE.md, "A cluster server")
  // Resumes a policy saved by an earlier server, without a pass: `nodes` in their join order;
  // `jobs` with spec, state, placement, cap and seq (size and times are recomputed: a running job
  // counts as changed now, so the rate limit starts over). Corruption, and nothing kept, when they
  // break an invariant below (e.g. more trainers on a node than its slots).
  Status Restore(const std::vector<PolicyNode>& nodes, const std::vector<PolicyJob>& jobs);

  // ---- state
  const PolicyJob* Find(const std::string& name) const;
  const std::map<std::string, PolicyJob>& jobs() const { return jobs_; }
  int total_slots() const;
  int used_slots() const;
  // Free slots on the live nodes that offer `type`.
  int FreeSlots(const std::string& type) const;
  // Slots no job holds, per live node (every node listed, 0 when full): the teachers' capacity
  // (step 5; cluster_policy_teachers.cc).
  std::map<std::string, int> FreeSlotsByNode() const;
  int pending_jobs() const;
  int running_jobs() const;
  // "job:n|job:n" over every job (pending ones at 0), by submission order: the monitor's column.
  std::string RunningTrainers() const;
  nlohmann::json Summary() const;
  // Internal if any invariant above does not hold (the tests and the simulator check after every
  // input).
  Status CheckInvariants() const;

 private:
  struct Node {
    int slots = 0;
    std::set<std::string> types;
    int used = 0;
    uint64_t order = 0;
  };

  void BeginPass();  // snapshot sizes; clear the pass's reservations and notes
  // Logs `kind` for job `name` (which must exist), frees its slots, forgets it and re-plans.
  void RemoveJob(const std::string& name, const char* kind, const char* reason);
  void RunPass();    // steps 1-4, deadlines, then one event per changed job
  bool Repair(PolicyJob* job);
  void Admit();
  // Takes `need` slots for `job` on nodes offering its type: free ones first, then (with
  // `may_reclaim`) by shrinking elastic jobs the policy may shrink for it. Changes nothing and
  // returns false when `need` cannot be met.
  bool Acquire(PolicyJob* job, int need, bool may_reclaim, const std::string& why);
  int Reclaimable(const PolicyJob& victim, const PolicyJob& beneficiary) const;
  std::vector<PolicyJob*> VictimsFor(const PolicyJob& job);
  void FairShare();
  void PlaceOn(PolicyJob* job, const std::string& node, int k);
  void RemoveFrom(PolicyJob* job, const std::string& node, int k);
  void Grow(PolicyJob* job, int k, const std::string& why);
  void Shrink(PolicyJob* job, int k, const std::set<std::string>* only_nodes,
              const std::string& why);
  void ReleaseAll(PolicyJob* job);
  int FreeOn(const std::string& node) const;  // free minus this pass's reservations
  bool Offers(const std::string& node, const std::string& type) const;
  int TypeCapacity(const std::string& type) const;
  bool RateLimited(const PolicyJob& job) const;
  int FixedSize(const PolicyJob& job) const { return job.spec.elastic ? 0 : job.spec.max_trainers; }
  int Floor(const PolicyJob& job) const {  // the least a running job may hold
    return job.spec.elastic ? job.spec.min_trainers : job.spec.max_trainers;
  }
  void SetPending(PolicyJob* job, const std::string& code, const std::string& reason);
  void Note(const std::string& job, const std::string& why);
  void EmitNodeEvent(const std::string& kind, const std::string& node, const std::string& reason);
  std::vector<PolicyJob*> Ordered(JobPhase state);

  const ClusterPolicyOptions options_;
  Clock* const clock_;  // not owned
  std::map<std::string, Node> nodes_;
  std::map<std::string, PolicyJob> jobs_;
  std::set<std::string> known_types_;
  uint64_t next_seq_ = 1;
  uint64_t next_node_order_ = 1;
  std::vector<PolicyEvent> events_;

  // Per pass: the free slots a blocked job holds for itself, the sizes and placements at the
  // start of the pass (to log one event per changed job), and the reasons noted for each change.
  std::map<std::string, int> reserved_;
  struct Before {
    bool running = false;
    int size = 0;
    Placement placement;
  };
  std::map<std::string, Before> before_;
  std::map<std::string, std::vector<std::string>> reasons_;
  std::set<std::string> exempt_;  // jobs whose change this pass is a repair (no rate limit)
};

}  // namespace edl::jobserver
