// GoodputFeed: what one running job's trainers report of themselves (their progress reports and
// re-form stalls, edl/proto/messages.h ProgressReport and trainer_events.h ev::Stall), turned into
// the goodput model the cluster policy ranks the job by (goodput_model.h,
// ClusterPolicy::ReportGoodput; docs/SCHEDULING.md, "Where a job's model comes from").
//
//  - Step times. Each world the job ran at (nodes, trainers) is one StepMeasurement: its
//    micro-batch by the job's batch policy, its compute time = the members' mean compute seconds
//    per sample times that micro-batch, its all-reduce = the members' mean all-reduce seconds
//    (none at one trainer). The latest report of a world replaces its point (the trainers' figures
//    are already smoothed); at most kMaxPoints worlds are kept, the least recently seen dropped.
//    FitThroughput fits the throughput parameters to them.
//  - Batch limits follow the batch policy the trainers run (BatchLimits, max_accum_steps 0):
//    fixed-local b: b on every trainer, the total n * b (base b, max b * the job's max trainers);
//    fixed-global B: the total B split (base = max = B, micro-batch 1..B). A change of the job's
//    batch drops every point (they timed another batch).
//  - The noise scale, from rank 0's report. A fixed-local job's total batch grows with its
//    trainers, so its model waits for one (a job whose gradients stay on a device never sends
//    one: it keeps its fair share). A fixed-global job's batch never changes, so its statistical
//    efficiency is 1 at every size and the noise scale does not matter.
//  - The re-form cost: the mean of the last kReformSamples planned re-forms' costs (a survivor's
//    stall less the evaluation inside it; failures are not the policy's choice and are left out);
//    until one is seen, kPriorReformSteps steps at the largest world measured.
//
// Every input is a typed value that was bounded where it was decoded; a non-finite or negative
// time is ignored here too, so a model is always one CheckGoodputModel accepts.
//
// Thread-safety: a value; not thread-safe (the Cluster that owns it is single-threaded).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "edl/base/batch_policy.h"
#include "jobserver/policy/goodput_model.h"

namespace edl::jobserver {

class GoodputFeed {
 public:
  static constexpr size_t kMaxPoints = 32;
  static constexpr size_t kReformSamples = 8;
  static constexpr double kPriorReformSteps = 2;

  // The job's batch as its trainers run it; a change drops the step times measured so far.
  void Batch(BatchPolicy policy, int64_t batch);
  // One world's smoothed figures, means over the members that reported in it: compute seconds per
  // sample, and all-reduce seconds per step (ignored at one trainer). REQUIRES: 1 <= nodes <=
  // trainers.
  void Step(int nodes, int trainers, double compute_s_per_sample, double sync_s);
  void NoiseScale(double samples);  // rank 0's estimate; ignored unless finite and >= 0
  void Reform(double cost_s);       // a planned re-form's cost; ignored unless finite and >= 0

  // The model when one can be built: true and *out set; false and *why saying what is missing.
  // `max_trainers`: the job's max, the largest world a fixed-local job's batch limits allow.
  bool Model(int max_trainers, GoodputModel* out, std::string* why) const;

 private:
  double LocalBatch(int trainers) const;

  BatchPolicy policy_ = BatchPolicy::kFixedLocal;
  int64_t batch_ = 0;  // 0: no report carried it yet
  struct Point {
    StepMeasurement m;
    uint64_t seen = 0;  // when last replaced, in Step() calls
  };
  std::map<std::pair<int, int>, Point> points_;  // by (nodes, trainers)
  uint64_t steps_seen_ = 0;
  double noise_scale_ = -1;
  std::deque<double> reforms_;
};

}  // namespace edl::jobserver
