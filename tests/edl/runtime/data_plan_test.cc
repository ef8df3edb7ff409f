#include "edl/runtime/data_plan.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::runtime {
namespace {

TEST(DataPlanTest, PermutationDependsOnlyOnSeedAndEpoch) {
  DataPlan a(1000, 7), b(1000, 7), c(1000, 8);
  std::vector<int64_t> p0 = a.Permutation(0);
  EXPECT_EQ(p0, b.Permutation(0));
  EXPECT_NE(p0, a.Permutation(1));
  EXPECT_NE(p0, c.Permutation(0));
  std::vector<int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
}

// Any sequence of world sizes and batch policies consumes every sample exactly once per epoch.
TEST(DataPlanTest, ExactlyOncePerEpochAcrossReforms) {
  const int64_t n = 997;  // prime: forces short last steps
  DataPlan plan(n, 42);
  DataPosition pos;
  const std::vector<std::pair<BatchPolicy, int>> gens = {{BatchPolicy::kFixedLocal, 4},
                                                         {BatchPolicy::kFixedLocal, 2},
                                                         {BatchPolicy::kFixedGlobal, 3},
                                                         {BatchPolicy::kFixedLocal, 1},
                                                         {BatchPolicy::kFixedGlobal, 5}};
  std::vector<std::multiset<int64_t>> seen(3);
  int step = 0;
  while (pos.epoch < 3) {
    const auto& g = gens[(step / 7) % gens.size()];  // re-form every 7 steps
    const std::vector<int64_t> b = BatchSizes(g.first, 16, g.second);
    const auto slices = plan.Step(pos, b);
    for (int r = 0; r < g.second; ++r) {
      EXPECT_EQ(slices[r], plan.Slice(pos, b, r));
      seen[pos.epoch].insert(slices[r].begin(), slices[r].end());
    }
    pos = plan.Advance(pos, b);
    ++step;
  }
  for (int e = 0; e < 3; ++e) {
    ASSERT_EQ(seen[e].size(), static_cast<size_t>(n)) << "epoch " << e;
    int64_t expect = 0;
    for (int64_t i : seen[e]) ASSERT_EQ(i, expect++) << "epoch " << e;
  }
}

TEST(DataPlanTest, ShortLastStepSplitsProportionally) {
  DataPlan plan(10, 1);
  DataPosition pos{0, 4};  // 6 left, global batch 8 (4 + 2 + 2)
  const auto slices = plan.Step(pos, {4, 2, 2});
  EXPECT_EQ(slices[0].size() + slices[1].size() + slices[2].size(), 6u);
  EXPECT_EQ(slices[0].size(), 3u);
  EXPECT_EQ(plan.Advance(pos, {4, 2, 2}), (DataPosition{1, 0}));
}

TEST(DataPlanTest, BatchPolicies) {
  EXPECT_EQ(BatchSizes(BatchPolicy::kFixedLocal, 32, 3), (std::vector<int64_t>{32, 32, 32}));
  EXPECT_EQ(BatchSizes(BatchPolicy::kFixedGlobal, 10, 3), (std::vector<int64_t>{4, 3, 3}));
  BatchPolicy p;
  EXPECT_OK(ParseBatchPolicy("fixed-global", &p));
  EXPECT_EQ(p, BatchPolicy::kFixedGlobal);
  Status s = ParseBatchPolicy("fixed", &p);
  EXPECT_NE(s.message().find("fixed-local"), std::string::npos);
}

TEST(DataPlanTest, EvenShardCoversAll) {
  int64_t covered = 0, prev_end = 0;
  for (int r = 0; r < 3; ++r) {
    int64_t b, e;
    EvenShard(10, r, 3, &b, &e);
    EXPECT_EQ(b, prev_end);
    covered += e - b;
    prev_end = e;
  }
  EXPECT_EQ(covered, 10);
}

}  // namespace
}  // namespace edl::runtime
