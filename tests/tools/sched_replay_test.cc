// The trace replay (tools/sched_sim/replay.h): its readers on a tiny hand-made trace and on
// damaged files, and its fidelity on the stored Pollux-study data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testutil.h"
#include "tools/sched_sim/app_trace.h"
#include "tools/sched_sim/replay.h"
#include "tools/sched_sim/workload.h"

namespace edl::schedsim {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// A toy application: 1 or 2 trainers on one node, 1 + 1 on two nodes, and 6 nodes of 1 or 2;
// micro-batches 4 and 8; batches 8 and 32, two epochs each.
class ToyTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    Write(dir_.Join("applications.csv"), "application,max_epochs,max_local_bsz\ntoy,2,0\n");
    Write(dir_.Join("traces/toy/placements.csv"),
          "placement,local_bsz,step_time,sync_time\n"
          "1,4,1.0,0.0\n"
          "1,8,2.0,0.0\n"
          "2,4,1.5,0.5\n"
          "2,8,2.5,0.5\n"
          "11,4,2.0,1.0\n"
          "11,8,3.0,1.0\n");
    Write(dir_.Join("traces/toy/scalability.csv"),
          "num_nodes,num_replicas,local_bsz,step_time,sync_time\n"
          "6,6,4,4.0,3.0\n"
          "6,6,8,5.0,3.0\n"
          "6,12,4,6.0,5.0\n"
          "6,12,8,7.0,5.0\n");
    Write(
        dir_.Join("traces/toy/validation-8.csv"),
        "progress,iteration,metric,grad_sqr,grad_var\n100,100,0.5,1.0,3.0\n200,200,0.6,1.0,1.0\n");
    Write(dir_.Join("traces/toy/validation-32.csv"),
          "progress,iteration,metric,grad_sqr,grad_var\n90,25,0.4,2.0,6.0\n210,50,0.6,1.0,1.0\n");
  }
  Status Load() { return LoadApps(dir_.path(), &apps_); }
  const AppTrace& toy() { return apps_.at("toy"); }
  // Loads expecting an error whose message holds every one of `words`.
  void ExpectError(const std::vector<std::string>& words) {
    const Status s = Load();
    ASSERT_FALSE(s.ok());
    for (const std::string& w : words) {
      EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in " << s.message();
    }
  }

  test::ScratchDir dir_{"sched-replay"};
  std::map<std::string, AppTrace> apps_;
};

TEST(RingKeyTest, IsTheSmallestRotationOfTheNonZeroCounts) {
  EXPECT_EQ(RingKey({3, 1}), "13");
  EXPECT_EQ(RingKey({1, 2, 1}), "112");
  EXPECT_EQ(RingKey({0, 2, 0, 2}), "22");
  EXPECT_EQ(RingKey({1, 3, 2}), "132");  // not a rotation of 123: ring order is kept
  EXPECT_EQ(RingKey({12}), "");
}

TEST_F(ToyTrace, StepTimesInterpolateAlongTheBatchThenOverTheGrid) {
  ASSERT_OK(Load());
  // A measured placement: linear in the micro-batch, clamped at the ends.
  EXPECT_DOUBLE_EQ(toy().Step({1}, 6).step_s, 1.5);
  EXPECT_DOUBLE_EQ(toy().Step({0, 1, 0, 1}, 6).step_s, 2.5);
  EXPECT_DOUBLE_EQ(toy().Step({1}, 100).step_s, 2.0);
  EXPECT_DOUBLE_EQ(toy().Step({2}, 4).sync_s, 0.5);
  // 3 nodes of 1: between the 2-node level (2 trainers, clamped) and the 6-node level (6
  // trainers, clamped), a quarter of the way.
  EXPECT_DOUBLE_EQ(toy().Step({1, 1, 1}, 4).step_s, 2.0 + (4.0 - 2.0) / 4);
  // 6 nodes, 9 trainers: halfway between 6 and 12 trainers.
  EXPECT_DOUBLE_EQ(toy().Step({2, 2, 2, 1, 1, 1}, 8).step_s, 6.0);
  // Past the largest node count: the largest.
  EXPECT_DOUBLE_EQ(toy().Step(std::vector<int>(20, 1), 4).step_s, 6.0);
  // Accumulation adds compute passes (step - sync).
  EXPECT_DOUBLE_EQ(toy().StepSeconds({2}, 4, 2), 1.5 + 2 * 1.0);
}

TEST_F(ToyTrace, GainAndEpochsFollowTheValidationFiles) {
  ASSERT_OK(Load());
  EXPECT_EQ(toy().limits().base_batch, 8);
  EXPECT_EQ(toy().limits().max_batch, 32);
  EXPECT_EQ(toy().limits().min_local, 4);
  EXPECT_EQ(toy().limits().max_local, 8);
  EXPECT_DOUBLE_EQ(toy().EpochEnd(0), 90);   // the least of 100 and 90
  EXPECT_DOUBLE_EQ(toy().EpochEnd(1), 200);  // the least of 200 and 210
  // At the base batch a step is one step of progress.
  EXPECT_DOUBLE_EQ(toy().Gain(8, 0), 1.0);
  // At 32 in epoch 0: sqr 2, var 6 -> (6 + 2) / (6 * 8 / 32 + 2).
  EXPECT_DOUBLE_EQ(toy().Gain(32, 0), 8.0 / 3.5);
  // At 20, halfway: sqr 1.5, var 4.5.
  EXPECT_DOUBLE_EQ(toy().Gain(20, 0), 6.0 / (4.5 * 8 / 20 + 1.5));
}

TEST_F(ToyTrace, DamagedTracesAreRefusedNamingTheFileLineAndFix) {
  Write(dir_.Join("traces/toy/placements.csv"), "placement,local_bsz,step_time\n1,4,1.0\n");
  ExpectError({"placements.csv:1", "no column 'sync_time'"});
  Write(dir_.Join("traces/toy/placements.csv"),
        "placement,local_bsz,step_time,sync_time\n1,4,1.0,0.0\n1,8,-2.0,0.0\n");
  ExpectError({"placements.csv:3", "step_time must be positive"});
  Write(dir_.Join("traces/toy/placements.csv"),
        "placement,local_bsz,step_time,sync_time\n1,4,1.0,2.0\n");
  ExpectError({"placements.csv:2", "exceeds step_time"});
  Write(dir_.Join("traces/toy/placements.csv"),
        "placement,local_bsz,step_time,sync_time\n10,4,1.0,0.0\n");
  ExpectError({"placements.csv:2", "digits 1-9"});
  Write(dir_.Join("traces/toy/placements.csv"),
        "placement,local_bsz,step_time,sync_time\n1,four,1.0,0.0\n");
  ExpectError({"placements.csv:2", "'four', not a number"});
  Write(dir_.Join("traces/toy/placements.csv"), "placement,local_bsz,step_time,sync_time\n1,4,1\n");
  ExpectError({"placements.csv:2", "3 fields where the header has 4"});
}

TEST_F(ToyTrace, DamagedValidationAndSettingsAreRefused) {
  Write(dir_.Join("applications.csv"), "application,max_epochs,max_local_bsz\ntoy,3,0\n");
  ExpectError({"validation-32.csv", "2 epochs, fewer than the 3"});
  Write(dir_.Join("applications.csv"), "application,max_epochs,max_local_bsz\ntoy,0,0\n");
  ExpectError({"applications.csv:2", "max_epochs must be 1..100000"});
  // Adaptive bounds that contradict each other: a trainer's memory below the least micro-batch.
  Write(dir_.Join("applications.csv"), "application,max_epochs,max_local_bsz\ntoy,2,2\n");
  ExpectError({"applications.csv:2", "max_local 2 < min_local 4", "raise max_local"});
  Write(dir_.Join("applications.csv"), "application,max_epochs,max_local_bsz\ntoy,2,0\n");
  Write(dir_.Join("traces/toy/validation-x.csv"), "progress,grad_sqr,grad_var\n1,1,1\n");
  ExpectError({"validation-x.csv", "validation-<total batch>.csv"});
  std::filesystem::remove(dir_.Join("traces/toy/validation-x.csv"));
  Write(dir_.Join("traces/toy/validation-8.csv"), "progress,grad_sqr\n100,1\n200,1\n");
  ExpectError({"validation-8.csv:1", "no column 'grad_var'"});
  Write(dir_.Join("traces/toy/validation-8.csv"), "progress,grad_sqr,grad_var\n100,1,1\n50,1,1\n");
  ExpectError({"validation-8.csv:3", "progress must not fall"});
}

TEST_F(ToyTrace, DamagedWorkloadsAreRefusedNamingTheLineAndFix) {
  ASSERT_OK(Load());
  Workload w;
  auto expect = [&](const std::string& text, const std::vector<std::string>& words) {
    Write(dir_.Join("w.csv"), text);
    const Status s = LoadWorkload(dir_.Join("w.csv"), apps_, 8, &w);
    ASSERT_FALSE(s.ok()) << text;
    for (const std::string& word : words) {
      EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
    }
  };
  const std::string head = "name,time,application,num_replicas,batch_size\n";
  expect("name,time,application,num_replicas\na,0,toy,1\n", {"w.csv:1", "no column 'batch_size'"});
  expect(head + "a,0,toy,1,8\nb,-5,toy,1,8\n", {"w.csv:3", "negative time -5"});
  expect(head + "a,0,bert,1,8\n", {"w.csv:2", "application 'bert'", "known: toy"});
  expect(head + "a,0,toy,0,8\n", {"w.csv:2", "asks for 0 GPUs", "1..8"});
  expect(head + "a,0,toy,1,64\n", {"w.csv:2", "outside toy's validated batch sizes 8..32"});
  expect(head + "a,0,toy,4,8\n", {"w.csv:2", "below toy's smallest micro-batch 4"});
  expect(head + "a,0,toy,1,8\na,1,toy,1,8\n", {"w.csv:3", "used before"});
  expect(head, {"no job"});
  Write(dir_.Join("w.csv"), head + "b,5,toy,2,16\na,0,toy,1,8\n");
  ASSERT_OK(LoadWorkload(dir_.Join("w.csv"), apps_, 8, &w));
  ASSERT_EQ(w.jobs.size(), 2u);
  EXPECT_EQ(w.jobs[0].name, "a");  // by arrival
  EXPECT_EQ(w.name, "w");
}

TEST_F(ToyTrace, EverySchedulerFinishesEveryJobWithinTheCluster) {
  ASSERT_OK(Load());
  Write(dir_.Join("w.csv"),
        "name,time,application,num_replicas,batch_size\n"
        "a,0,toy,2,16\nb,10,toy,4,32\nc,15,toy,1,8\nd,300,toy,8,32\ne,301,toy,2,8\n");
  Workload w;
  ASSERT_OK(LoadWorkload(dir_.Join("w.csv"), apps_, 8, &w));
  for (Scheduler s :
       {Scheduler::kGoodput, Scheduler::kFairShare, Scheduler::kTiresias, Scheduler::kEasy}) {
    for (ReformCost c : {ReformCost::kSteps, ReformCost::kFixed}) {
      SCOPED_TRACE(std::string(kSchedulerNames.Name(s)) + " " + kReformCostNames.Name(c));
      ReplayOptions o;
      o.scheduler = s;
      o.reform = c;
      o.nodes = 2;  // 8 GPUs
      ReplayResult r;
      // Replay checks the slots and every job's bounds after each decision itself.
      ASSERT_OK(Replay(w, apps_, o, &r));
      ASSERT_EQ(r.jobs.size(), 5u);
      for (const JobResult& j : r.jobs) {
        EXPECT_GE(j.start_s, j.arrival_s) << j.name;
        // At least the start and the two epochs' work at the fastest possible rate.
        EXPECT_GT(j.finish_s, j.start_s + o.start_s) << j.name;
        EXPECT_GT(j.gpu_s, 0) << j.name;
        if (s == Scheduler::kEasy) {
          EXPECT_EQ(j.reallocations, 0) << j.name;
        }
      }
      EXPECT_GT(r.figures.avg_jct_s, 0);
      EXPECT_GE(r.figures.p99_jct_s, r.figures.avg_jct_s);
      EXPECT_GE(r.figures.makespan_s, r.figures.p99_jct_s);
      EXPECT_GT(r.figures.gpu_hours, 0);
      EXPECT_LE(r.figures.gpu_hours * 3600, 8 * r.figures.makespan_s + 1e-6);
    }
  }
}

TEST_F(ToyTrace, AJobThatCanNeverRunIsReported) {
  ASSERT_OK(Load());
  Write(dir_.Join("w.csv"), "name,time,application,num_replicas,batch_size\na,0,toy,8,32\n");
  Workload w;
  ASSERT_OK(LoadWorkload(dir_.Join("w.csv"), apps_, 8, &w));
  ReplayOptions o;
  o.scheduler = Scheduler::kTiresias;
  o.nodes = 1;  // 4 GPUs
  ReplayResult r;
  const Status s = Replay(w, apps_, o, &r);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
}

TEST(PercentileTest, IsTheNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 160; ++i) v.push_back(i);
  EXPECT_EQ(Percentile99(v), 159);  // ceil(0.99 * 160) = 159th smallest
  EXPECT_EQ(Percentile99({5}), 5);
}

// ---------------------------------------------------------------- the stored study data

class PolluxData : public ::testing::Test {
 protected:
  static std::string Data() { return test::SourceDir() + "/tools/sched_sim/data/pollux"; }
  void SetUp() override { ASSERT_OK(LoadApps(Data(), &apps_)); }
  Workload Load(int n) {
    Workload w;
    EXPECT_OK(
        LoadWorkload(Data() + "/workloads/workload-" + std::to_string(n) + ".csv", apps_, 64, &w));
    return w;
  }
  std::map<std::string, AppTrace> apps_;
};

// Our Tiresias against the study's published Tiresias results: within 10 % of the average JCT
// on every workload (the replay's fidelity; bench/scheduler_trace.sh prints the figures).
TEST_F(PolluxData, TiresiasIsWithinTenPercentOfThePublishedResultsOnEveryWorkload) {
  PublishedJcts published;
  ASSERT_OK(LoadPublished(Data() + "/results-jobload/tiresias-1.0/summary.json", &published));
  for (int n = 1; n <= 8; ++n) {
    const Workload w = Load(n);
    ASSERT_EQ(w.jobs.size(), 160u);
    ReplayOptions o;
    o.scheduler = Scheduler::kTiresias;
    ReplayResult r;
    ASSERT_OK(Replay(w, apps_, o, &r));
    Figures ref;
    ASSERT_OK(FiguresOf(w, published.at(w.name), &ref));
    EXPECT_NEAR(r.figures.avg_jct_s / ref.avg_jct_s, 1.0, 0.10) << w.name;
  }
}

TEST_F(PolluxData, TheGoodputPolicyRunsAWorkloadToTheEnd) {
  const Workload w = Load(3);
  ReplayOptions o;
  o.scheduler = Scheduler::kGoodput;
  ReplayResult goodput, tiresias;
  ASSERT_OK(Replay(w, apps_, o, &goodput));
  o.scheduler = Scheduler::kTiresias;
  ASSERT_OK(Replay(w, apps_, o, &tiresias));
  EXPECT_GT(goodput.reallocations, 0);
  EXPECT_LT(goodput.figures.avg_jct_s, tiresias.figures.avg_jct_s);
}

}  // namespace
}  // namespace edl::schedsim
