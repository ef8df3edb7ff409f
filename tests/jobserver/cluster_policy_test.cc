#include "jobserver/policy/cluster_policy.h"
#include "edl/proto/names.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

constexpr int64_t kSec = 1'000'000;

class ClusterPolicyTest : public ::testing::Test {
 protected:
  void Make(ClusterPolicyOptions o = {}) { policy_ = std::make_unique<ClusterPolicy>(o, &clock_); }
  void AddNode(const std::string& name, int slots, std::set<std::string> types = {"t"}) {
    ASSERT_OK(policy_->AddNode({name, slots, types}));
    ASSERT_OK(policy_->CheckInvariants());
  }
  static JobSubmission Job(const std::string& name, int min, int max, int priority = 1,
                           bool elastic = true, const std::string& type = "t") {
    JobSubmission j;
    j.name = name;
    j.type = type;
    j.min_trainers = min;
    j.max_trainers = max;
    j.priority = priority;
    j.elastic = elastic;
    return j;
  }
  void Submit(const JobSubmission& j) {
    ASSERT_OK(policy_->Submit(j));
    ASSERT_OK(policy_->CheckInvariants());
  }
  void Finish(const std::string& name) {
    ASSERT_OK(policy_->Finish(name));
    ASSERT_OK(policy_->CheckInvariants());
  }
  void AdvanceTo(double seconds) {
    clock_.Advance(static_cast<int64_t>(seconds * kSec) - (clock_.NowMicros() - t0_));
    policy_->Tick();
    ASSERT_OK(policy_->CheckInvariants());
  }
  int Size(const std::string& name) {
    const PolicyJob* j = policy_->Find(name);
    return j == nullptr ? -1 : j->size;
  }
  bool Running(const std::string& name) {
    const PolicyJob* j = policy_->Find(name);
    return j != nullptr && j->state == JobPhase::kRunning;
  }
  std::string Reason(const std::string& name) {
    const PolicyJob* j = policy_->Find(name);
    return j == nullptr ? "(gone)" : j->pending_reason;
  }
  // Events of `kind` for `job` since the last Take.
  std::vector<PolicyEvent> Take(const std::string& kind = "", const std::string& job = "") {
    std::vector<PolicyEvent> out;
    for (PolicyEvent& e : policy_->TakeEvents()) {
      if ((kind.empty() || e.kind == kind) && (job.empty() || e.job == job)) out.push_back(e);
    }
    return out;
  }

  ManualClock clock_;
  const int64_t t0_ = clock_.NowMicros();
  std::unique_ptr<ClusterPolicy> policy_;
};

TEST_F(ClusterPolicyTest, GangStartWaitsUntilMinFits) {
  Make();
  AddNode("a", 2);
  AddNode("b", 2);
  Submit(Job("big", 6, 8));
  EXPECT_FALSE(Running("big"));
  EXPECT_NE(Reason("big").find("the live nodes offering it have 4 slots"), std::string::npos)
      << Reason("big");
  EXPECT_EQ(policy_->used_slots(), 0);  // no partial start
  AddNode("c", 2);
  EXPECT_TRUE(Running("big"));
  EXPECT_EQ(Size("big"), 6);
  auto starts = Take("start", "big");
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].from, 0);
  EXPECT_EQ(starts[0].to, 6);
  EXPECT_NE(starts[0].reason.find("gang start"), std::string::npos) << starts[0].reason;

  // A job whose min does not fit in the free slots waits for them, holding nothing.
  Make();
  AddNode("a", 4);
  Submit(Job("fixed", 3, 3, 1, /*elastic=*/false));
  Submit(Job("y", 2, 4));
  EXPECT_FALSE(Running("y"));
  EXPECT_EQ(Size("y"), 0);
  EXPECT_NE(Reason("y").find("waiting for 2 slots"), std::string::npos) << Reason("y");
  Finish("fixed");
  EXPECT_TRUE(Running("y"));
  EXPECT_EQ(Size("y"), 4);  // starts directly at its share, not at min then a re-form
}

TEST_F(ClusterPolicyTest, NewJobShrinksEqualPriorityJobToFairShareAndItGrowsBack) {
  Make();
  AddNode("a", 8);
  Submit(Job("A", 2, 8));
  EXPECT_EQ(Size("A"), 8);
  Take();
  Submit(Job("B", 2, 8));
  EXPECT_EQ(Size("A"), 4);
  EXPECT_EQ(Size("B"), 4);
  auto shrinks = Take("shrink", "A");
  ASSERT_EQ(shrinks.size(), 1u);  // one re-form, not one per step of the decision
  EXPECT_EQ(shrinks[0].from, 8);
  EXPECT_EQ(shrinks[0].to, 4);
  EXPECT_NE(shrinks[0].reason.find("make room for job B"), std::string::npos) << shrinks[0].reason;
  Finish("B");
  EXPECT_EQ(Size("A"), 8);
  auto grows = Take("grow", "A");
  ASSERT_EQ(grows.size(), 1u);
  EXPECT_NE(grows[0].reason.find("fair share"), std::string::npos) << grows[0].reason;
}

TEST_F(ClusterPolicyTest, HigherPriorityJobShrinksLowerOnesTowardMin) {
  Make();
  AddNode("a", 4);
  AddNode("b", 4);
  Submit(Job("A", 2, 8));
  Submit(Job("B", 2, 8));
  EXPECT_EQ(Size("A"), 4);
  EXPECT_EQ(Size("B"), 4);
  Take();
  Submit(Job("C", 4, 4, /*priority=*/5));
  EXPECT_TRUE(Running("C"));
  EXPECT_EQ(Size("C"), 4);
  EXPECT_EQ(Size("A"), 2);  // at min, never below
  EXPECT_EQ(Size("B"), 2);
  for (const auto& e : Take("shrink")) {
    EXPECT_NE(e.reason.find("make room for job C (priority 5)"), std::string::npos) << e.reason;
  }
  // A lower-priority job cannot shrink anyone: A and B are at min, C outranks it.
  Submit(Job("D", 2, 8));
  EXPECT_FALSE(Running("D"));
  EXPECT_NE(Reason("D").find("0 free, 0 reclaimable"), std::string::npos) << Reason("D");
  Finish("C");
  EXPECT_TRUE(Running("D"));
  EXPECT_EQ(Size("A") + Size("B") + Size("D"), 8);
  for (const std::string j : {"A", "B", "D"}) EXPECT_GE(Size(j), 2) << j;
}

TEST_F(ClusterPolicyTest, PendingJobNeverShrinksHigherPriorityJobs) {
  Make();
  AddNode("a", 8);
  Submit(Job("hi", 2, 8, /*priority=*/3));
  EXPECT_EQ(Size("hi"), 8);
  Submit(Job("lo", 1, 8, /*priority=*/1));
  EXPECT_FALSE(Running("lo"));
  EXPECT_EQ(Size("hi"), 8);
}

TEST_F(ClusterPolicyTest, FairShareIsWeightedByPriority) {
  Make();
  AddNode("a", 8);
  Submit(Job("low", 1, 16, 1));
  Submit(Job("high", 1, 16, 3));
  // Weighted max-min from min 1 each: high gets 3 slots per slot of low.
  EXPECT_EQ(Size("high"), 6);
  EXPECT_EQ(Size("low"), 2);

  Make();
  AddNode("a", 9);
  Submit(Job("x", 1, 16));
  Submit(Job("y", 1, 16));
  Submit(Job("z", 1, 16));
  EXPECT_EQ(Size("x"), 3);
  EXPECT_EQ(Size("y"), 3);
  EXPECT_EQ(Size("z"), 3);
  // Max bounds a share; what it cannot use goes to the others.
  Make();
  AddNode("a", 9);
  Submit(Job("small", 1, 2));
  Submit(Job("large", 1, 16));
  EXPECT_EQ(Size("small"), 2);
  EXPECT_EQ(Size("large"), 7);
}

TEST_F(ClusterPolicyTest, HighPriorityJobThatCannotFitShrinksNobody) {
  Make();
  AddNode("a", 8);
  Submit(Job("A", 2, 4));
  Submit(Job("B", 2, 4));
  Take();
  Submit(Job("C", 7, 7, /*priority=*/10));  // 8 - 2 - 2 = 4 < 7: it cannot fit above the mins
  EXPECT_FALSE(Running("C"));
  EXPECT_EQ(Size("A"), 4);
  EXPECT_EQ(Size("B"), 4);
  EXPECT_TRUE(Take("shrink").empty());
  // It holds the queue behind it: a smaller job of the same type waits too (no starvation).
  Submit(Job("D", 1, 1, 10));
  EXPECT_FALSE(Running("D"));
  EXPECT_NE(Reason("D").find("queued behind job C"), std::string::npos) << Reason("D");
  ASSERT_OK(policy_->Cancel("A"));
  // 4 free + 2 above B's min = 6 < 7: C still cannot start, so B is not shrunk, and the freed
  // slots are held for C rather than given to B.
  EXPECT_FALSE(Running("C"));
  EXPECT_EQ(Size("B"), 4);
  EXPECT_EQ(policy_->used_slots(), 4);
  Finish("B");
  EXPECT_TRUE(Running("C"));
  EXPECT_TRUE(Running("D"));
}

TEST_F(ClusterPolicyTest, RateLimitHoldsEachJobToOneChangePerInterval) {
  ClusterPolicyOptions o;
  o.min_change_interval_us = 60 * kSec;
  Make(o);
  AddNode("a", 8);
  Submit(Job("A", 2, 8));  // t = 0: starts at 8
  EXPECT_EQ(Size("A"), 8);
  AdvanceTo(10);
  Submit(Job("B", 2, 8));
  EXPECT_FALSE(Running("B"));  // A started less than 60 s ago: it may not be shrunk yet
  EXPECT_EQ(policy_->NextWakeupMicros(), t0_ + 60 * kSec);
  AdvanceTo(59.9);
  EXPECT_FALSE(Running("B"));
  AdvanceTo(60);
  EXPECT_TRUE(Running("B"));
  EXPECT_EQ(Size("A"), 4);
  EXPECT_EQ(Size("B"), 4);
  AdvanceTo(70);
  Finish("B");
  EXPECT_EQ(Size("A"), 4);  // changed at 60: grows back at 120, not before
  AdvanceTo(119);
  EXPECT_EQ(Size("A"), 4);
  EXPECT_EQ(policy_->NextWakeupMicros(), t0_ + 120 * kSec);
  AdvanceTo(120);
  EXPECT_EQ(Size("A"), 8);
}

TEST_F(ClusterPolicyTest, NodeLossAffectsSeveralJobsAtOnce) {
  Make();
  AddNode("a", 6);
  AddNode("b", 6);
  Submit(Job("A", 2, 4));  // a:4
  Submit(Job("B", 2, 4));  // b:4 (the node with most free slots)
  Submit(Job("C", 2, 4));  // a:2 b:2
  ASSERT_EQ(policy_->Find("A")->placement, (Placement{{"a", 4}}));
  ASSERT_EQ(policy_->Find("B")->placement, (Placement{{"b", 4}}));
  ASSERT_EQ(policy_->Find("C")->placement, (Placement{{"a", 2}, {"b", 2}}));
  Take();
  ASSERT_OK(policy_->NodeLost("a"));
  ASSERT_OK(policy_->CheckInvariants());
  // A lost all 4 and is repaired to its min by shrinking B (equal priority) on b; C keeps 2.
  EXPECT_EQ(Size("A"), 2);
  EXPECT_EQ(Size("B"), 2);
  EXPECT_EQ(Size("C"), 2);
  auto events = Take();
  std::vector<std::string> seen;
  for (const auto& e : events) seen.push_back(e.kind + ":" + e.job + e.node);
  // The loss itself, then the pass's changes in submission order.
  EXPECT_EQ(seen, (std::vector<std::string>{"shrink:A", "shrink:C", "node_lost:a", "grow:A",
                                            "shrink:B"}));
  EXPECT_NE(events[2].reason.find("A:4->0"), std::string::npos) << events[2].reason;
  EXPECT_NE(events[2].reason.find("C:4->2"), std::string::npos) << events[2].reason;
  EXPECT_NE(events[3].reason.find("repair after node loss"), std::string::npos) << events[3].reason;
  EXPECT_NE(events[4].reason.find("make room for job A"), std::string::npos) << events[4].reason;

  // Losing the last node requeues every job; each says why, and they restart when a node joins.
  ASSERT_OK(policy_->NodeLost("b"));
  ASSERT_OK(policy_->CheckInvariants());
  for (const std::string j : {"A", "B", "C"}) {
    EXPECT_FALSE(Running(j)) << j;
    EXPECT_NE(Reason(j).find("no live node offers job type 't'"), std::string::npos) << Reason(j);
  }
  EXPECT_EQ(Take("requeue").size(), 3u);
  AddNode("c", 6);
  for (const std::string j : {"A", "B", "C"}) EXPECT_EQ(Size(j), 2) << j;
}

TEST_F(ClusterPolicyTest, NodeLossRequeuesJobThatCannotBeRepaired) {
  Make();
  AddNode("a", 4);
  AddNode("b", 4);
  Submit(Job("R", 4, 4, 1, /*elastic=*/false));  // a:4
  Submit(Job("E", 4, 4, 5));                     // b:4, priority 5
  ASSERT_EQ(policy_->Find("R")->placement, (Placement{{"a", 4}}));
  Take();
  ASSERT_OK(policy_->NodeLost("a"));
  ASSERT_OK(policy_->CheckInvariants());
  EXPECT_FALSE(Running("R"));  // nothing free, E outranks it
  EXPECT_NE(Reason("R").find("waiting for 4 slots"), std::string::npos) << Reason("R");
  auto requeues = Take("requeue", "R");
  ASSERT_EQ(requeues.size(), 1u);
  EXPECT_NE(requeues[0].reason.find("a lost node left 0 of the 4 trainers it needs"),
            std::string::npos)
      << requeues[0].reason;
  EXPECT_EQ(Size("E"), 4);
  AddNode("c", 4);
  EXPECT_TRUE(Running("R"));
  EXPECT_EQ(Size("R"), 4);
}

TEST_F(ClusterPolicyTest, JobWhoseTypeNoNodeOffersStaysPendingAndBlocksNobody) {
  ClusterPolicyOptions o;
  o.known_types = {"gpu"};
  Make(o);
  AddNode("cpu1", 4, {"cpu"});
  Submit(Job("g", 1, 2, 5, true, "gpu"));
  EXPECT_FALSE(Running("g"));
  EXPECT_EQ(Reason("g"), "no live node offers job type 'gpu'");
  auto pending = Take("pending", "g");
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].reason, "no live node offers job type 'gpu'");
  Submit(Job("c", 1, 8, 1, true, "cpu"));
  EXPECT_EQ(Size("c"), 4);
  policy_->Tick();
  EXPECT_TRUE(Take("pending", "g").empty());  // the same reason is logged once
  AddNode("gpu1", 2, {"gpu"});
  EXPECT_EQ(policy_->Find("g")->placement, (Placement{{"gpu1", 2}}));
  EXPECT_EQ(policy_->Find("c")->placement, (Placement{{"cpu1", 4}}));  // never on a gpu-only node
}

TEST_F(ClusterPolicyTest, RestartModeJobsAreNeverResized) {
  Make();
  AddNode("a", 8);
  Submit(Job("R", 4, 4, 1, /*elastic=*/false));
  Submit(Job("E", 1, 8, 1));
  EXPECT_EQ(Size("R"), 4);
  EXPECT_EQ(Size("E"), 4);
  Submit(Job("H", 3, 3, 10));  // shrinks E toward its min; R is of lower priority but fixed
  EXPECT_EQ(Size("R"), 4);
  EXPECT_EQ(Size("E"), 1);
  EXPECT_EQ(Size("H"), 3);
  Finish("H");
  EXPECT_EQ(Size("R"), 4);
  EXPECT_EQ(Size("E"), 4);
  for (const auto& e : Take("", "R")) {
    EXPECT_TRUE(e.kind == "submit" || e.kind == "start") << e.kind << " " << e.reason;
  }
  const Status s = policy_->Scale("R", 2);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("restart mode"), std::string::npos) << s.ToString();
}

TEST_F(ClusterPolicyTest, ScaleCapsAJobWithinMinMax) {
  Make();
  AddNode("a", 8);
  Submit(Job("A", 2, 8));
  ASSERT_OK(policy_->Scale("A", 3));
  EXPECT_EQ(Size("A"), 3);
  auto s = Take("shrink", "A");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NE(s[0].reason.find("scale request 3"), std::string::npos) << s[0].reason;
  ASSERT_OK(policy_->Scale("A", 8));
  EXPECT_EQ(Size("A"), 8);
  EXPECT_EQ(policy_->Scale("A", 9).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->Scale("A", 1).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->Scale("nope", 2).code(), Status::Code::kNotFound);
}

TEST_F(ClusterPolicyTest, BadInputIsRefusedAndChangesNothing) {
  ClusterPolicyOptions o;
  o.known_types = {"t"};
  Make(o);
  AddNode("a", 4);
  Submit(Job("A", 1, 4));
  Submit(Job("W", 2, 2, 1, false));  // A (elastic, equal priority) shrinks to make room
  AdvanceTo(5);
  Take();
  const std::string before = policy_->Summary().dump();

  struct Case {
    JobSubmission job;
    Status::Code code;
    std::string says;
  };
  JobSubmission past = Job("late", 1, 1);
  past.deadline_us = clock_.NowMicros() - 1;
  std::vector<Case> cases = {
      {Job("x", 4, 2), Status::Code::kInvalidArgument, "min_trainers 4 > max_trainers 2"},
      {Job("x", 0, 2), Status::Code::kInvalidArgument, "is below 1"},
      {Job("x", 1, 2, 1, true, "gpu"), Status::Code::kInvalidArgument,
       "unknown job type 'gpu': no node has declared it; known types: t"},
      {Job("A", 1, 2), Status::Code::kAlreadyExists, "already pending or running"},
      {Job("W", 1, 2), Status::Code::kAlreadyExists, "already pending or running"},
      {Job("x", 1, 3, 1, false), Status::Code::kInvalidArgument, "set them equal"},
      {Job("x", 1, 2, 0), Status::Code::kInvalidArgument, "priority 0 is outside 1..1000"},
      {Job("x", 1, 2, 1001), Status::Code::kInvalidArgument, "priority 1001"},
      {Job("x", 1, kMaxJobTrainers + 1), Status::Code::kInvalidArgument, "above the limit"},
      {Job("", 1, 2), Status::Code::kInvalidArgument, "job name is empty"},
      {Job("a/b", 1, 2), Status::Code::kInvalidArgument, "has a character other than"},
      {Job(std::string(200, 'x'), 1, 2), Status::Code::kInvalidArgument, "200 bytes"},
      {Job("x", 1, 2, 1, true, ""), Status::Code::kInvalidArgument, "job type of job x is empty"},
      {past, Status::Code::kInvalidArgument, "deadline has already passed"},
  };
  for (const Case& c : cases) {
    const Status s = policy_->Submit(c.job);
    EXPECT_EQ(s.code(), c.code) << c.says << " -> " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
    EXPECT_EQ(policy_->Summary().dump(), before) << c.says;
    EXPECT_TRUE(policy_->TakeEvents().empty()) << c.says;
  }
  // Nodes and other inputs alike.
  EXPECT_EQ(policy_->AddNode({"a", 4, {"t"}}).code(), Status::Code::kAlreadyExists);
  EXPECT_EQ(policy_->AddNode({"b", 0, {"t"}}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->AddNode({"b", static_cast<int>(proto::kMaxSlotsPerNode) + 1, {"t"}}).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->AddNode({"b", 4, {}}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->AddNode({"b c", 4, {"t"}}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->AddNode({"b", 4, {"t;rm"}}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->NodeLost("zz").code(), Status::Code::kNotFound);
  EXPECT_EQ(policy_->Finish("zz").code(), Status::Code::kNotFound);
  EXPECT_EQ(policy_->Cancel("zz").code(), Status::Code::kNotFound);
  EXPECT_EQ(policy_->Scale("A", 5).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(policy_->Summary().dump(), before);
  EXPECT_TRUE(policy_->TakeEvents().empty());
  // A pending job cannot finish; it can be cancelled.
  Submit(Job("P", 4, 4, 1, false));
  ASSERT_FALSE(Running("P"));
  EXPECT_EQ(policy_->Finish("P").code(), Status::Code::kFailedPrecondition);
  EXPECT_OK(policy_->Cancel("P"));
  EXPECT_EQ(policy_->Find("P"), nullptr);
}

TEST_F(ClusterPolicyTest, MonitorLineAndSummary) {
  Make();
  AddNode("a", 8);
  Submit(Job("example", 1, 10));
  Submit(Job("example1", 1, 8));
  Submit(Job("example2", 9, 9, 1, false));
  EXPECT_EQ(policy_->RunningTrainers(), "example:4|example1:4|example2:0");
  const auto s = policy_->Summary();
  EXPECT_EQ(s["submitted_jobs"], 3);
  EXPECT_EQ(s["pending_jobs"], 1);
  EXPECT_EQ(s["used_slots"], 8);
}

TEST_F(ClusterPolicyTest, DeadlineOrdersAdmissionAndIsLoggedWhenItPasses) {
  Make();
  AddNode("a", 2);
  Submit(Job("first", 2, 2, 1, false));
  JobSubmission late = Job("late", 2, 2, 1, false);
  late.deadline_us = t0_ + 1000 * kSec;
  JobSubmission soon = Job("soon", 2, 2, 1, false);
  soon.deadline_us = t0_ + 100 * kSec;
  Submit(late);
  Submit(soon);
  Finish("first");
  EXPECT_TRUE(Running("soon"));  // earlier deadline first at equal priority
  EXPECT_FALSE(Running("late"));
  Take();
  EXPECT_EQ(policy_->NextWakeupMicros(), t0_ + 100 * kSec);
  AdvanceTo(100);
  auto d = Take("deadline_passed");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job, "soon");
  EXPECT_EQ(d[0].reason, "still running");
}

// Many random inputs; after each one the invariants hold, and the decision log obeys the policy.
void RandomRun(uint64_t seed, ClusterPolicyOptions o, int steps) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " preempt " + std::to_string(o.preempt) +
               " interval " + std::to_string(o.min_change_interval_us) + " policy " +
               kPolicyKindNames.Name(o.kind));
  ManualClock clock;
  o.known_types = {"a", "b", "c"};
  ClusterPolicy p(o, &clock);
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::string> types = {"a", "b", "c"};
  std::vector<std::string> nodes;
  int next_node = 0, next_job = 0;
  std::map<std::string, int64_t> last_change;  // job -> time of its last size change
  std::map<std::string, JobSubmission> specs;
  int starts = 0, finishes = 0, preempt_shrinks = 0, requeues = 0, reports = 0;
  for (int step = 0; step < steps; ++step) {
    const int what = uni(0, 99);
    std::vector<std::string> live;
    for (const auto& [n, j] : p.jobs()) live.push_back(n);
    if (what < 6 || nodes.empty()) {
      PolicyNode n;
      n.name = "n" + std::to_string(next_node++);
      n.slots = uni(1, 8);
      for (const auto& t : types) {
        if (uni(0, 2) > 0) n.job_types.insert(t);
      }
      if (n.job_types.empty()) n.job_types.insert("a");
      ASSERT_OK(p.AddNode(n));
      nodes.push_back(n.name);
    } else if (what < 10) {
      const size_t i = uni(0, static_cast<int>(nodes.size()) - 1);
      ASSERT_OK(p.NodeLost(nodes[i]));
      nodes.erase(nodes.begin() + i);
    } else if (what < 35) {
      JobSubmission j;
      j.name = "j" + std::to_string(next_job++);
      j.type = types[uni(0, 2)];
      j.elastic = uni(0, 4) > 0;
      j.min_trainers = uni(1, 6);
      j.max_trainers = j.elastic ? j.min_trainers + uni(0, 10) : j.min_trainers;
      j.priority = uni(1, 4);
      ASSERT_OK(p.Submit(j));
      specs[j.name] = j;
    } else if (what < 62 && !live.empty()) {
      const std::string& j = live[uni(0, static_cast<int>(live.size()) - 1)];
      if (p.Find(j)->state == JobPhase::kRunning) {
        ASSERT_OK(p.Finish(j));
      } else {
        ASSERT_OK(p.Cancel(j));
      }
    } else if (what < 67 && !live.empty()) {
      const std::string& j = live[uni(0, static_cast<int>(live.size()) - 1)];
      const JobSubmission& s = specs[j];
      const Status st = p.Scale(j, uni(s.min_trainers, s.max_trainers));
      ASSERT_EQ(st.ok(), s.elastic) << st.ToString();
    } else if (o.kind == PolicyKind::kGoodput && what < 80 && !live.empty()) {
      // A model from the job's trainers: random scaling, now and then out of range or with
      // limits that contradict each other (refused, and nothing changes).
      const std::string& j = live[uni(0, static_cast<int>(live.size()) - 1)];
      GoodputModel m;
      m.throughput.grad_fixed_s = uni(1, 100) * 1e-3;
      m.throughput.grad_per_sample_s = uni(0, 100) * 1e-5;
      m.throughput.intra_fixed_s = uni(0, 100) * 1e-3;
      m.throughput.intra_per_trainer_s = uni(0, 10) * 1e-3;
      m.throughput.inter_fixed_s = uni(0, 1000) * 1e-3;
      m.throughput.inter_per_trainer_s = uni(0, 100) * 1e-3;
      m.throughput.overlap = 1 + uni(0, 9);
      m.noise_scale = uni(0, 3) == 0 ? 0 : uni(1, 100000);
      m.batch = {uni(1, 64), 0, uni(1, 16), 0};
      m.batch.max_batch = m.batch.base_batch * uni(1, 64);
      m.batch.max_local = m.batch.min_local * uni(1, 32);
      m.measured_trainers = uni(0, 8);
      m.reform_s = uni(0, 60);
      if (uni(0, 9) == 0) m.batch.max_local = 0;       // contradicts min_local
      if (uni(0, 19) == 0) m.throughput.overlap = 20;  // out of range
      const bool had = p.Find(j)->has_goodput;
      const Status st = p.ReportGoodput(j, m);
      if (!st.ok()) {
        ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
        ASSERT_EQ(p.Find(j)->has_goodput, had) << "a refused model changed the job";
      } else {
        ++reports;
      }
    } else {
      clock.Advance(uni(0, 30) * kSec);
      p.Tick();
    }
    const Status inv = p.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv.ToString();
    const int64_t now = clock.NowMicros();
    const std::vector<PolicyEvent> events = p.TakeEvents();
    std::string log;
    for (const PolicyEvent& e : events) log += e.ToJson().dump() + "\n";
    for (const PolicyEvent& e : events) {
      ASSERT_FALSE(e.reason.empty()) << e.kind << " " << e.job;
      if (e.job.empty()) continue;
      const JobSubmission& s = specs[e.job];
      const bool forced = e.reason.find("lost") != std::string::npos ||
                          e.reason.find("repair") != std::string::npos;
      if (e.kind == "start") {
        ++starts;
        ASSERT_GE(e.to, s.min_trainers) << "gang start below min: " << e.job;
        last_change[e.job] = now;
      } else if (e.kind == "grow" || e.kind == "shrink" || e.kind == "move") {
        if (!s.elastic) {
          ASSERT_TRUE(forced) << "restart-mode job resized: " << e.reason;
        }
        if (!forced && o.min_change_interval_us > 0 && last_change.count(e.job)) {
          ASSERT_GE(now - last_change[e.job], o.min_change_interval_us)
              << e.job << " changed twice within the interval: " << e.reason;
        }
        last_change[e.job] = now;
        const auto room = e.reason.find("make room for job ");
        if (room != std::string::npos) {
          ++preempt_shrinks;
          ASSERT_TRUE(o.preempt) << e.reason;
          std::string by = e.reason.substr(room + 18);
          by = by.substr(0, by.find(' '));
          ASSERT_LE(s.priority, specs[by].priority) << "shrank for a lower-priority job";
        }
      } else if (e.kind == "finish") {
        ++finishes;
      } else if (e.kind == "requeue") {
        ++requeues;
      }
    }
    // With no pending job and no rate limit, no slot that an elastic job below its cap could use
    // stays free (grow back when slots free). Not under kGoodput, where a slot that raises no
    // job's goodput stays free and a job without a model runs at the probe size.
    if (o.kind == PolicyKind::kFairShare && o.min_change_interval_us == 0 &&
        p.pending_jobs() == 0) {
      for (const auto& [name, j] : p.jobs()) {
        if (!j.spec.elastic || j.size >= std::min(j.cap, j.spec.max_trainers)) continue;
        ASSERT_EQ(p.FreeSlots(j.spec.type), 0)
            << name << " at " << j.size
            << " below its cap while slots of its type are free: " << p.Summary().dump()
            << "\nafter:\n"
            << log;
      }
    }
  }
  // The run exercised what it checks.
  EXPECT_GT(starts, 50);
  EXPECT_GT(finishes, 50);
  if (o.kind == PolicyKind::kFairShare) {  // the goodput policy leaves jobs smaller: less of both
    EXPECT_GT(requeues, 0);
    if (o.preempt) {
      EXPECT_GT(preempt_shrinks, 0);
    }
  }
  if (o.kind == PolicyKind::kGoodput) {
    EXPECT_GT(reports, 100);
  }
}

TEST(ClusterPolicyRandomTest, InvariantsHoldUnderRandomEvents) {
  for (uint64_t seed : {1, 2, 3}) {
    for (bool preempt : {true, false}) {
      for (int64_t interval : {int64_t{0}, 20 * kSec}) {
        ClusterPolicyOptions o;
        o.preempt = preempt;
        o.min_change_interval_us = interval;
        RandomRun(seed, o, 3000);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The same under the goodput policy, with random goodput models reported as it runs; a job
// without a model gets its whole fair share in half of the runs, the probe size in the others.
TEST(ClusterPolicyRandomTest, InvariantsHoldUnderRandomEventsWithTheGoodputPolicy) {
  for (uint64_t seed : {4, 5, 6}) {
    for (bool preempt : {true, false}) {
      for (int64_t interval : {int64_t{0}, 20 * kSec}) {
        ClusterPolicyOptions o;
        o.kind = PolicyKind::kGoodput;
        o.preempt = preempt;
        o.min_change_interval_us = interval;
        o.goodput.probe_trainers = seed % 2 == 0 ? 0 : 1;
        RandomRun(seed, o, 3000);
        if (HasFatalFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace edl::jobserver
