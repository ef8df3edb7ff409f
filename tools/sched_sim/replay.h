// The trace replay behind bench/scheduler_trace.sh (docs/SCHEDULING.md): replays a workload
// (workload.h) on a simulated cluster of GPUs with jobs whose progress follows measured traces
// (app_trace.h), under one of four schedulers, and reports each job's completion time and the
// GPU time held. Nothing here touches sockets, threads or the wall clock: a run is a pure function
// of the files and the options.
//
// A job. Its progress is counted in steps at its application's base batch; it completes when it
// has made its application's max_epochs epochs of it. On trainers placed as `per_node` at
// micro-batch b with s accumulation steps (total batch M), it makes Gain(M, epoch) of progress per
// step of AppTrace::StepSeconds(per_node, b, s) seconds. It makes none while it starts
// (start_s after it goes from no trainers to some: process start, model and checkpoint load)
// and while it re-forms after any other change of its placement (ReplayOptions::reform), and it
// holds its GPUs meanwhile.
//
// Its batch. Under kGoodput the job adapts its batch as a Pollux-style agent does: once the stall
// of a new placement is over it measures the step and all-reduce time of the configuration it runs
// (from the trace), fits jobserver::FitThroughput to all it measured, and runs the batch
// jobserver::BestBatch picks for its placement (measuring that one too); it picks again on every
// new placement and every epoch. Before its first measurement it runs the smallest batch its
// limits allow. It reports its model (fit, gradient noise scale at its current batch and epoch,
// batch limits, re-form cost: EDL's grow steps at its current step time, or the fixed cost) to
// the policy (ClusterPolicy::ReportGoodput) after each of these. Under the other schedulers it
// runs the user's total batch from the workload, split over its trainers.
//
// Schedulers:
//  - kGoodput: jobserver::ClusterPolicy with PolicyKind::kGoodput. Every job elastic, 1 to
//    min(max_trainers, max_batch / min_local) trainers.
//  - kFairShare: ClusterPolicy as it is by default (weighted max-min on trainer counts); every
//    job elastic, 1 to the user's GPUs, at the user's batch.
//  - kTiresias: discretised two-queue least-attained-service (Tiresias, NSDI 2019), as its paper
//    describes it and the reference study ran it: every interval, jobs whose attained service
//    (GPUs x seconds run) reached `tiresias_threshold_gpu_s` move from the first queue to the
//    second; the first queue, then the second, each in order of entry, are walked and a job runs
//    when its GPUs fit in what is left (later smaller jobs may pass a larger one), else it is
//    preempted (it keeps its progress, and pays start_s when it resumes). A job runs at the
//    user's GPUs and batch; a job newly run gets the GPUs of the nodes with most free ones first.
//  - kEasy: FIFO with EASY backfilling at each arrival and completion (as tools/sched_sim.h's
//    static_easy: a later job starts if it fits now and either ends before the queue's head can
//    start or uses only GPUs the head will not need). Run times known exactly in advance (from
//    the trace, on the fewest nodes). User's GPUs and batch; placement as kTiresias.
// ClusterPolicy acts at each arrival and completion and every interval; kTiresias only every
// interval (a job arriving or finishing in between waits for it, as in the reference study).
//
// Invariants checked after every decision: no node holds more trainers than its GPUs, no job runs
// outside its bounds (Internal otherwise), and ClusterPolicy::CheckInvariants.
//
// Thread-safety: none needed; a Replay call owns everything it touches.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "edl/base/enum_names.h"
#include "edl/base/status.h"
#include "jobserver/policy/cluster_policy.h"
#include "tools/sched_sim/app_trace.h"
#include "tools/sched_sim/workload.h"

namespace edl::schedsim {

enum class Scheduler { kGoodput, kFairShare, kTiresias, kEasy };
inline constexpr EnumNames<Scheduler, 4> kSchedulerNames({"goodput", "fair", "tiresias", "easy"});

// What a change of a running job's placement costs.
enum class ReformCost {
  kSteps,  // EDL's in-place re-form: reform_grow_steps (a grow or a move) or reform_shrink_steps
           // of the new configuration's step time
  kFixed,  // reform_fixed_s (a restart from a checkpoint, as the reference study charges)
};
inline constexpr EnumNames<ReformCost, 2> kReformCostNames({"steps", "fixed"});

struct ReplayOptions {
  Scheduler scheduler = Scheduler::kGoodput;
  int nodes = 16;  // the reference study's cluster: 16 nodes of 4 GPUs
  int gpus_per_node = 4;
  double interval_s = 60;  // the scheduling period (the reference study's)
  double start_s = 30;     // stall when a job goes from no trainers to some
  ReformCost reform = ReformCost::kSteps;
  // EDL's measured re-form stalls, in steady steps (docs/BENCHMARKS.md, bench/rescale.sh: shrink
  // 0.93, grow 1.22 steps, medians of survivor stalls).
  double reform_grow_steps = 1.22;
  double reform_shrink_steps = 0.93;
  double reform_fixed_s = 30;
  // ClusterPolicy's per-job rate limit (kGoodput, kFairShare); 0: none.
  double min_change_interval_s = 0;
  jobserver::GoodputPolicyOptions goodput;
  // kGoodput: the most trainers a job may hold (the reference study's simulator allows 64).
  int max_trainers = 64;
  double tiresias_threshold_gpu_s = 16 * 3600.0;  // the reference study's queue threshold
  // When set, the policy's decision log as JSON lines (kGoodput, kFairShare).
  std::ostream* event_log = nullptr;
};

struct JobResult {
  std::string name;
  double arrival_s = 0, start_s = -1, finish_s = -1;
  double gpu_s = 0;       // GPU-seconds held
  int reallocations = 0;  // placement changes while running (starts not counted)
  int preemptions = 0;    // times it went back to no trainers
};

struct ReplayResult {
  std::vector<JobResult> jobs;  // in workload order
  Figures figures;
  int64_t reallocations = 0;
  int64_t preemptions = 0;
  int64_t decisions = 0;  // allocator calls
  double stall_s = 0;     // job-seconds without progress while holding GPUs (starts, re-forms)
};

// Replays `w` to the end. Internal on a broken invariant; FailedPrecondition when jobs can never
// finish; InvalidArgument for options out of range.
Status Replay(const Workload& w, const std::map<std::string, AppTrace>& apps,
              const ReplayOptions& options, ReplayResult* out);

}  // namespace edl::schedsim
