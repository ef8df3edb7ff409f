#include "jobserver/policy/scaling.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using Op = ScaleEvent::Op;

TEST(ScalingScriptTest, ParsesAndPlaysWithRepeat) {
  ScalingScript s;
  ASSERT_OK(ScalingScript::Parse(
      "# comment\n0 set 4\n2.5 remove 2   # shrink\n5 add 1\n6 kill 1\n10 repeat\n", "t.script",
      &s));
  ASSERT_EQ(s.events().size(), 5u);
  auto due = s.Poll(0);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].op, Op::kSet);
  EXPECT_EQ(due[0].n, 4);
  EXPECT_TRUE(s.Poll(2'000'000).empty());
  due = s.Poll(6'000'000);
  ASSERT_EQ(due.size(), 3u);
  EXPECT_EQ(due[0].op, Op::kRemove);
  EXPECT_EQ(due[2].op, Op::kKill);
  due = s.Poll(12'600'000);  // repeat at 10: set@10, remove@12.5
  ASSERT_EQ(due.size(), 2u);
  EXPECT_EQ(due[1].at_us, 12'500'000);
}

TEST(ScalingScriptTest, KillAll) {
  ScalingScript s;
  ASSERT_OK(ScalingScript::Parse("0 set 4\n3 kill all  # stop-resume\n4 kill 2\n", "t.script", &s));
  ASSERT_EQ(s.events().size(), 3u);
  EXPECT_EQ(s.events()[1].op, Op::kKillAll);
  EXPECT_EQ(s.events()[2].op, Op::kKill);
  EXPECT_EQ(s.events()[2].n, 2);
  EXPECT_NE(s.events()[1].ToString().find("kill all"), std::string::npos);
  for (const char* bad : {"1 kill everyone", "1 kill all 2", "1 set all"}) {
    Status st = ScalingScript::Parse(bad, "bad.script", &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
  }
}

// `teachers SERVICE N` (docs/FLAGS.md "Scaling-script format"): the service name is validated like
// every name and N is bounded; the event carries both.
TEST(ScalingScriptTest, TeachersSetsAServicesCount) {
  ScalingScript s;
  ASSERT_OK(ScalingScript::Parse("0 teachers kd 2\n1.5 teachers kd.v2 0 # off\n2 set 3\n",
                                 "t.script", &s));
  ASSERT_EQ(s.events().size(), 3u);
  EXPECT_EQ(s.events()[0].op, ScaleEvent::Op::kTeachers);
  EXPECT_EQ(s.events()[0].service, "kd");
  EXPECT_EQ(s.events()[0].n, 2);
  EXPECT_EQ(s.events()[1].service, "kd.v2");
  EXPECT_EQ(s.events()[1].n, 0);
  EXPECT_EQ(s.events()[1].at_us, 1'500'000);
  EXPECT_NE(s.events()[0].ToString().find("teachers kd 2"), std::string::npos)
      << s.events()[0].ToString();
  const std::vector<ScaleEvent> due = s.Poll(1'500'000);
  ASSERT_EQ(due.size(), 2u);
  EXPECT_EQ(due[1].service, "kd.v2");
  for (const char* bad :
       {"1 teachers", "1 teachers kd", "1 teachers 2", "1 teachers ../kd 1", "1 teachers kd -1",
        "1 teachers kd 1025", "1 teachers kd 2x", "1 teachers kd 1 2", "1 teachers a/b 1",
        "1 teachers kd 99999999999999999999"}) {
    const Status st = ScalingScript::Parse(bad, "t.script", &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("t.script:1"), std::string::npos) << st.ToString();
  }
  EXPECT_NE(ScalingScript::Parse("1 teachers kd 1x", "t.script", &s).message().find("0..1024"),
            std::string::npos);
}

// `step N` lines (the demo test's script): due once the job reached step N, whatever the clock
// says; events stay in the order written, so a timed line after a step line waits for it.
TEST(ScalingScriptTest, StepLinesWaitForTheJobsProgressInOrder) {
  ScalingScript s;
  ASSERT_OK(ScalingScript::Parse(
      "0 set 4\nstep 30 set 2  # shrink\nstep 30 add 1\n5 kill 1\nstep 90 kill all\n", "t.script",
      &s));
  ASSERT_EQ(s.events().size(), 5u);
  EXPECT_EQ(s.events()[1].at_step, 30);
  EXPECT_EQ(s.events()[0].at_step, -1);
  EXPECT_NE(s.events()[4].ToString().find("step 90 kill all"), std::string::npos)
      << s.events()[4].ToString();
  ASSERT_EQ(s.Poll(0).size(), 1u);
  EXPECT_TRUE(s.Poll(1'000'000'000).empty())
      << "no step reported yet: time alone never fires a step line";
  s.ObserveStep(29);
  EXPECT_TRUE(s.Poll(1'000'000'000).empty());
  s.ObserveStep(40);
  s.ObserveStep(10);  // an older report (a restarted trainer) does not lower the step
  auto due = s.Poll(1'000'000);
  ASSERT_EQ(due.size(), 2u) << "both step-30 lines; the timed kill at 5 s waits for its time";
  EXPECT_EQ(due[0].op, Op::kSet);
  EXPECT_EQ(due[1].op, Op::kAdd);
  due = s.Poll(5'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].op, Op::kKill);
  EXPECT_TRUE(s.Poll(1'000'000'000).empty());
  s.ObserveStep(90);
  due = s.Poll(5'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].op, Op::kKillAll);
  // `step +N` counts from the first poll after the line above took effect (the server does not poll
  // while a grow's joiners start, however many steps the others train meanwhile).
  ScalingScript rel;
  ASSERT_OK(
      ScalingScript::Parse("step +10 set 2\nstep +0 add 1\nstep +20 kill 1\n", "t.script", &rel));
  EXPECT_TRUE(rel.events()[2].step_relative);
  EXPECT_NE(rel.events()[2].ToString().find("step +20 kill 1"), std::string::npos);
  rel.ObserveStep(5);
  EXPECT_TRUE(rel.Poll(0).empty()) << "the first poll sets the base: step 5";
  rel.ObserveStep(14);
  EXPECT_TRUE(rel.Poll(0).empty());
  rel.ObserveStep(15);
  due = rel.Poll(0);
  ASSERT_EQ(due.size(), 1u) << "the +0 line waits for the next poll";
  EXPECT_EQ(due[0].op, Op::kSet);
  rel.ObserveStep(50);  // the server did not poll meanwhile (joiners starting)
  due = rel.Poll(0);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].op, Op::kAdd);
  EXPECT_TRUE(rel.Poll(0).empty()) << "the poll after the grow took effect: counts from step 50";
  rel.ObserveStep(69);
  EXPECT_TRUE(rel.Poll(0).empty()) << "20 steps from step 50";
  rel.ObserveStep(70);
  EXPECT_EQ(rel.Poll(0).size(), 1u);
  // Where Poll stands survives a server restart (Resume); the step comes back with the next report.
  ScalingScript again;
  ASSERT_OK(ScalingScript::Parse("0 set 4\nstep 30 set 2\n", "t.script", &again));
  again.Resume(1, 0);
  EXPECT_TRUE(again.Poll(1'000'000'000).empty());
  again.ObserveStep(30);
  EXPECT_EQ(again.Poll(0).size(), 1u);
}

TEST(ScalingScriptTest, RejectsBadLinesNamingThem) {
  const std::vector<std::string> bad = {"x set 1",        "1 grow 2",
                                        "1 add",          "1 add -1",
                                        "1 add 0",        "2 set 1\n1 set 2",
                                        "0 repeat",       "5 repeat\n6 set 1",
                                        "1 set 2 3",      "-1 set 1",
                                        "step set 1",     "step -1 set 1",
                                        "step 2x set 1",  "step 5 set 1\nstep 4 set 2",
                                        "step 5",         "step 5 set 1\n10 repeat",
                                        "step 1e3 set 1", "step + set 1",
                                        "step +-2 set 1", "step +2\n"};
  for (const std::string& text : bad) {
    ScalingScript s;
    Status st = ScalingScript::Parse(text, "bad.script", &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << text;
    EXPECT_NE(st.message().find("bad.script:"), std::string::npos) << st.ToString();
  }
  ScalingScript s;
  EXPECT_EQ(ScalingScript::Load("/nonexistent.script", &s).code(), Status::Code::kInvalidArgument);
}

TEST(DemoPolicyTest, RemovesThenAddsEveryInterval) {
  DemoPolicyOptions o;
  o.node_ips = {"10.0.0.1", "10.0.0.2"};
  o.gpu_num_of_node = 2;  // one GPU, so one trainer, per pod
  o.pod_num_of_node = 2;
  o.time_interval_to_change_s = 10;
  o.del_pods_one_step = 2;
  o.add_pods_one_step = 1;
  DemoPolicy p(o);
  EXPECT_EQ(p.initial_size(), 4);
  EXPECT_TRUE(p.Poll(9'000'000).empty());
  auto due = p.Poll(10'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].n, 2);  // removed 2
  due = p.Poll(20'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].n, 3);  // added 1
  due = p.Poll(60'000'000);
  ASSERT_EQ(due.size(), 4u);
  for (const auto& e : due) {
    EXPECT_GE(e.n, 1);
    EXPECT_LE(e.n, 4);
  }
}

// The original demo's meaning: a node's GPUs are split among its pods, one trainer per GPU; steps
// add and remove whole pods. Its defaults (8 GPUs, 1 pod per node) give 8 trainers a node.
TEST(DemoPolicyTest, PodsSplitTheNodesGpusAsInTheOriginalDemo) {
  DemoPolicyOptions o;
  o.node_ips = {"10.0.0.1", "10.0.0.2"};
  o.time_interval_to_change_s = 10;
  DemoPolicy defaults(o);
  EXPECT_EQ(defaults.trainers_per_pod(), 8);
  EXPECT_EQ(defaults.initial_size(), 16);
  auto due = defaults.Poll(10'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].n, 8);  // one pod of 8 removed
  due = defaults.Poll(20'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].n, 16);
  o.pod_num_of_node = 4;  // 2 GPUs per pod
  DemoPolicy pods(o);
  EXPECT_EQ(pods.trainers_per_pod(), 2);
  EXPECT_EQ(pods.initial_size(), 16);
  due = pods.Poll(10'000'000);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].n, 14);
}

}  // namespace
}  // namespace edl::jobserver
