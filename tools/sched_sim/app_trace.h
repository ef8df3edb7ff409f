// AppTrace: one training application as measured (tools/sched_sim/data/pollux/README.md): how long
// a step takes on each placement and micro-batch, how its gradient statistics evolve per epoch at
// each batch size, and how much progress each epoch is. The trace replay (replay.h) moves its
// simulated jobs by these measurements: they are the ground truth that a job's fitted goodput
// model (jobserver/policy/goodput_model.h) only estimates.
//
// Step time, for a placement (trainers per node) and a micro-batch b:
//  - a placement measured as such (placements.csv: up to 4 nodes) is interpolated linearly in b
//    between its measured micro-batches (clamped at the ends). The file keys a placement by its
//    digits in ring order, rotated to the lexicographically smallest (a ring has no first node),
//    and so does the lookup;
//  - any other placement (more nodes or trainers than measured as such) is interpolated linearly
//    on the grid of (nodes, trainers) pairs that placements.csv (averaged over placements of the
//    same pair) and scalability.csv (6 to 16 nodes) measured: in b on each pair, then in
//    trainers between the pairs of one node count, then between node counts (clamped at every
//    end; more than 16 nodes count as 16).
// Gradient statistics at total batch M in epoch e: linear between the validated batch sizes
// around M (validation-<M>.csv), clamped to the smallest and largest.
// Progress: a job's progress counts steps at the base batch M0 (the smallest validated batch):
// a step at batch M makes gain(M) = (var + sqr) / (var * M0 / M + sqr) of them (the statistical
// efficiency E(M) = gain * M0 / M, jobserver/policy/goodput_model.h, with noise scale M0 * var /
// sqr). Epoch e ends at progress EpochEnd(e), the least any batch size's file records for it; a job
// completes at the end of epoch max_epochs - 1 (applications.csv).
//
// Thread-safety: immutable after Load; const methods may be called from any thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "jobserver/policy/goodput_model.h"

namespace edl::schedsim {

// One line of applications.csv.
struct AppSettings {
  std::string name;
  int max_epochs = 0;     // a job completes after this many epochs
  int max_local_bsz = 0;  // the most a trainer's memory holds; 0: the largest measured
};

struct StepTime {
  double step_s = 0;  // a plain step (no accumulation)
  double sync_s = 0;  // its all-reduce not hidden by the backward pass
};

struct GradStats {
  double sqr = 0;  // |E[g]|^2 estimate
  double var = 0;  // variance of a base-batch gradient
};

class AppTrace {
 public:
  // Reads <dir>/traces/<name>/placements.csv, scalability.csv and validation-<M>.csv. Every
  // error names the file (and line) and the fix: missing columns, negative or zero times, a
  // sync time above its step time, epochs fewer than max_epochs, a validation file name that is
  // not validation-<positive integer>.csv, contradicting batch bounds.
  static Status Load(const std::string& dir, const AppSettings& settings, AppTrace* out);

  const std::string& name() const { return settings_.name; }
  int max_epochs() const { return settings_.max_epochs; }
  // base_batch = the smallest validated batch, max_batch = the largest; min_local and max_local
  // = the smallest and largest measured micro-batch (max_local from applications.csv if set).
  const jobserver::BatchLimits& limits() const { return limits_; }

  // REQUIRES: per_node holds at least one positive count.
  StepTime Step(const std::vector<int>& per_node, double local_batch) const;
  // Seconds of one step with `accum_steps` extra micro-batches.
  double StepSeconds(const std::vector<int>& per_node, int local_batch, int accum_steps) const;
  GradStats Grad(double total_batch, int epoch) const;
  // Progress (base-batch steps) a step at total batch M makes in epoch `epoch`.
  double Gain(double total_batch, int epoch) const;
  // Progress at the end of epoch `epoch` (0-based).
  double EpochEnd(int epoch) const { return epoch_end_[epoch]; }

 private:
  struct Point {
    double b, step, sync;
  };
  using Curve = std::vector<Point>;  // by micro-batch, ascending
  static StepTime AlongBatch(const Curve& c, double b);
  StepTime OnGrid(int nodes, int trainers, double b) const;
  StepTime AtNodes(const std::map<int, Curve>& by_trainers, int trainers, double b) const;
  Status LoadSteps(const std::string& dir);
  Status LoadValidation(const std::string& dir);

  AppSettings settings_;
  jobserver::BatchLimits limits_;
  std::map<std::string, Curve> by_placement_;    // ring key -> curve
  std::map<int, std::map<int, Curve>> by_size_;  // nodes -> trainers -> curve
  std::map<int, std::vector<GradStats>> grad_;   // validated batch -> per epoch
  std::vector<double> epoch_end_;                // per epoch
};

// The ring key of a placement: its non-zero counts as digits, rotated to the smallest string; ""
// when a count exceeds 9 (no such placement is measured).
std::string RingKey(const std::vector<int>& per_node);

// Reads <dir>/applications.csv and each application's traces.
Status LoadApps(const std::string& dir, std::map<std::string, AppTrace>* out);

}  // namespace edl::schedsim
