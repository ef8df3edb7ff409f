#include "edl/runtime/self_measure.h"

#include <cmath>

namespace edl::runtime {

void Ema::Add(double x) {
  sum_ = decay_ * sum_ + (1 - decay_) * x;
  weight_ = decay_ * weight_ + (1 - decay_);
}

double Ema::value() const { return weight_ > 0 ? sum_ / weight_ : -1; }

bool GradientNoise::Add(const std::vector<int64_t>& rank_samples, double sum_local_sq,
                        double global_sq) {
  if (rank_samples.size() < 2 || !std::isfinite(sum_local_sq) || !std::isfinite(global_sq) ||
      sum_local_sq < 0 || global_sq < 0) {
    return false;
  }
  double total = 0, inverse = 0;
  for (int64_t b : rank_samples) {
    if (b <= 0) return false;
    total += static_cast<double>(b);
    inverse += 1.0 / static_cast<double>(b);
  }
  const double n = static_cast<double>(rank_samples.size());
  const double mean_local = sum_local_sq / n, h = inverse / n;
  const double spread = h - 1.0 / total;  // > 0 for n >= 2
  if (!(spread > 0)) return false;
  const double var = (mean_local - global_sq) / spread;
  const double sqr = global_sq - var / total;
  var_.Add(var);
  sqr_.Add(sqr);
  ++steps_;
  return true;
}

double GradientNoise::noise_scale() const {
  if (!ready()) return -1;
  const double sqr = sqr_.value(), var = var_.value();
  return sqr > 0 && var >= 0 ? var / sqr : -1;
}

}  // namespace edl::runtime
