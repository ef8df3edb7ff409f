// GoodputFeed (jobserver/policy/goodput_feed.h): a job's reports in, the goodput model the cluster
// policy ranks it by out.
#include "jobserver/policy/goodput_feed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

constexpr int kMax = 8;

GoodputModel ModelOf(const GoodputFeed& f, int max_trainers = kMax) {
  GoodputModel m;
  std::string why;
  EXPECT_TRUE(f.Model(max_trainers, &m, &why)) << why;
  EXPECT_OK(CheckGoodputModel("feed", m, 1));
  return m;
}

std::string Missing(const GoodputFeed& f) {
  GoodputModel m;
  std::string why;
  EXPECT_FALSE(f.Model(kMax, &m, &why));
  return why;
}

// Step times of a job whose all-reduce costs 0.1 s + 0.05 s per trainer past two, on one node.
void Measure(GoodputFeed* f, int trainers, double local) {
  const double sync = trainers == 1 ? -1 : 0.1 + 0.05 * std::max(trainers - 2, 0);
  f->Step(1, trainers, (0.01 + 0.002 * local) / local, sync);
}

TEST(GoodputFeedTest, AFixedGlobalJobIsModelledFromItsStepTimesAlone) {
  GoodputFeed f;
  EXPECT_NE(Missing(f).find("batch"), std::string::npos) << Missing(f);
  f.Batch(BatchPolicy::kFixedGlobal, 64);
  EXPECT_NE(Missing(f).find("no step time"), std::string::npos) << Missing(f);
  Measure(&f, 2, 32);
  Measure(&f, 4, 16);
  const GoodputModel m = ModelOf(f);
  EXPECT_EQ(m.measured_trainers, 4);
  // The batch never changes: 64 split, never accumulated.
  EXPECT_EQ(m.batch.base_batch, 64);
  EXPECT_EQ(m.batch.max_batch, 64);
  EXPECT_EQ(m.batch.max_accum_steps, 0);
  // The fit reproduces what was measured: 0.01 + 0.002 * 16 + 0.1 + 0.05 * 2 at 4 trainers.
  EXPECT_NEAR(StepSeconds(m.throughput, 1, 4, 16, 0), 0.242, 0.01);
  EXPECT_NEAR(StepSeconds(m.throughput, 1, 2, 32, 0), 0.174, 0.01);
  // Every size the policy asks about runs the job's one total batch.
  for (int n = 1; n <= kMax; ++n) {
    const BatchChoice c = BestBatch(m, 1, n);
    EXPECT_GT(c.goodput, 0) << n;
    EXPECT_EQ(c.accum_steps, 0) << n;
    EXPECT_LE(c.total_batch, 64) << n;
    EXPECT_GE(c.local_batch, 64 / n) << n;
  }
  // Without a re-form seen, two steps at the largest world measured.
  EXPECT_NEAR(m.reform_s, 2 * 0.242, 1e-9);
}

TEST(GoodputFeedTest, AFixedLocalJobWaitsForItsNoiseScaleAndKeepsItsMicroBatch) {
  GoodputFeed f;
  f.Batch(BatchPolicy::kFixedLocal, 32);
  Measure(&f, 1, 32);
  Measure(&f, 2, 32);
  EXPECT_NE(Missing(f).find("noise scale"), std::string::npos) << Missing(f);
  f.NoiseScale(-1);  // not meaningful yet: ignored
  f.NoiseScale(std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(Missing(f).find("noise scale"), std::string::npos);
  f.NoiseScale(500);
  const GoodputModel m = ModelOf(f);
  EXPECT_EQ(m.noise_scale, 500);
  EXPECT_EQ(m.measured_trainers, 2);
  EXPECT_EQ(m.batch.min_local, 32);
  EXPECT_EQ(m.batch.max_local, 32);
  EXPECT_EQ(m.batch.max_batch, 32 * kMax);
  // n trainers run n * 32, one micro-batch each: what the job will do.
  for (int n = 1; n <= kMax; ++n) {
    const BatchChoice c = BestBatch(m, 1, n);
    EXPECT_EQ(c.local_batch, 32) << n;
    EXPECT_EQ(c.accum_steps, 0) << n;
    EXPECT_EQ(c.total_batch, 32 * n) << n;
  }
  // A small noise scale makes the larger batches of more trainers worth less: the goodput of 8
  // trainers over 1 falls with it.
  GoodputModel noisy = m, quiet = m;
  noisy.noise_scale = 5000;
  quiet.noise_scale = 20;
  const auto gain = [](const GoodputModel& x) {
    return BestBatch(x, 1, 8).goodput / BestBatch(x, 1, 1).goodput;
  };
  EXPECT_GT(gain(noisy), 2 * gain(quiet));
}

TEST(GoodputFeedTest, TheLatestReportOfAWorldReplacesItsPointAndABatchChangeDropsThemAll) {
  GoodputFeed f;
  f.Batch(BatchPolicy::kFixedGlobal, 64);
  f.Step(1, 2, 0.01, 0.5);
  f.Step(1, 2, 0.01, 0.1);  // the same world, smoothed further: replaces
  EXPECT_NEAR(StepSeconds(ModelOf(f).throughput, 1, 2, 32, 0), 0.42, 1e-6);
  f.Batch(BatchPolicy::kFixedGlobal, 64);  // unchanged: kept
  EXPECT_EQ(ModelOf(f).measured_trainers, 2);
  f.Batch(BatchPolicy::kFixedGlobal, 128);  // another batch: the times measured another step
  EXPECT_NE(Missing(f).find("no step time"), std::string::npos);
  f.Batch(BatchPolicy::kFixedGlobal, 0);  // not a batch: ignored
  f.Step(1, 1, 0.01, -1);                 // one trainer: nothing to all-reduce
  EXPECT_EQ(ModelOf(f).measured_trainers, 1);
}

TEST(GoodputFeedTest, BadFiguresAreIgnoredAndThePointsStayBounded) {
  GoodputFeed f;
  f.Batch(BatchPolicy::kFixedGlobal, 1 << 20);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  f.Step(1, 2, nan, 0.1);
  f.Step(1, 2, inf, 0.1);
  f.Step(1, 2, 0, 0.1);
  f.Step(1, 2, 0.01, nan);
  f.Step(1, 2, 0.01, -1);   // several trainers, no all-reduce measured yet
  f.Step(3, 2, 0.01, 0.1);  // more nodes than trainers
  f.Step(0, 0, 0.01, 0.1);
  EXPECT_NE(Missing(f).find("no step time"), std::string::npos);
  f.Reform(nan);
  f.Reform(-3);
  for (int n = 1; n <= 100; ++n) f.Step(1 + (n - 1) / 8, n, 1e-6, n == 1 ? -1 : 0.01 * n);
  const GoodputModel m = ModelOf(f, 100);
  // Only the kMaxPoints latest worlds are kept: the largest is the latest.
  EXPECT_EQ(m.measured_trainers, 100);
  // The re-form cost: the mean of the last kReformSamples.
  GoodputFeed g = f;
  for (int i = 0; i < 20; ++i) g.Reform(i < 12 ? 100.0 : 1.0);
  EXPECT_DOUBLE_EQ(ModelOf(g, 100).reform_s, 1.0);
  g.Reform(9.0);
  EXPECT_DOUBLE_EQ(ModelOf(g, 100).reform_s, (7 * 1.0 + 9.0) / 8);
}

}  // namespace
}  // namespace edl::jobserver
