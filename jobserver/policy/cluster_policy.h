// ClusterPolicy: how one server shares one pool of nodes among many jobs (docs/ARCHITECTURE.md,
// "Many jobs: the cluster policy"). It is pure like a job's JobMembership (job_membership.h): no
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
//  3'. Goodput share (PolicyKind::kGoodput, the server's --policy goodput; docs/SCHEDULING.md).
//     Jobs whose goodput model was reported (ReportGoodput: throughput parameters, gradient noise
//     scale, batch limits, re-form cost; goodput_model.h) get the slots that step 3 leaves to
//     jobs without one, each slot to the job whose goodput it raises most: the pass maximises
//     sum_j w_j * (s_j^p - 1) / p over the jobs' speedups s_j = G_j(n_j) / G_j(fair) (G_j at the
//     best batch for n_j trainers on the fewest nodes; fair = the slots per running job), a power
//     mean with p = GoodputPolicyOptions::fairness_power < 1. The weight w_j is the priority,
//     tilted toward jobs with little attained service (trainer-seconds so far). A running job's
//     goodput at any size but its current one (or at its current size on fewer nodes) is charged
//     its re-form stall against the share of its life spent working (GoodputPolicyOptions::
//     min_horizon_s). Slots are given one chunk at a time (up to a node's worth, or up to the
//     job's current size), so a speedup that pays only past a node boundary is still seen; a
//     slot that raises no job's term stays free. A model is trusted up to explore_factor times
//     the most trainers it was measured at. Jobs without a model get their step-3 share (at most
//     probe_trainers) and the status says so (Summary "goodput"); rate-limited and restart-mode
//     jobs keep their size. Step 4 then places every job whose size changes anew on the fewest
//     nodes, largest first (a re-form moves its trainers anyway).
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
// ReportGoodput runs a pass only when it changes what the job may be given (its first model, or a
// larger size measured, which lifts its exploration bound); otherwise it records the model for
// the next pass (models come every few steps; re-planning on each would be churn).
//
// Every input is validated first; a refused input returns a Status naming the problem and the fix
// and changes nothing (no event either).
//
// Thread-safety: none; one owner (the server's io_context thread, or the simulator).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "edl/base/clock.h"
#include "edl/base/enum_names.h"
#include "edl/base/status.h"
#include "jobserver/policy/goodput_model.h"

namespace edl::jobserver {

// Bounds on what a submission or a node may declare (every field may come from a peer).
constexpr size_t kMaxPolicyNameBytes = 128;  // job, node and job-type names
constexpr size_t kMaxPolicyTypesPerNode = 64;
constexpr int kMaxJobTrainers = 65536;
constexpr int kMaxJobPriority = 1000;
constexpr size_t kMaxPolicyJobs = 10000;  // live (pending or running) jobs
constexpr size_t kMaxPolicyNodes = 100000;

// How step 3 shares the slots among elastic jobs (the server's --policy).
enum class PolicyKind {
  kFairShare,  // "fair": weighted max-min on trainer counts
  kGoodput,    // "goodput": step 3' for jobs with a goodput model, step 3 for the others
};
inline constexpr EnumNames<PolicyKind, 2> kPolicyKindNames({"fair", "goodput"});

// Step 3' (PolicyKind::kGoodput). The defaults are the ones docs/SCHEDULING.md reports on the
// measured workloads of tools/sched_sim.
struct GoodputPolicyOptions {
  // p of the power mean of the jobs' speedups the pass maximises; p < 1 (concave: a slot is worth
  // less to a job the faster it already runs), p = 0 the weighted geometric mean (log), more
  // negative is fairer (-1: harmonic). 0.5 leans toward throughput; the weights below carry the
  // fairness between short and long jobs.
  double fairness_power = 0.5;
  // A job's weight is its priority times (1 + s / service_scale_s)^-service_power, floored at
  // service_floor times its priority, where s is its attained service in trainer-seconds: jobs
  // that have had little service (most are short) go first, as least-attained-service schedulers
  // do, without a long job ever weighing less than the floor. service_power 0: priority only.
  double service_power = 0.5;
  double service_scale_s = 3600;
  double service_floor = 0.25;
  // A change of a running job is charged its re-form stall against the share of its life it has
  // spent working: its goodput at any new size counts max(H - R, 0) / (H + reform_s), where
  // H = max(its age since it started, min_horizon_s) and R the stalls its earlier changes cost. A
  // young job, or one re-formed often, must gain more to be changed again.
  double min_horizon_s = 300;
  // A model is trusted up to this many times the most trainers it was measured at: a job grows
  // past what it has run at in steps, so a model fitted on small sizes cannot send it far off.
  double explore_factor = 4;
  // A job without a model yet gets its fair share, but at most this many trainers (0: no bound):
  // it is measured small and grows by its model, rather than starting spread thin.
  int probe_trainers = 1;
};

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
  // Step 3 (fair share) or step 3' (goodput) for elastic jobs.
  PolicyKind kind = PolicyKind::kFairShare;
  GoodputPolicyOptions goodput;  // for kGoodput
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
  // The latest ReportGoodput; has_goodput false (and goodput ignored) until the job's model is
  // fitted (measured_trainers > 0).
  GoodputModel goodput;
  bool has_goodput = false;
  // G(n) for n = 0..max_trainers under `goodput` on nodes of curve_node_slots slots, -1 where
  // not computed yet (a cache of the goodput pass; empty when stale).
  std::vector<double> goodput_curve;
  int curve_node_slots = 0;
  // The re-form stalls its changes while running cost, by its reported reform_s at each.
  double reform_paid_s = 0;
  // Attained service: trainer-seconds held while running, up to service_at_us.
  double service_trainer_s = 0;
  int64_t service_at_us = -1;
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
  // The job's goodput model, from its trainers' step times and gradient statistics: the server
  // feeds what its trainers report (Cluster, through GoodputFeed: FitThroughput on their step and
  // all-reduce times, the noise scale from their gradient statistics, their re-form stalls);
  // tools/sched_sim feeds it from measured traces. Runs a pass when measured_trainers grows (see
  // above), else none. InvalidArgument for a model out of range or whose batch limits contradict
  // each other or the job's min_trainers (CheckGoodputModel), and nothing changes; NotFound for
  // an unknown job. measured_trainers 0 withdraws the job's model (whatever the rest holds; a
  // pass runs when it had one). Not saved by the server's state (models come again from the
  // trainers).
  Status ReportGoodput(const std::string& name, const GoodputModel& model);

  // Takes the decision log since the last call, in order.
  std::vector<PolicyEvent> TakeEvents();
  // The earliest time a Tick() may change something (a rate limit ending for a job the policy
  // would resize, a deadline); -1 when nothing is waiting on time.
  int64_t NextWakeupMicros() const;

  // ---- durable state (jobserver/state/STATE.md, "A cluster server")
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
  // Under PolicyKind::kGoodput, how an elastic job is sized: by its goodput model, or by fair
  // share while it has none (Summary's and `edl ctl status`'s "goodput"); "" otherwise.
  std::string GoodputNote(const PolicyJob& job) const;
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

  void BeginPass();      // snapshot sizes; clear the pass's reservations and notes
  void AccrueService();  // attained service up to now
  // Logs `kind` for job `name` (which must exist), frees its slots, forgets it and re-plans.
  void RemoveJob(const std::string& name, const char* kind, const char* reason);
  void RunPass();  // steps 1-4, deadlines, then one event per changed job
  bool Repair(PolicyJob* job);
  void Admit();
  // Takes `need` slots for `job` on nodes offering its type: free ones first, then (with
  // `may_reclaim`) by shrinking elastic jobs the policy may shrink for it. Changes nothing and
  // returns false when `need` cannot be met.
  bool Acquire(PolicyJob* job, int need, bool may_reclaim, const std::string& why);
  int Reclaimable(const PolicyJob& victim, const PolicyJob& beneficiary) const;
  std::vector<PolicyJob*> VictimsFor(const PolicyJob& job);
  // Steps 3, 3' and 4 (cluster_policy.cc; step 3' in cluster_policy_goodput.cc).
  struct Flex {  // an elastic job step 3 may resize, and its tentative share
    PolicyJob* job;
    int lo, hi, tent = 0;
    std::map<std::string, int> on;  // tentative placement
  };
  void FairShare();
  // The jobs the pass may resize, each at its lo, and what every node has left for them.
  std::vector<Flex> FlexJobs(std::map<std::string, int>* capacity);
  void MaxMinFill(std::vector<Flex>* flex, std::map<std::string, int>* capacity);
  // Step 3': jobs with a model take the slots `capacity` has left, by goodput. Adds to `moves`
  // the jobs that keep their size but gain enough from a more compact placement to pay a re-form.
  void GoodputFill(std::vector<Flex>* flex, std::map<std::string, int>* capacity,
                   std::set<const PolicyJob*>* moves);
  // Step 4 under kGoodput: every flexible job whose size changes, that starts or that is in
  // `moves` is placed anew, largest first, on the fewest nodes (a job that fits one node goes to
  // the fullest node it fits, the one it has most trainers on first): a re-form moves its
  // trainers anyway, and a compact job all-reduces faster. The others keep their placement.
  void ApplyPacked(std::vector<Flex>* flex, const std::set<const PolicyJob*>& moves);
  // G(n) under the job's model, 0 outside 0..max_trainers (cached in job->goodput_curve until
  // the next ReportGoodput or change of nodes).
  double CurveAt(PolicyJob* job, int n);
  // Gives one more tentative slot to `f` on the best node `capacity` has for it; false if none.
  bool TakeSlot(Flex* f, std::map<std::string, int>* capacity);
  // Step 4 under kFairShare: shrinks, then growth where the fill put it.
  void ApplyShares(std::vector<Flex>* flex);
  // The end of step 4: slots left free go to jobs below their bound, except (`goodput`) to jobs
  // the goodput fill sized: no slot raised their term.
  void FillFreeSlots(std::vector<Flex>* flex, bool goodput);
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
