// The NCCL re-form decisions that need no GPU (edl/runtime/comm/nccl_reform.h): shrink or init,
// and the duplicate-GPU error as the user reads it.
#include "edl/runtime/comm/nccl_reform.h"

#include <gtest/gtest.h>

namespace edl::runtime {
namespace {

constexpr int kNccl228 = 22809;

TEST(NcclReformTest, PlannedShrinkKeepingOrderShrinks) {
  const NcclBuildPlan p =
      PlanNcclBuild({"a", "b", "c", "d"}, {"a", "c", "d"}, false, true, kNccl228);
  EXPECT_EQ(p.build, NcclBuild::kShrink) << p.why;
  EXPECT_EQ(p.excluded, std::vector<int>({1}));
  const NcclBuildPlan two = PlanNcclBuild({"a", "b", "c", "d"}, {"b", "d"}, false, true, kNccl228);
  EXPECT_EQ(two.build, NcclBuild::kShrink);
  EXPECT_EQ(two.excluded, std::vector<int>({0, 2}));
}

TEST(NcclReformTest, FailureShrinkAbortsTheParentsOperations) {
  const NcclBuildPlan p = PlanNcclBuild({"a", "b", "c"}, {"a", "c"}, true, true, kNccl228);
  EXPECT_EQ(p.build, NcclBuild::kShrinkAbort) << p.why;
  EXPECT_EQ(p.excluded, std::vector<int>({1}));
  EXPECT_STREQ(NcclBuildName(p.build), "shrink_abort");
}

TEST(NcclReformTest, EverythingElseIsAFullInit) {
  struct Case {
    std::vector<std::string> current, next;
    bool parent_usable;
    int version;
    const char* why_contains;
  } cases[] = {
      {{}, {"a"}, true, kNccl228, "no current"},                            // first generation
      {{"a", "b"}, {"a", "b", "c"}, true, kNccl228, "not a shrink"},        // grow
      {{"a", "b", "c"}, {"a", "x"}, true, kNccl228, "joins"},               // replace
      {{"a", "b", "c"}, {"c", "a"}, true, kNccl228, "relative order"},      // reordered survivors
      {{"a", "b", "c"}, {"a", "b", "c"}, true, kNccl228, "not a shrink"},   // same members
      {{"a", "b", "c"}, {"a", "c"}, false, kNccl228, "no longer usable"},   // aborted parent
      {{"a", "b", "c"}, {"a", "c"}, true, 22605, "has no ncclCommShrink"},  // NCCL 2.26
      {{"a", "b", "c"}, {"a", "c"}, true, 0, "has no ncclCommShrink"},      // no NCCL
  };
  for (const Case& c : cases) {
    const NcclBuildPlan p = PlanNcclBuild(c.current, c.next, false, c.parent_usable, c.version);
    EXPECT_EQ(p.build, NcclBuild::kInit) << p.why;
    EXPECT_TRUE(p.excluded.empty());
    EXPECT_NE(p.why.find(c.why_contains), std::string::npos) << p.why;
  }
  EXPECT_EQ(PlanNcclBuild({"a", "b"}, {"a"}, false, true, kNcclShrinkMinVersion).build,
            NcclBuild::kShrink);
}

TEST(NcclReformTest, DuplicateGpuNamesBothTrainersAndTheFix) {
  const std::string nccl = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000";
  const std::string m = DuplicateGpuMessage("init.cc:123 NCCL WARN " + nccl, {"t-a", "t-b"}, 7);
  EXPECT_NE(m.find("generation 7"), std::string::npos) << m;
  EXPECT_NE(m.find("trainer t-b (rank 1)"), std::string::npos) << m;
  EXPECT_NE(m.find("trainer t-a (rank 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("1a000"), std::string::npos) << m;
  EXPECT_NE(m.find("--cuda_device"), std::string::npos) << m;
  EXPECT_NE(m.find("LOCAL_RANK"), std::string::npos) << m;
  // Without names, ranks; a rank outside the list stays a rank.
  const std::string bare = DuplicateGpuMessage(nccl, {"only"}, 3);
  EXPECT_NE(bare.find("rank 1 and trainer only (rank 0)"), std::string::npos) << bare;
  EXPECT_EQ(DuplicateGpuMessage("NCCL WARN Cuda failure 'out of memory'", {}, 1), "");
  EXPECT_EQ(DuplicateGpuMessage("", {}, 1), "");
}

}  // namespace
}  // namespace edl::runtime
