// GoodputFeed (goodput_feed.h): a job's reports in, its goodput model out.
#include "jobserver/policy/goodput_feed.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace edl::jobserver {

void GoodputFeed::Batch(BatchPolicy policy, int64_t batch) {
  if (batch < 1 || (policy == policy_ && batch == batch_)) return;
  policy_ = policy;
  batch_ = batch;
  points_.clear();
}

double GoodputFeed::LocalBatch(int trainers) const {
  if (policy_ == BatchPolicy::kFixedLocal) return static_cast<double>(batch_);
  // The largest share sets the step: the remainder goes to the lowest ranks.
  return std::ceil(static_cast<double>(batch_) / trainers);
}

void GoodputFeed::Step(int nodes, int trainers, double compute_s_per_sample, double sync_s) {
  if (batch_ < 1 || nodes < 1 || trainers < nodes) return;
  if (!std::isfinite(compute_s_per_sample) || !(compute_s_per_sample > 0)) return;
  if (trainers == 1) sync_s = 0;  // nothing to all-reduce
  if (!std::isfinite(sync_s) || sync_s < 0) return;
  const double local = LocalBatch(trainers);  // >= 1
  Point p;
  p.m.nodes = nodes;
  p.m.trainers = trainers;
  p.m.local_batch = local;
  p.m.sync_s = sync_s;
  p.m.step_s = compute_s_per_sample * local + sync_s;
  p.seen = ++steps_seen_;
  points_[{nodes, trainers}] = p;
  if (points_.size() > kMaxPoints) {
    auto oldest = std::min_element(
        points_.begin(), points_.end(),
        [](const auto& a, const auto& b) { return a.second.seen < b.second.seen; });
    points_.erase(oldest);
  }
}

void GoodputFeed::NoiseScale(double samples) {
  if (std::isfinite(samples) && samples >= 0) noise_scale_ = samples;
}

void GoodputFeed::Reform(double cost_s) {
  if (!std::isfinite(cost_s) || cost_s < 0) return;
  reforms_.push_back(cost_s);
  if (reforms_.size() > kReformSamples) reforms_.pop_front();
}

bool GoodputFeed::Model(int max_trainers, GoodputModel* out, std::string* why) const {
  if (batch_ < 1) {
    *why = "no trainer has reported its batch yet";
    return false;
  }
  if (points_.empty()) {
    *why = "no step time measured yet";
    return false;
  }
  if (policy_ == BatchPolicy::kFixedLocal && noise_scale_ < 0) {
    *why = "no gradient noise scale yet (its batch grows with its trainers)";
    return false;
  }
  std::vector<StepMeasurement> points;
  const StepMeasurement* largest = nullptr;
  for (const auto& [key, p] : points_) {
    points.push_back(p.m);
    if (largest == nullptr || p.m.trainers > largest->trainers) largest = &p.m;
  }
  GoodputModel m;
  if (Status s = FitThroughput(points, &m.throughput); !s.ok()) {
    *why = "its step times do not fit: " + s.message();
    return false;
  }
  const int b = static_cast<int>(std::min<int64_t>(batch_, std::numeric_limits<int>::max() / 2));
  if (policy_ == BatchPolicy::kFixedLocal) {
    m.batch.base_batch = b;
    m.batch.max_batch = static_cast<int>(
        std::min<int64_t>(int64_t{b} * std::max(1, max_trainers), std::numeric_limits<int>::max()));
    m.batch.min_local = m.batch.max_local = b;
    m.noise_scale = noise_scale_;
  } else {
    m.batch.base_batch = m.batch.max_batch = b;
    m.batch.min_local = 1;
    m.batch.max_local = b;
    m.noise_scale = std::max(0.0, noise_scale_);  // E(M) = 1 whatever it is: M never changes
  }
  m.batch.max_accum_steps = 0;
  m.measured_trainers = largest->trainers;
  if (reforms_.empty()) {
    m.reform_s = kPriorReformSteps * largest->step_s;
  } else {
    double sum = 0;
    for (double r : reforms_) sum += r;
    m.reform_s = sum / static_cast<double>(reforms_.size());
  }
  *out = m;
  return true;
}

}  // namespace edl::jobserver
