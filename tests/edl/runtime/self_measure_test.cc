// The gradient noise scale estimate (edl/runtime/self_measure.h) on gradients drawn with a known
// true gradient G and covariance Sigma: it recovers |G|^2, tr(Sigma) and their ratio, with equal
// and with unequal per-rank batches, and refuses a step that cannot tell them apart.
#include "edl/runtime/self_measure.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace edl::runtime {
namespace {

// Per-sample gradients G + e, e ~ N(0, sigma^2 I) in `dim` dimensions: tr(Sigma) = dim sigma^2.
class Draw {
 public:
  Draw(int dim, double g, double sigma, uint64_t seed)
      : dim_(dim), g_(g), noise_(0.0, sigma), rng_(seed) {}
  // The mean gradient over `b` samples.
  std::vector<double> Mean(int64_t b) {
    std::vector<double> m(dim_, 0.0);
    for (int64_t s = 0; s < b; ++s) {
      for (int k = 0; k < dim_; ++k) m[k] += g_ + noise_(rng_);
    }
    for (double& v : m) v /= static_cast<double>(b);
    return m;
  }
  double true_sqr() const { return dim_ * g_ * g_; }
  double true_var() const { return dim_ * noise_.stddev() * noise_.stddev(); }

 private:
  int dim_;
  double g_;
  std::normal_distribution<double> noise_;
  std::mt19937_64 rng_;
};

double Sq(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

// `steps` steps of ranks with batches `b`: each rank's mean gradient and the all-reduced one,
// weighted by each rank's share, as the runtime forms them.
GradientNoise Train(Draw* d, const std::vector<int64_t>& b, int steps) {
  GradientNoise gn(0.999);
  int64_t total = 0;
  for (int64_t x : b) total += x;
  for (int t = 0; t < steps; ++t) {
    std::vector<double> global;
    double local_sq = 0;
    for (int64_t bi : b) {
      const std::vector<double> g = d->Mean(bi);
      local_sq += Sq(g);
      if (global.empty()) global.assign(g.size(), 0.0);
      for (size_t k = 0; k < g.size(); ++k) {
        global[k] += static_cast<double>(bi) / static_cast<double>(total) * g[k];
      }
    }
    EXPECT_TRUE(gn.Add(b, local_sq, Sq(global)));
  }
  return gn;
}

TEST(GradientNoiseTest, RecoversTheTrueGradientAndNoiseWithEqualBatches) {
  Draw d(/*dim=*/50, /*g=*/0.2, /*sigma=*/1.0, 7);  // |G|^2 = 2, tr(Sigma) = 50: B_noise 25
  const GradientNoise gn = Train(&d, {8, 8, 8, 8}, 4000);
  ASSERT_TRUE(gn.ready());
  EXPECT_EQ(gn.steps(), 4000);
  EXPECT_NEAR(gn.grad_sqr(), d.true_sqr(), 0.1 * d.true_sqr());
  EXPECT_NEAR(gn.grad_var(), d.true_var(), 0.05 * d.true_var());
  EXPECT_NEAR(gn.noise_scale(), 25.0, 2.5);
}

TEST(GradientNoiseTest, RecoversThemWithUnequalBatches) {
  Draw d(/*dim=*/40, /*g=*/0.5, /*sigma=*/0.5, 11);  // |G|^2 = 10, tr(Sigma) = 10: B_noise 1
  const GradientNoise gn = Train(&d, {3, 5, 16}, 4000);
  EXPECT_NEAR(gn.grad_sqr(), d.true_sqr(), 0.05 * d.true_sqr());
  EXPECT_NEAR(gn.grad_var(), d.true_var(), 0.1 * d.true_var());
  EXPECT_NEAR(gn.noise_scale(), 1.0, 0.12);
}

TEST(GradientNoiseTest, AStepThatCannotTellIsRefusedAndLeavesTheEstimate) {
  GradientNoise gn;
  EXPECT_FALSE(gn.Add({8}, 1.0, 1.0)) << "one rank: no second norm to compare";
  EXPECT_FALSE(gn.Add({}, 0.0, 0.0));
  EXPECT_FALSE(gn.Add({8, 0}, 1.0, 1.0)) << "a rank without samples is not one of them";
  EXPECT_FALSE(gn.Add({8, 8}, std::nan(""), 1.0));
  EXPECT_FALSE(gn.Add({8, 8}, 1.0, INFINITY));
  EXPECT_FALSE(gn.Add({8, 8}, -1.0, 1.0));
  EXPECT_FALSE(gn.ready());
  EXPECT_EQ(gn.noise_scale(), -1);
  EXPECT_EQ(gn.grad_sqr(), -1);
  // Noise only (G = 0): |G|^2 near 0 or below, so no ratio is claimed while it is not above 0.
  ASSERT_TRUE(gn.Add({8, 8}, 2.0, 0.5));  // tr(Sigma) = (1 - 0.5) / (1/8 - 1/16) = 8; |G|^2 = 0
  EXPECT_DOUBLE_EQ(gn.grad_var(), 8.0);
  EXPECT_DOUBLE_EQ(gn.grad_sqr(), 0.0);
  EXPECT_EQ(gn.noise_scale(), -1);
}

TEST(EmaTest, IsTheBiasCorrectedWeightedMean) {
  Ema e(0.5);
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.value(), -1);
  e.Add(4);
  EXPECT_DOUBLE_EQ(e.value(), 4);  // one value: itself, not 4 * (1 - 0.5)
  e.Add(1);
  EXPECT_DOUBLE_EQ(e.value(), (0.5 * 0.5 * 4 + 0.5 * 1) / (0.5 * 0.5 + 0.5));  // 2
}

}  // namespace
}  // namespace edl::runtime
