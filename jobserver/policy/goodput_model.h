// The goodput model of one elastic training job (docs/SCHEDULING.md, "The goodput model"): how
// fast the job trains on n trainers spread over k nodes at a total batch M, and how much one
// sample at batch M is worth. The cluster policy ranks allocations with it (cluster_policy.h,
// PolicyKind::kGoodput), and a job, or the trace simulator standing in for one
// (tools/sched_sim/replay.h), picks its batch for an allocation with the same BestBatch.
//
// Throughput, seconds per optimizer step (b: per-trainer micro-batch, s: accumulation steps, so
// M = n * b * (s + 1)):
//   T_grad(b)    = a_c + b_c * b                              forward and backward of b samples
//   T_sync(k, n) = 0                                          n == 1
//                = a_r + b_r * max(n - 2, 0)                  k == 1 (every trainer on one node)
//                = a_n + b_n * max(n - 2, 0)                  k > 1
//   T_step       = s * T_grad + (T_grad^g + T_sync^g)^(1/g)   g in [1, 10]: how far the
//                                                             all-reduce overlaps the backward
// Statistical efficiency, from the gradient noise scale phi (in samples) and the base batch M0 the
// job's hyper-parameters were tuned at: one sample at batch M makes the progress of
//   E(M) = (phi + M0) / (phi + M)
// samples at M0 (E(M0) = 1; a small noise scale makes large batches wasteful).
// Goodput, progress in samples at the base batch per second:
//   G(k, n, M) = E(M) * M / T_step
// Speedups are ratios of goodputs, so the unit cancels.
//
// FitThroughput fits a_c..g to measured step and all-reduce times (its own procedure, below);
// phi comes from the trainers' gradient statistics: phi = M0 * var / sqr, where sqr estimates
// |E[g]|^2 and var the variance of one base-batch gradient.
//
// Thread-safety: values and pure functions.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::jobserver {

// T_step's parameters (see above), in seconds; every one >= 0, overlap in [1, 10].
struct ThroughputParams {
  double grad_fixed_s = 0;         // a_c
  double grad_per_sample_s = 0;    // b_c
  double intra_fixed_s = 0;        // a_r: all-reduce within one node
  double intra_per_trainer_s = 0;  // b_r
  double inter_fixed_s = 0;        // a_n: all-reduce across nodes
  double inter_per_trainer_s = 0;  // b_n
  double overlap = 1;              // g
};

// The batch sizes a job accepts: its adaptive bounds. Contradictions are refused by
// CheckBatchLimits.
struct BatchLimits {
  int base_batch = 0;  // M0: the total batch the job was tuned at; the smallest it runs
  int max_batch = 0;   // the largest total batch at which it still converges
  int min_local = 1;   // per-trainer micro-batch: the least that keeps a trainer busy
  int max_local = 0;   // the most that fits one trainer's memory (more: accumulation)
  // The most extra micro-batches per step the job runs: 0 for a job whose batch follows a fixed
  // rule (--batch_policy fixed-local or fixed-global: it never accumulates).
  int max_accum_steps = std::numeric_limits<int>::max();
};

// Everything the policy knows about one job's scaling (ClusterPolicy::ReportGoodput).
struct GoodputModel {
  ThroughputParams throughput;
  double noise_scale = 0;  // phi, samples; >= 0
  BatchLimits batch;
  // The most trainers a step time was measured at; 0: nothing measured, no model (the policy
  // then schedules the job by fair share). The policy trusts the model up to
  // GoodputPolicyOptions::explore_factor times this many trainers.
  int measured_trainers = 0;
  // Seconds without progress that a resize of this job costs (its measured re-form stall).
  double reform_s = 0;
};

// One measured configuration: a plain step (no accumulation).
struct StepMeasurement {
  int nodes = 1;
  int trainers = 1;
  double local_batch = 0;
  double step_s = 0;  // seconds per step
  double sync_s = 0;  // of which the all-reduce that the backward pass did not hide
};

// A batch for one allocation and the goodput it gives.
struct BatchChoice {
  double goodput = 0;   // 0: no batch within the limits fits this many trainers
  int local_batch = 0;  // micro-batch per trainer
  int accum_steps = 0;  // extra micro-batches per step (0: none)
  int total_batch = 0;  // trainers * local_batch * (accum_steps + 1)
};

double GradSeconds(const ThroughputParams& p, double local_batch);
double SyncSeconds(const ThroughputParams& p, int nodes, int trainers);
// T_step. REQUIRES: 1 <= nodes <= trainers.
double StepSeconds(const ThroughputParams& p, int nodes, int trainers, double local_batch,
                   int accum_steps);
// E(M); 1 when noise_scale is 0 and M == M0.
double Efficiency(double noise_scale, int base_batch, double total_batch);
// G for this exact batch configuration.
double Goodput(const GoodputModel& m, int nodes, int trainers, int local_batch, int accum_steps);

// The batch with the most goodput on `trainers` over `nodes`: among kBatchCandidates totals spaced
// geometrically from max(M0, trainers * min_local) to max_batch, each split into the fewest
// micro-batches of at most max_local per trainer (a split needing more than max_accum_steps extra
// micro-batches is left out). REQUIRES: 1 <= nodes <= trainers.
constexpr int kBatchCandidates = 32;
BatchChoice BestBatch(const GoodputModel& m, int nodes, int trainers);
// The batch a job without a model runs: the smallest its limits allow on `trainers`.
BatchChoice SmallestBatch(const BatchLimits& b, int trainers);
// A fixed total batch on `trainers`: the fewest micro-batches of at most max_local each.
BatchChoice FixedBatch(const BatchLimits& b, int total_batch, int trainers);

// OK when the limits hold together: 1 <= min_local <= max_local, 1 <= base_batch <= max_batch,
// min_local <= max_batch; and when `min_trainers` trainers can run a batch within them
// (min_trainers * min_local <= max_batch). The message names the contradiction and the fix;
// `what` names the job or file.
Status CheckBatchLimits(const std::string& what, const BatchLimits& b, int min_trainers);
// OK when every number of the model is finite and in range (and its batch limits hold for
// min_trainers).
Status CheckGoodputModel(const std::string& what, const GoodputModel& m, int min_trainers);

// Fits ThroughputParams to `points` (each a distinct configuration; at least one):
//  1. T_grad: compute time c = step - sync of every point against its micro-batch b, by least
//     squares on relative errors; with one micro-batch size only, a_c = b_c * b = c / 2 (nothing
//     tells the fixed part from the per-sample part: an even split).
//  2. For each overlap g on a grid from 1 to 10, the all-reduce time each multi-trainer point
//     implies, (step^g - T_grad^g)^(1/g), is fitted against max(n - 2, 0) by least squares,
//     separately within one node and across nodes; a kind with no point borrows the other's
//     (across nodes at 1.1 times the within-node figures: the slower link), and with neither the
//     all-reduce is free (optimistic: the policy bounds how far it trusts that, explore_factor).
//  3. The g whose model has the least root-mean-square error of log step time wins.
// InvalidArgument for an empty list or a point with a non-positive or non-finite time, a
// micro-batch below 1, or nodes outside 1..trainers.
Status FitThroughput(const std::vector<StepMeasurement>& points, ThroughputParams* out);

}  // namespace edl::jobserver
