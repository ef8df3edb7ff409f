// The trace simulator behind bench/scheduler_trace.sh: replays a job trace through the real
// jobserver::ClusterPolicy on a simulated clock, with simulated trainers whose progress follows a
// documented throughput model, and reports pending time, job completion time, makespan and slot
// utilisation. Nothing here touches sockets, threads or the wall clock, so a run is a pure function
// of the trace and the options (same numbers on every machine).
//
// Throughput model (ThroughputModel): a job on n trainers processes n^alpha units of work per
// second (alpha < 1: sub-linear, as the all-reduce and the smaller per-trainer share of each step
// cost more as a job grows; alpha = 0.9 gives 1.87x for 2x trainers and 42x for 64). A job's work
// is its duration at its requested size times requested^alpha. A job makes no progress for
// `start_s` after it starts (model and data loading; the same for every variant) and for
// `reform_s` after every change of size (the survivors re-form and sync state, joiners load);
// it holds its slots meanwhile, so re-forms cost utilisation too.
//
// Trace (GenerateTrace): the shape published cluster-trace studies report for shared GPU training
// clusters (Microsoft's Philly, SenseTime's Helios): most jobs are small and short, and a few
// large, long jobs take most of the trainer-time. Concretely, with a fixed seed:
//  - requested trainers: 1, 2, 4, 8, 16, 32, 64 with probabilities
//    .32 .20 .16 .14 .09 .06 .03;
//  - duration at the requested size: log-normal, median 15 min x (1 + log2(size) / 2) (larger jobs
//    run longer), sigma 1.3 (heavy tail), clipped to 2 min .. 24 h;
//  - arrivals: a Poisson process, mean gap `mean_interarrival_s`;
//  - 85 % elastic with min = ceil(size / 2) and max = min(2 x size, 64); 15 % restart mode at the
//    requested size;
//  - priority 1 (75 %), 2 (20 %) or 5 (5 %).
// Random numbers come from std::mt19937_64 (whose output the standard fixes) through our own
// uniform and Box-Muller transforms, so the trace does not depend on the standard library.
//
// Variants, on the same trace:
//  - static: every job restart mode at its requested size, FIFO, no preemption, through the
//    policy (a job that does not fit blocks the queue behind it);
//  - static_easy: every job at its requested size, FIFO with EASY backfilling (Lifka 1995; what
//    Slurm's backfill scheduler does): when the queue's head does not fit it gets a reservation at
//    the earliest time enough slots free up, and a later job starts now if it fits and either ends
//    by then or uses only slots the head will not need. Run times are known exactly (the
//    reference's best case: real estimates are padded). Its own loop, not the policy; slots are
//    one pool, as the policy places a job's trainers on any nodes with free slots;
//  - elastic: jobs as traced, started at min and grown into free slots, never shrunk for others;
//  - full: the whole policy (priority preemption toward min, fair share, rate limit).
// The elastic variants may run an elastic job above its requested size (up to max = 2 x
// requested): headroom the static variants, at the requested size, never use.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::schedsim {

struct TraceJob {
  std::string name;
  int64_t arrival_us = 0;
  int requested = 1;     // trainers asked for; the static variant runs the job at this size
  int min = 1, max = 1;  // elastic bounds (min == max == requested in restart mode)
  int priority = 1;
  bool elastic = true;
  double duration_s = 0;  // run time at `requested` trainers, start-up excluded
};

struct TraceOptions {
  uint64_t seed = 13;
  int jobs = 200;
  double mean_interarrival_s = 60;
  int max_trainers = 64;  // sizes are clipped to this (the cluster's slots bound a job)
};

std::vector<TraceJob> GenerateTrace(const TraceOptions& options);

struct ThroughputModel {
  double alpha = 0.9;
  double start_s = 30;
  double reform_s = 30;
  double Speed(int n) const;  // work units per second on n trainers
};

enum class Variant { kStatic, kStaticEasy, kElastic, kFull };
const char* VariantName(Variant v);

struct SimOptions {
  Variant variant = Variant::kFull;
  int nodes = 64;
  int slots_per_node = 8;
  int64_t min_change_interval_us = 120'000'000;
  ThroughputModel model;
  // When set, the policy's decision log as JSON lines (PolicyEvent::ToJson plus "variant").
  std::ostream* event_log = nullptr;
};

struct JobOutcome {
  int64_t arrival_us = 0, start_us = -1, finish_us = -1;
  int resizes = 0;
};

struct SimResult {
  std::vector<JobOutcome> jobs;  // in trace order
  double mean_pending_s = 0;     // first start - arrival
  double mean_jct_s = 0;         // finish - arrival
  double makespan_s = 0;         // last finish - first arrival
  double utilisation = 0;        // slot-seconds held by jobs / (slots x makespan)
  int64_t resizes = 0;           // size changes of running jobs (each costs reform_s)
  int64_t policy_events = 0;
  int64_t steps = 0;  // simulated instants at which something happened
  int max_used_slots = 0;
};

// Runs the trace to the end. Checks the policy's invariants and the slot count at every step:
// Internal on any violation, FailedPrecondition when jobs can never finish (one larger than the
// cluster).
Status Simulate(const std::vector<TraceJob>& trace, const SimOptions& options, SimResult* out);

// The offered load: requested trainer-seconds / (slots x span of arrivals).
double OfferedLoad(const std::vector<TraceJob>& trace, int total_slots);

}  // namespace edl::schedsim
