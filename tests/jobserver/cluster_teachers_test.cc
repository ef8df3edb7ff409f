// Teachers on a cluster (cluster_policy.h, step 5; docs/CLUSTER.md "Teacher services on a
// cluster"): the ClusterPolicy's free slots are the ServicePlacer's capacity, as `edl server
// --cluster` wires them. A service's desired count is an upper bound filled from free slots only; a
// job that is submitted or grows takes the slots teachers use (they are stopped) before any job is
// shrunk; teachers come back when a job ends.
#include <memory>

#include <gtest/gtest.h>

#include "jobserver/policy/cluster_policy.h"
#include "jobserver/services/service_placement.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using Order = ServicePlacer::Order;

class ClusterTeachersTest : public ::testing::Test {
 protected:
  ClusterTeachersTest() : policy_(ClusterPolicyOptions{}, &clock_) {}

  static JobSubmission Job(const std::string& name, int min, int max) {
    JobSubmission j;
    j.name = name;
    j.type = "t";
    j.min_trainers = min;
    j.max_trainers = max;
    return j;
  }
  // One server step: the policy's free slots to the placer, then its orders, applied at once
  // (a stopped teacher's exit is reported right away).
  std::vector<Order> Step() {
    placer_.SetCapacity(policy_.FreeSlotsByNode());
    std::vector<Order> orders = placer_.Reconcile(clock_.NowMicros());
    for (const Order& o : orders) {
      if (o.start) {
        running_[o.node] += 1;
      } else {
        running_[o.node] -= 1;
        placer_.Exited(o.node, o.name, "exit 0", clock_.NowMicros());
      }
    }
    clock_.Advance(1'000'000);
    return orders;
  }
  int Teachers() const {
    int n = 0;
    for (const auto& [node, k] : running_) n += k;
    return n;
  }
  int Size(const std::string& job) const { return policy_.Find(job)->size; }
  // Every node: trainers + teachers within its slots.
  void CheckFits(const std::map<std::string, int>& slots) {
    for (const auto& [node, total] : slots) {
      int trainers = 0;
      for (const auto& [name, job] : policy_.jobs()) {
        auto it = job.placement.find(node);
        if (it != job.placement.end()) trainers += it->second;
      }
      EXPECT_LE(trainers + running_[node], total) << node;
    }
  }

  ManualClock clock_;
  ClusterPolicy policy_;
  ServicePlacer placer_;
  std::map<std::string, int> running_;  // teachers running per node
};

TEST_F(ClusterTeachersTest, TeachersFillFreeSlotsAndYieldThemToJobsBeforeAnyJobShrinks) {
  const std::map<std::string, int> slots = {{"a", 4}, {"b", 4}};
  for (const auto& [node, k] : slots) {
    ASSERT_OK(policy_.AddNode({node, k, {"t"}}));
    placer_.NodeUp(node, {"kd"}, 4, {}, clock_.NowMicros());
  }
  ASSERT_OK(policy_.Submit(Job("a1", 2, 4)));
  EXPECT_EQ(Size("a1"), 4);
  EXPECT_EQ(policy_.FreeSlotsByNode(), (std::map<std::string, int>{{"a", 0}, {"b", 4}}));
  // Eight asked, four slots free: four teachers, all on b.
  ASSERT_OK(placer_.SetDesired("kd", 8));
  Step();
  EXPECT_EQ(Teachers(), 4);
  EXPECT_EQ(running_["b"], 4);
  CheckFits(slots);
  EXPECT_TRUE(Step().empty());  // short of its count, nothing more to place

  // A second job arrives: it takes b's four slots as free ones (a1 keeps its 4) and the teachers
  // there are stopped.
  ASSERT_OK(policy_.Submit(Job("b1", 2, 4)));
  EXPECT_EQ(Size("a1"), 4) << "a job shrank while teachers held slots";
  EXPECT_EQ(Size("b1"), 4);
  for (const PolicyEvent& e : policy_.TakeEvents())
    EXPECT_NE(e.kind, "shrink") << e.ToJson().dump();
  const std::vector<Order> o = Step();
  ASSERT_EQ(o.size(), 4u);
  for (const Order& x : o) EXPECT_FALSE(x.start);
  EXPECT_EQ(Teachers(), 0);
  CheckFits(slots);
  EXPECT_EQ(placer_.Summary(clock_.NowMicros())["kd"]["preempted"], 4);
  EXPECT_EQ(placer_.Summary(clock_.NowMicros())["kd"]["restarts"], 0);

  // b1 is scaled down to 2: two slots free, two teachers come back there.
  ASSERT_OK(policy_.Scale("b1", 2));
  EXPECT_EQ(Size("b1"), 2);
  Step();
  EXPECT_EQ(Teachers(), 2);
  EXPECT_EQ(running_["b"], 2);
  CheckFits(slots);
  // a1 finishes: its four slots go to teachers too (b1 is capped at 2), up to the count asked.
  ASSERT_OK(policy_.Finish("a1"));
  Step();
  EXPECT_EQ(Teachers(), 6);
  CheckFits(slots);
  // b1 is scaled back up: it grows into the slots of its node first, where two teachers run;
  // they give way.
  ASSERT_OK(policy_.Scale("b1", 4));
  EXPECT_EQ(Size("b1"), 4);
  const std::map<std::string, int> free = policy_.FreeSlotsByNode();
  Step();
  EXPECT_EQ(Teachers(), free.at("a") + free.at("b"));
  CheckFits(slots);
  EXPECT_EQ(placer_.Summary(clock_.NowMicros())["kd"]["preempted"], 4 + 2);
  // The count stays an upper bound: scaled to 1, the others stop.
  ASSERT_OK(placer_.SetDesired("kd", 1));
  Step();
  EXPECT_EQ(Teachers(), 1);
}

// A node's teacher slots still bound it; and a node that a job fills wholly runs no teacher.
TEST_F(ClusterTeachersTest, TeacherSlotsAndFullNodes) {
  ASSERT_OK(policy_.AddNode({"a", 4, {"t"}}));
  placer_.NodeUp("a", {"kd"}, 1, {}, clock_.NowMicros());
  ASSERT_OK(placer_.SetDesired("kd", 3));
  Step();
  EXPECT_EQ(Teachers(), 1);  // --teacher_slots 1
  ASSERT_OK(policy_.Submit(Job("j", 4, 4)));
  Step();
  EXPECT_EQ(Teachers(), 0);
  EXPECT_TRUE(Step().empty());
}

}  // namespace
}  // namespace edl::jobserver
