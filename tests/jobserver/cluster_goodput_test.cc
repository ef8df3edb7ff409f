// The cluster policy's goodput step (cluster_policy.h, step 3'; docs/SCHEDULING.md).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "jobserver/policy/cluster_policy.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

constexpr int64_t kSecond = 1'000'000;

// A job whose steps need no all-reduce: its goodput grows linearly with its trainers (with a
// large noise scale, each trainer's batch is worth as much as the base batch).
GoodputModel Linear(int measured = 64) {
  GoodputModel m;
  m.throughput.grad_fixed_s = 0.01;
  m.throughput.grad_per_sample_s = 0.001;
  m.noise_scale = 1e9;
  m.batch = {32, 4096, 8, 512};
  m.measured_trainers = measured;
  return m;
}

// The same job with an all-reduce of 5 s, and 5 s more per trainer past two: the fewer trainers
// the faster.
GoodputModel SyncBound(int measured = 64) {
  GoodputModel m = Linear(measured);
  m.throughput.intra_fixed_s = m.throughput.inter_fixed_s = 5;
  m.throughput.intra_per_trainer_s = m.throughput.inter_per_trainer_s = 5;
  return m;
}

// Free all-reduce within a node, 1 s across nodes: a node's worth is best.
GoodputModel NodeLocal(int measured = 64) {
  GoodputModel m = Linear(measured);
  m.throughput.inter_fixed_s = 1;
  return m;
}

class ClusterGoodputTest : public ::testing::Test {
 protected:
  void Make(GoodputPolicyOptions g = {}, int64_t interval_us = 0) {
    ClusterPolicyOptions o;
    o.kind = PolicyKind::kGoodput;
    o.goodput = g;
    o.min_change_interval_us = interval_us;
    policy_ = std::make_unique<ClusterPolicy>(o, &clock_);
  }
  static GoodputPolicyOptions NoProbe() {
    GoodputPolicyOptions g;
    g.probe_trainers = 0;  // jobs without a model get their whole fair share
    return g;
  }
  void AddNodes(int n, int slots) {
    for (int i = 0; i < n; ++i) {
      ASSERT_OK(policy_->AddNode({"n" + std::to_string(i), slots, {"t"}}));
    }
  }
  void Submit(const std::string& name, int min, int max, int priority = 1, bool elastic = true) {
    JobSubmission j;
    j.name = name;
    j.type = "t";
    j.min_trainers = min;
    j.max_trainers = max;
    j.priority = priority;
    j.elastic = elastic;
    ASSERT_OK(policy_->Submit(j));
    ASSERT_OK(policy_->CheckInvariants());
  }
  void Report(const std::string& name, const GoodputModel& m) {
    ASSERT_OK(policy_->ReportGoodput(name, m));
    ASSERT_OK(policy_->CheckInvariants());
  }
  void Tick(double seconds = 1) {
    clock_.Advance(static_cast<int64_t>(seconds * kSecond));
    policy_->Tick();
    ASSERT_OK(policy_->CheckInvariants());
  }
  int Size(const std::string& name) { return policy_->Find(name)->size; }
  int Nodes(const std::string& name) {
    return static_cast<int>(policy_->Find(name)->placement.size());
  }
  std::string Note(const std::string& name) {
    const nlohmann::json summary = policy_->Summary();
    for (const auto& j : summary["jobs"]) {
      if (j["name"] == name) return j.value("goodput", std::string());
    }
    return "(no job)";
  }

  ManualClock clock_;
  std::unique_ptr<ClusterPolicy> policy_;
};

TEST_F(ClusterGoodputTest, JobsWithoutAModelGetTheirFairShareAndTheStatusSaysSo) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("a", 1, 8);
  Submit("b", 1, 8);
  EXPECT_EQ(Size("a"), 4);
  EXPECT_EQ(Size("b"), 4);
  EXPECT_NE(Note("a").find("no goodput model yet: fair share"), std::string::npos) << Note("a");
  Report("a", Linear());
  EXPECT_NE(Note("a").find("measured at up to 64 trainers"), std::string::npos) << Note("a");
}

TEST_F(ClusterGoodputTest, BeforeItsFirstMeasurementAJobRunsAtTheProbeSize) {
  Make();  // probe_trainers 1
  AddNodes(2, 4);
  Submit("a", 1, 8);
  EXPECT_EQ(Size("a"), 1);
  // Its first model runs a pass at once: it grows by it, up to explore_factor (4) times 1.
  Report("a", Linear(1));
  EXPECT_EQ(Size("a"), 4);
  Report("a", Linear(4));
  EXPECT_EQ(Size("a"), 8);
}

TEST_F(ClusterGoodputTest, SlotsGoToTheJobWhoseGoodputTheyRaise) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("linear", 1, 8);
  Submit("sync", 1, 8);
  Report("linear", Linear());
  Report("sync", SyncBound());
  Tick();
  EXPECT_EQ(Size("sync"), 1);  // more trainers only slow it down
  EXPECT_EQ(Size("linear"), 7);
  const auto events = policy_->TakeEvents();
  bool logged = false;
  for (const PolicyEvent& e : events) {
    logged = logged || (e.job == "sync" && e.reason.find("goodput share") != std::string::npos);
  }
  EXPECT_TRUE(logged);
}

TEST_F(ClusterGoodputTest, ASlotThatRaisesNoGoodputStaysFree) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("sync", 1, 8);
  EXPECT_EQ(Size("sync"), 8);  // fair share while it has no model
  Report("sync", SyncBound());
  Tick();
  EXPECT_EQ(Size("sync"), 1);
  EXPECT_EQ(policy_->FreeSlots("t"), 7);
}

TEST_F(ClusterGoodputTest, ACompactPlacementIsWorthItsReform) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("x", 1, 4);
  Submit("y", 1, 8);
  Submit("z", 1, 4);
  ASSERT_OK(policy_->Finish("x"));  // y and z: 4 each, wherever the fair share left them
  Report("y", NodeLocal());
  Report("z", NodeLocal());
  Tick();
  EXPECT_EQ(Size("y"), 4);
  EXPECT_EQ(Size("z"), 4);
  EXPECT_EQ(Nodes("y"), 1);  // all-reduce across nodes costs 1 s a step: one node each
  EXPECT_EQ(Nodes("z"), 1);
}

TEST_F(ClusterGoodputTest, AModelIsTrustedUpToTheExploreFactorTimesItsLargestMeasurement) {
  Make(NoProbe());
  AddNodes(4, 4);
  Submit("a", 1, 16);
  EXPECT_EQ(Size("a"), 16);
  Report("a", Linear(2));
  Tick();
  EXPECT_EQ(Size("a"), 8);  // 4 x 2
}

TEST_F(ClusterGoodputTest, AReformCostHoldsAJobWhereItIs) {
  for (double reform_s : {0.0, 1e5}) {
    SCOPED_TRACE("reform " + std::to_string(reform_s));
    Make(NoProbe());
    AddNodes(1, 5);
    Submit("a", 1, 5);
    ASSERT_OK(policy_->Scale("a", 4));
    GoodputModel m = Linear();
    m.reform_s = reform_s;
    Report("a", m);
    Tick();
    ASSERT_EQ(Size("a"), 4);
    ASSERT_OK(policy_->Scale("a", 5));  // a fifth trainer would raise its goodput by a quarter
    EXPECT_EQ(Size("a"), reform_s == 0 ? 5 : 4);
  }
}

TEST_F(ClusterGoodputTest, PriorityWeighsAJobsTerm) {
  GoodputPolicyOptions g = NoProbe();
  g.service_power = 0;
  Make(g);
  AddNodes(2, 4);
  Submit("high", 1, 8, 3);
  Submit("low", 1, 8, 1);
  Report("high", Linear());
  Report("low", Linear());
  Tick();
  EXPECT_GT(Size("high"), Size("low"));
  EXPECT_EQ(Size("high") + Size("low"), 8);
}

TEST_F(ClusterGoodputTest, LeastAttainedServiceTiltsTheShareTowardNewJobs) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("old", 1, 8);
  Report("old", Linear());
  Tick(4 * 3600);  // 8 trainers for 4 hours: 32 trainer-hours of service
  Submit("new", 1, 8);
  Report("new", Linear());
  Tick();
  EXPECT_GT(Size("new"), Size("old"));
}

TEST_F(ClusterGoodputTest, MinMaxAndRestartModeKeepTheirMeaning) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("bounded", 3, 5);
  Submit("fixed", 2, 2, 1, /*elastic=*/false);
  Report("bounded", SyncBound());  // one trainer would be best; its min is 3
  Report("fixed", SyncBound());
  Tick();
  EXPECT_EQ(Size("bounded"), 3);
  EXPECT_EQ(Size("fixed"), 2);
  EXPECT_EQ(Note("fixed"), "");  // restart mode: not sized by goodput
}

TEST_F(ClusterGoodputTest, TheRateLimitHoldsAJobSizedByGoodput) {
  Make(NoProbe(), 100 * kSecond);
  AddNodes(2, 4);
  Submit("sync", 1, 8);
  Report("sync", SyncBound());
  Tick(10);
  EXPECT_EQ(Size("sync"), 8);  // started 10 s ago: held
  Tick(100);
  EXPECT_EQ(Size("sync"), 1);
}

TEST_F(ClusterGoodputTest, AdmissionStillShrinksGoodputJobsForANewJob) {
  Make(NoProbe());
  AddNodes(2, 4);
  Submit("a", 1, 8);
  Report("a", Linear());
  Tick();
  EXPECT_EQ(Size("a"), 8);
  Submit("b", 2, 8);
  EXPECT_GE(Size("b"), 2);
  EXPECT_LE(Size("a") + Size("b"), 8);
}

TEST_F(ClusterGoodputTest, ContradictingOrBadModelsAreRefusedAndChangeNothing) {
  Make(NoProbe());
  AddNodes(1, 4);
  Submit("a", 3, 4);
  EXPECT_EQ(policy_->ReportGoodput("nope", Linear()).code(), Status::Code::kNotFound);
  auto refused = [&](const GoodputModel& m, const std::string& words) {
    const Status s = policy_->ReportGoodput("a", m);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
    EXPECT_FALSE(policy_->Find("a")->has_goodput);
  };
  GoodputModel m = Linear();
  m.batch.max_local = 4;  // below min_local 8
  refused(m, "max_local 4 < min_local 8");
  m = Linear();
  m.batch.max_batch = 16;  // below base_batch 32
  refused(m, "max_batch 16 < base_batch 32");
  m = Linear();
  m.batch = {8, 16, 8, 512};  // its min of 3 trainers needs a batch of 24
  refused(m, "lower min_trainers");
  m = Linear();
  m.throughput.inter_fixed_s = -1;
  refused(m, "negative");
  m = Linear();
  m.noise_scale = NAN;
  refused(m, "not a number");
  m = Linear();
  m.throughput.overlap = 0.5;
  refused(m, "overlap");
  ASSERT_OK(policy_->CheckInvariants());
}

TEST_F(ClusterGoodputTest, EveryFairnessPowerKeepsTheInvariants) {
  for (double p : {-2.0, -1.0, 0.0, 0.5, 0.9}) {
    SCOPED_TRACE("p " + std::to_string(p));
    GoodputPolicyOptions g;
    g.fairness_power = p;
    Make(g);
    AddNodes(3, 4);
    Submit("a", 1, 12);
    Submit("b", 2, 6);
    Submit("c", 1, 12);
    Report("a", Linear(2));
    Report("b", NodeLocal(4));
    Report("c", SyncBound(1));
    Tick();
    EXPECT_EQ(Size("c"), 1);
    EXPECT_GE(Size("b"), 2);
    EXPECT_LE(Size("a"), 8);
  }
}

}  // namespace
}  // namespace edl::jobserver
