#include "jobserver/policy/goodput_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

ThroughputParams Params() {
  ThroughputParams p;
  p.grad_fixed_s = 0.02;
  p.grad_per_sample_s = 0.001;
  p.intra_fixed_s = 0.01;
  p.intra_per_trainer_s = 0.002;
  p.inter_fixed_s = 0.05;
  p.inter_per_trainer_s = 0.01;
  p.overlap = 1;
  return p;
}

GoodputModel Model(double noise_scale) {
  GoodputModel m;
  m.throughput = Params();
  m.noise_scale = noise_scale;
  m.batch = {128, 4096, 16, 256};
  m.measured_trainers = 8;
  return m;
}

TEST(GoodputModelTest, StepTimeFollowsTheFormula) {
  const ThroughputParams p = Params();
  // One trainer: compute only.
  EXPECT_DOUBLE_EQ(StepSeconds(p, 1, 1, 100, 0), 0.02 + 0.1);
  // One node, 4 trainers, overlap 1: compute + all-reduce (0.01 + 0.002 * 2).
  EXPECT_NEAR(StepSeconds(p, 1, 4, 100, 0), 0.12 + 0.014, 1e-12);
  // Two nodes, 8 trainers: the inter-node terms (0.05 + 0.01 * 6).
  EXPECT_NEAR(StepSeconds(p, 2, 8, 100, 0), 0.12 + 0.11, 1e-12);
  // Accumulation adds whole compute passes.
  EXPECT_NEAR(StepSeconds(p, 2, 8, 100, 2), 2 * 0.12 + 0.12 + 0.11, 1e-12);
  // A large overlap hides the smaller term: close to the max.
  ThroughputParams q = p;
  q.overlap = 10;
  EXPECT_NEAR(StepSeconds(q, 2, 8, 100, 0), 0.12 * std::pow(1 + std::pow(0.11 / 0.12, 10), 0.1),
              1e-12);
  EXPECT_LT(StepSeconds(q, 2, 8, 100, 0), 0.12 + 0.11);
  EXPECT_GT(StepSeconds(q, 2, 8, 100, 0), 0.12);
}

TEST(GoodputModelTest, EfficiencyIsOneAtTheBaseBatchAndFallsWithLargerOnes) {
  EXPECT_DOUBLE_EQ(Efficiency(1000, 128, 128), 1.0);
  EXPECT_LT(Efficiency(1000, 128, 1024), 1.0);
  EXPECT_DOUBLE_EQ(Efficiency(1000, 128, 1024), (1000.0 + 128) / (1000 + 1024));
  // No gradient noise: a larger batch buys nothing per step, so each sample is worth M0 / M.
  EXPECT_DOUBLE_EQ(Efficiency(0, 128, 512), 0.25);
  // A large noise scale makes large batches almost free.
  EXPECT_GT(Efficiency(1e9, 128, 4096), 0.999);
}

TEST(GoodputModelTest, BestBatchStaysWithinTheLimitsAndFollowsTheNoiseScale) {
  for (double phi : {0.0, 100.0, 1e4, 1e9}) {
    for (int n : {1, 2, 4, 8, 16}) {
      const GoodputModel m = Model(phi);
      const BatchChoice c = BestBatch(m, (n + 3) / 4, n);
      SCOPED_TRACE("phi " + std::to_string(phi) + " n " + std::to_string(n));
      ASSERT_GT(c.goodput, 0);
      EXPECT_GE(c.local_batch, m.batch.min_local);
      EXPECT_LE(c.local_batch, m.batch.max_local);
      EXPECT_LE(c.total_batch, m.batch.max_batch);
      EXPECT_GE(c.total_batch, m.batch.base_batch);
      EXPECT_EQ(c.total_batch, n * c.local_batch * (c.accum_steps + 1));
      EXPECT_DOUBLE_EQ(c.goodput, Goodput(m, (n + 3) / 4, n, c.local_batch, c.accum_steps));
    }
  }
  // Without noise a larger batch only costs time: the smallest; with much noise, the largest,
  // which spreads the all-reduce over more samples.
  EXPECT_EQ(BestBatch(Model(0), 1, 4).total_batch, 128);
  const BatchChoice big = BestBatch(Model(1e9), 1, 4);
  EXPECT_EQ(big.total_batch, 4096);
  EXPECT_EQ(big.accum_steps, 3);  // 1024 per trainer of at most 256: accumulation
  EXPECT_EQ(big.local_batch, 256);
}

TEST(GoodputModelTest, BestBatchIsZeroWhenNoBatchFitsTheTrainers) {
  GoodputModel m = Model(1000);
  m.batch.max_batch = 256;  // 32 trainers need at least 32 * 16 = 512
  EXPECT_EQ(BestBatch(m, 8, 32).goodput, 0);
  EXPECT_GT(BestBatch(m, 4, 16).goodput, 0);  // exactly 16 * 16 = 256
}

TEST(GoodputModelTest, FixedAndSmallestBatchSplitIntoMicroBatchesThatFit) {
  const BatchLimits b = {128, 4096, 16, 256};
  BatchChoice c = FixedBatch(b, 2048, 4);  // 512 each: 2 micro-batches of 256
  EXPECT_EQ(c.local_batch, 256);
  EXPECT_EQ(c.accum_steps, 1);
  EXPECT_EQ(c.total_batch, 2048);
  c = FixedBatch(b, 2048, 16);
  EXPECT_EQ(c.local_batch, 128);
  EXPECT_EQ(c.accum_steps, 0);
  c = SmallestBatch(b, 1);
  EXPECT_EQ(c.total_batch, 128);
  c = SmallestBatch(b, 32);  // the base batch is below 32 * 16
  EXPECT_EQ(c.local_batch, 16);
  EXPECT_EQ(c.total_batch, 512);
}

TEST(GoodputModelTest, FitRecoversTheParametersOfItsOwnModel) {
  ThroughputParams truth = Params();
  truth.overlap = 2;
  std::vector<StepMeasurement> points;
  for (int n : {1, 2, 4}) {  // one node
    for (double b : {32.0, 64.0, 128.0}) {
      points.push_back({1, n, b, StepSeconds(truth, 1, n, b, 0), 0});
    }
  }
  for (int n : {8, 16}) {  // across nodes
    for (double b : {32.0, 128.0}) {
      points.push_back({n / 4, n, b, StepSeconds(truth, n / 4, n, b, 0), 0});
    }
  }
  // The all-reduce time of a measurement is only used to split off compute time; give the part
  // the model would not hide.
  for (StepMeasurement& q : points) {
    q.sync_s = q.step_s - GradSeconds(truth, q.local_batch);
  }
  ThroughputParams fit;
  ASSERT_OK(FitThroughput(points, &fit));
  EXPECT_DOUBLE_EQ(fit.overlap, 2);
  EXPECT_NEAR(fit.grad_fixed_s, truth.grad_fixed_s, 1e-6);
  EXPECT_NEAR(fit.grad_per_sample_s, truth.grad_per_sample_s, 1e-8);
  for (const StepMeasurement& q : points) {
    EXPECT_NEAR(StepSeconds(fit, q.nodes, q.trainers, q.local_batch, 0), q.step_s, 1e-3 * q.step_s);
  }
}

TEST(GoodputModelTest, FitFromOneMeasurementSplitsComputeEvenlyAndAssumesNoAllReduce) {
  ThroughputParams fit;
  ASSERT_OK(FitThroughput({{1, 1, 64, 0.2, 0.0}}, &fit));
  EXPECT_NEAR(fit.grad_fixed_s, 0.1, 1e-12);
  EXPECT_NEAR(fit.grad_per_sample_s * 64, 0.1, 1e-12);
  EXPECT_EQ(SyncSeconds(fit, 4, 16), 0);  // nothing measured: optimistic
  // Measured within one node only: across nodes is taken as 1.1 times slower.
  ASSERT_OK(FitThroughput({{1, 1, 64, 0.2, 0.0}, {1, 4, 64, 0.3, 0.1}}, &fit));
  EXPECT_GT(SyncSeconds(fit, 1, 4), 0);
  EXPECT_NEAR(SyncSeconds(fit, 2, 4), 1.1 * SyncSeconds(fit, 1, 4), 1e-12);
}

TEST(GoodputModelTest, FitRefusesMeasurementsItCannotUse) {
  ThroughputParams fit;
  EXPECT_FALSE(FitThroughput({}, &fit).ok());
  EXPECT_FALSE(FitThroughput({{1, 1, 64, -0.2, 0.0}}, &fit).ok());
  EXPECT_FALSE(FitThroughput({{1, 1, 64, NAN, 0.0}}, &fit).ok());
  EXPECT_FALSE(FitThroughput({{2, 1, 64, 0.2, 0.0}}, &fit).ok());  // more nodes than trainers
  EXPECT_FALSE(FitThroughput({{1, 1, 0, 0.2, 0.0}}, &fit).ok());
}

TEST(GoodputModelTest, ContradictingBatchLimitsAreRefusedWithTheFix) {
  auto msg = [](const BatchLimits& b, int min_trainers) {
    const Status s = CheckBatchLimits("job x", b, min_trainers);
    EXPECT_FALSE(s.ok());
    return s.message();
  };
  EXPECT_OK(CheckBatchLimits("job x", {128, 4096, 16, 256}, 4));
  EXPECT_NE(msg({128, 4096, 300, 256}, 1).find("max_local 256 < min_local 300"), std::string::npos);
  EXPECT_NE(msg({512, 256, 16, 256}, 1).find("max_batch 256 < base_batch 512"), std::string::npos);
  EXPECT_NE(msg({0, 256, 16, 256}, 1).find("base_batch 0"), std::string::npos);
  EXPECT_NE(msg({128, 256, 0, 256}, 1).find("min_local 0"), std::string::npos);
  EXPECT_NE(msg({128, 256, 16, 256}, 32).find("lower min_trainers"), std::string::npos);

  GoodputModel m = Model(100);
  EXPECT_OK(CheckGoodputModel("job x", m, 1));
  m.throughput.overlap = 11;
  EXPECT_FALSE(CheckGoodputModel("job x", m, 1).ok());
  m = Model(-1);
  EXPECT_FALSE(CheckGoodputModel("job x", m, 1).ok());
  m = Model(100);
  m.reform_s = INFINITY;
  EXPECT_FALSE(CheckGoodputModel("job x", m, 1).ok());
  m = Model(100);
  m.throughput.grad_fixed_s = m.throughput.grad_per_sample_s = 0;  // a step that takes no time
  EXPECT_FALSE(CheckGoodputModel("job x", m, 1).ok());
}

}  // namespace
}  // namespace edl::jobserver
