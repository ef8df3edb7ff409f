// What a job measures of itself while it trains (docs/ARCHITECTURE.md, "What a job measures of
// itself"): its gradient noise scale, from two squared norms the data-parallel step has anyway,
// and its step time split into compute and all-reduce. Both travel in the trainers' progress
// reports, for `edl ctl status`, /metrics and a goodput-aware policy.
//
// The gradient noise scale. A step of a world of n >= 2 ranks with samples yields two squared
// norms of one step's gradient: |g_i|^2 of each rank's own mean gradient over its b_i samples
// (summed over the ranks in one extra in-band word of the gradient all-reduce), and |g_B|^2 of
// the all-reduced mean gradient over all B = sum b_i samples. With G the true gradient and Sigma
// the per-sample gradient covariance, E|g_b|^2 = |G|^2 + tr(Sigma) / b for a mean over b samples,
// so with A = mean_i |g_i|^2 and h = mean_i 1 / b_i:
//   tr(Sigma) = (A - |g_B|^2) / (h - 1 / B),   |G|^2 = |g_B|^2 - tr(Sigma) / B,
// unbiased at every step, and noisy: each is smoothed by an exponential moving average (bias
// corrected, as Adam's moments are) and the noise scale B_noise = tr(Sigma) / |G|^2 is the ratio
// of the two averages (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018; the
// batch size past which a larger one buys little progress per sample). No extra pass over the
// data: one pass over the gradient before the all-reduce and one after, on the host.
//
// Thread-safety: none; the trainer's own thread.
#pragma once

#include <cstdint>
#include <vector>

namespace edl::runtime {

// An exponential moving average with Adam's bias correction: value() is the weighted mean of the
// values added so far, newer ones weighing more (weight `decay` per step of age).
class Ema {
 public:
  explicit Ema(double decay) : decay_(decay) {}
  void Add(double x);
  bool empty() const { return weight_ == 0; }
  double value() const;  // -1 when empty

 private:
  double decay_;
  double sum_ = 0, weight_ = 0;
};

class GradientNoise {
 public:
  // `decay`: the averages' weight per step of age (0.95: about the last 20 steps).
  explicit GradientNoise(double decay = 0.95) : sqr_(decay), var_(decay) {}

  // One step: `rank_samples` the samples of each rank that had some (b_i > 0), `sum_local_sq` the
  // sum over those ranks of |g_i|^2, `global_sq` |g_B|^2. False (nothing learned) when the step
  // cannot tell the two apart: fewer than two ranks with samples, or a value not finite or < 0.
  bool Add(const std::vector<int64_t>& rank_samples, double sum_local_sq, double global_sq);

  bool ready() const { return !sqr_.empty(); }
  int64_t steps() const { return steps_; }
  double grad_sqr() const { return sqr_.value(); }  // |G|^2; -1 before the first step
  double grad_var() const { return var_.value(); }  // tr(Sigma); -1 before the first step
  // tr(Sigma) / |G|^2, in samples; -1 before the first step or while |G|^2 is not above 0 (the
  // noise swamps the signal: the estimate is not yet meaningful).
  double noise_scale() const;

 private:
  Ema sqr_, var_;
  int64_t steps_ = 0;
};

}  // namespace edl::runtime
