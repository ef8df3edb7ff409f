// A one-job server's decisions: the job's membership (job_membership.h) as the Cluster drives it
// for the server's one job (cluster.h), with a ManualClock and no processes.
#include "jobserver/job_membership.h"

#include <gtest/gtest.h>

#include "tests/jobserver/one_job_cluster.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using Kind = Action::Kind;

class JobMembershipTest : public ::testing::Test {
 protected:
  void Make(MembershipOptions o = {}) {
    o.job_id = "job";
    o.join_timeout_us = 10'000'000;
    sched_ = std::make_unique<test::OneJobCluster>(o, &clock_);
  }
  void AddNode(const std::string& name, int slots, bool restart = false) {
    std::vector<int> s;
    for (int i = 0; i < slots; ++i) s.push_back(i);
    ASSERT_OK(sched_->AddNode(name, "127.0.0.1", restart, s, {}));
  }
  std::vector<Action> Take(Kind kind) {
    std::vector<Action> out;
    for (Action& a : sched_->TakeActions()) {
      if (a.kind == kind) out.push_back(std::move(a));
    }
    return out;
  }
  // Every action, for tests that look at several kinds.
  std::vector<Action> All() { return sched_->TakeActions(); }
  static std::vector<Action> Filter(const std::vector<Action>& all, Kind kind) {
    std::vector<Action> out;
    for (const Action& a : all) {
      if (a.kind == kind) out.push_back(a);
    }
    return out;
  }
  void Advance(double seconds) {
    clock_.Advance(static_cast<int64_t>(seconds * 1e6));
    for (const auto& n : sched_->NodeNames()) sched_->Heartbeat(n);
    sched_->Tick();
  }
  void ReadyAll(const std::vector<Action>& prepares) {
    for (const Action& p : prepares) {
      for (const auto& j : p.prepare.joiners)
        sched_->TrainerReady(j.trainer_id, p.prepare.generation);
    }
  }
  const proto::GenerationInfo& cur() { return sched_->current(); }
  // A job of 2 trainers on node "a", started, its actions taken; its generation.
  proto::GenerationInfo StartTwo() {
    MembershipOptions o;
    o.initial_trainers = 2;
    Make(o);
    AddNode("a", 2);
    sched_->TakeActions();
    return cur();
  }

  // A job of 2 trainers on node "a" (`to` slots), started and grown to `to` trainers (its
  // joiners ready, the grow committed, every action taken); the generation it started with.
  proto::GenerationInfo StartTwoAndGrow(int to) {
    MembershipOptions o;
    o.initial_trainers = 2;
    Make(o);
    AddNode("a", to);
    sched_->TakeActions();
    const auto g1 = cur();
    sched_->SetDesired(to, "ctl");
    ReadyAll(Take(Kind::kPrepare));
    sched_->TakeActions();  // the grow's commit
    return g1;
  }

  // A job of 4 trainers on nodes "a" and "b" (2 slots each), started, its actions taken; its
  // generation.
  proto::GenerationInfo StartFourOnTwoNodes() {
    MembershipOptions o;
    o.initial_trainers = 4;
    Make(o);
    AddNode("a", 2);
    AddNode("b", 2);
    sched_->TakeActions();
    return cur();
  }

  // A job of 3 trainers on node "a" (3 slots) with the given failure back-off, started, its
  // actions taken.
  void StartThree(int64_t backoff_min_us) {
    MembershipOptions o;
    o.initial_trainers = 3;
    o.backoff_min_us = backoff_min_us;
    Make(o);
    AddNode("a", 3);
    sched_->TakeActions();
  }

  ManualClock clock_;
  std::unique_ptr<test::OneJobCluster> sched_;
};

// `edl ctl scale N` outside --min_trainers..--max_trainers is refused naming the bounds (it was
// accepted, and status then showed a desired size the job could never reach); nothing changes.
TEST_F(JobMembershipTest, AScaleOutsideTheJobsBoundsIsRefusedNamingThem) {
  MembershipOptions o;
  o.min_trainers = 2;
  o.max_trainers = 4;
  o.initial_trainers = 2;
  Make(o);
  AddNode("a", 8);
  const Status over = sched_->cluster().Scale("", 10);
  EXPECT_EQ(over.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(over.message().find("takes 2..4 trainers"), std::string::npos) << over.ToString();
  EXPECT_NE(over.message().find("--max_trainers"), std::string::npos) << over.ToString();
  const Status under = sched_->cluster().Scale("", 1);
  EXPECT_NE(under.message().find("edl ctl stop"), std::string::npos) << under.ToString();
  EXPECT_EQ(sched_->job().Summary()["desired"], 2) << "a refused scale changed the desired size";
  ASSERT_OK(sched_->cluster().Scale("", 4));
  EXPECT_EQ(sched_->job().Summary()["desired"], 4);
}

TEST_F(JobMembershipTest, StartWaitsForMinTrainers) {
  MembershipOptions o;
  o.min_trainers = 4;
  o.initial_trainers = 4;
  Make(o);
  AddNode("a", 2);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  EXPECT_EQ(cur().generation, 0);
  AddNode("b", 2);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.generation, 1);
  EXPECT_EQ(commits[0].next.reason, "start");
  EXPECT_EQ(commits[0].next.world_size(), 4);
  EXPECT_EQ(commits[0].next.members[0].node, "a");
  EXPECT_EQ(commits[0].next.members[3].node, "b");
  EXPECT_EQ(commits[0].next.master_addr, "127.0.0.1");
}

TEST_F(JobMembershipTest, ShrinkRemovesHighestRanksAtOnce) {
  MembershipOptions o;
  o.initial_trainers = 4;
  Make(o);
  AddNode("a", 4);
  sched_->TakeActions();
  const auto before = cur();
  sched_->SetDesired(2, "script");
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "script");
  EXPECT_FALSE(commits[0].next.failure);
  ASSERT_EQ(commits[0].next.world_size(), 2);
  EXPECT_EQ(commits[0].next.members[0].trainer_id, before.members[0].trainer_id);
  EXPECT_EQ(commits[0].next.members[1].trainer_id, before.members[1].trainer_id);
}

TEST_F(JobMembershipTest, InPlaceGrowthPreparesThenCommitsWhenAllReady) {
  MembershipOptions o;
  o.initial_trainers = 2;
  Make(o);
  AddNode("a", 2);
  AddNode("b", 2);
  sched_->TakeActions();
  const auto g1 = cur();
  sched_->SetDesired(4, "ctl");
  auto all = All();
  auto prepares = Filter(all, Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  EXPECT_EQ(prepares[0].node, "b");
  EXPECT_EQ(prepares[0].prepare.generation, 2);
  EXPECT_EQ(prepares[0].prepare.world_size, 4);
  ASSERT_EQ(prepares[0].prepare.joiners.size(), 2u);
  EXPECT_EQ(prepares[0].prepare.joiners[0].rank, 2);
  EXPECT_TRUE(Filter(all, Kind::kCommit).empty());
  EXPECT_TRUE(sched_->has_pending());
  sched_->TrainerReady(prepares[0].prepare.joiners[0].trainer_id, 2);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  sched_->TrainerReady(prepares[0].prepare.joiners[1].trainer_id, 99);  // wrong generation: ignored
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  sched_->TrainerReady(prepares[0].prepare.joiners[1].trainer_id, 2);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  const auto& g2 = commits[0].next;
  EXPECT_EQ(g2.generation, 2);
  EXPECT_EQ(g2.reason, "ctl");
  ASSERT_EQ(g2.world_size(), 4);
  EXPECT_EQ(g2.members[0].trainer_id, g1.members[0].trainer_id);  // survivors first, same order
  EXPECT_EQ(g2.members[1].trainer_id, g1.members[1].trainer_id);
  EXPECT_EQ(g2.members[2].trainer_id, prepares[0].prepare.joiners[0].trainer_id);
}

TEST_F(JobMembershipTest, JoinTimeoutCommitsReadyOnesAndKillsTheRest) {
  MembershipOptions o;
  o.initial_trainers = 1;
  Make(o);
  AddNode("a", 3);
  sched_->TakeActions();
  sched_->SetDesired(3, "ctl");
  auto prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  const std::string ready = prepares[0].prepare.joiners[0].trainer_id;
  const std::string slow = prepares[0].prepare.joiners[1].trainer_id;
  sched_->TrainerReady(ready, 2);
  Advance(9);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  Advance(2);
  auto all = All();
  auto commits = Filter(all, Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "join_timeout");
  EXPECT_EQ(commits[0].next.world_size(), 2);
  EXPECT_EQ(commits[0].next.RankOf(ready), 1);
  auto kills = Filter(all, Kind::kKill);
  ASSERT_EQ(kills.size(), 1u);
  EXPECT_EQ(kills[0].trainer_ids, std::vector<std::string>{slow});
}

TEST_F(JobMembershipTest, FailureCommitsAtOnceThenGrowsBackAfterBackoff) {
  StartThree(2'000'000);
  const std::string victim = cur().members[1].trainer_id;
  sched_->TrainerExited(victim, /*success=*/false, "signal 9");
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "failure");
  EXPECT_TRUE(commits[0].next.failure);
  EXPECT_EQ(commits[0].next.world_size(), 2);
  EXPECT_EQ(commits[0].next.RankOf(victim), -1);
  Advance(1);
  EXPECT_TRUE(Take(Kind::kPrepare).empty());  // backing off
  Advance(1.5);
  auto prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  ReadyAll(prepares);
  commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "grow_back");
  EXPECT_EQ(commits[0].next.world_size(), 3);
}

// The back-off is for what keeps failing: a member that trained (a progress report, or its first
// step as a joiner) and then died is replaced at once; its replacement, dying before its first
// step, backs off, longer each time; a replacement that stepped is again replaced at once.
TEST_F(JobMembershipTest, TrainedMemberIsReplacedAtOnceAndOnlyWhatFailsAtOnceBacksOff) {
  StartThree(2'000'000);
  for (const auto& m : cur().members) sched_->Progress(m.trainer_id, 10);
  sched_->TrainerExited(cur().members[1].trainer_id, false, "signal 9");
  auto all = All();
  ASSERT_EQ(Filter(all, Kind::kCommit).size(), 1u);
  EXPECT_EQ(cur().world_size(), 2);
  auto prepares = Filter(all, Kind::kPrepare);  // no Advance: the grow-back starts with the failure
  ASSERT_EQ(prepares.size(), 1u);
  ASSERT_EQ(prepares[0].prepare.joiners.size(), 1u);
  const std::string first = prepares[0].prepare.joiners[0].trainer_id;
  ReadyAll(prepares);
  ASSERT_EQ(cur().world_size(), 3);
  EXPECT_EQ(cur().reason, "grow_back");
  // The replacement dies before its first step: what fails at once backs off (2 s).
  sched_->TrainerExited(first, false, "exit 1");
  EXPECT_EQ(cur().world_size(), 2);
  Advance(1.5);
  EXPECT_TRUE(Take(Kind::kPrepare).empty()) << "a replacement that failed at once must back off";
  Advance(1);
  prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  const std::string second = prepares[0].prepare.joiners[0].trainer_id;
  ReadyAll(prepares);
  // The next one also fails at once: the back-off doubles (4 s).
  sched_->TrainerExited(second, false, "exit 1");
  Advance(3.5);
  EXPECT_TRUE(Take(Kind::kPrepare).empty()) << "the back-off must grow";
  Advance(1);
  prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  const std::string third = prepares[0].prepare.joiners[0].trainer_id;
  ReadyAll(prepares);
  // This one steps (its first step as a joiner), then dies: replaced at once again.
  sched_->JoinerFirstStep(third);
  sched_->TrainerExited(third, false, "signal 9");
  EXPECT_EQ(Take(Kind::kPrepare).size(), 1u) << "a replacement that trained is replaced at once";
}

// A member that could not re-form the current generation (and saw nothing newer) gets the same
// members committed again, as a failure generation, once per backoff_min: the members re-form at
// once instead of waiting out their generation wait. Reports about an older generation, from a
// non-member, or with a malformed generation change nothing.
TEST_F(JobMembershipTest, ReformFailureCommitsTheMembersAgainOncePerBackoff) {
  StartThree(1'000'000);
  const auto g1 = cur();
  sched_->ReformFailed(g1.members[2].trainer_id, g1.generation);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.generation, g1.generation + 1);
  EXPECT_EQ(commits[0].next.reason, "reform_retry");
  EXPECT_TRUE(commits[0].next.failure);
  ASSERT_EQ(commits[0].next.world_size(), 3);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(commits[0].next.members[r].trainer_id, g1.members[r].trainer_id);
  // Within the backoff: the same report about the new generation waits.
  sched_->ReformFailed(g1.members[0].trainer_id, g1.generation + 1);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  Advance(1.1);
  sched_->ReformFailed(g1.members[0].trainer_id, g1.generation);  // an older generation: nothing
  sched_->ReformFailed("nobody", g1.generation + 1);              // not a member: nothing
  sched_->Event(g1.members[0].trainer_id,
                {{"event", "reform_failed"}, {"generation", "2"}});  // malformed
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  sched_->ReformFailed(g1.members[0].trainer_id, g1.generation + 1);
  commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.generation, g1.generation + 2);
}

// A grow that races the end of training: the survivors finish (exit 0) right after committing
// it, so its joiners cannot re-form. A joiner's report ends it, even while a member that trained
// has not exited yet: a generation of the finished members alone (reason "finish"), which the
// others leave in place, and the job is done.
TEST_F(JobMembershipTest, ReformFailureWhileFinishingLetsTheUnfinishedLeaveAndTheJobFinish) {
  const auto g1 = StartTwoAndGrow(4);
  ASSERT_EQ(cur().world_size(), 4);
  const auto grown = cur();
  sched_->TrainerExited(g1.members[0].trainer_id, /*success=*/true, "exit 0");
  EXPECT_FALSE(sched_->done());  // member 1 trained and has not exited yet
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  sched_->ReformFailed(grown.members[3].trainer_id, grown.generation);
  auto all = All();
  auto commits = Filter(all, Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "finish");
  EXPECT_FALSE(commits[0].next.failure);
  ASSERT_EQ(commits[0].next.world_size(), 1);
  EXPECT_EQ(commits[0].next.members[0].trainer_id, g1.members[0].trainer_id);
  EXPECT_EQ(Filter(all, Kind::kDone).size(), 1u);
  EXPECT_TRUE(sched_->done());
}

// The same race without the report: once every member that trained has exited 0, the rest are
// joiners that never stepped, whose peers are gone. They would wait out their rendezvous timeout
// before reporting, so the "finish" generation comes at the last trained member's exit.
TEST_F(JobMembershipTest, GrowThatRacedTheEndFinishesAtTheLastTrainedMembersExit) {
  const auto g1 = StartTwoAndGrow(4);
  ASSERT_EQ(cur().world_size(), 4);
  sched_->TrainerExited(g1.members[0].trainer_id, /*success=*/true, "exit 0");
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  EXPECT_FALSE(sched_->done());
  sched_->TrainerExited(g1.members[1].trainer_id, /*success=*/true, "exit 0");
  auto all = All();
  auto commits = Filter(all, Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "finish");
  EXPECT_FALSE(commits[0].next.failure);
  ASSERT_EQ(commits[0].next.world_size(), 2);
  EXPECT_EQ(commits[0].next.members[0].trainer_id, g1.members[0].trainer_id);
  EXPECT_EQ(commits[0].next.members[1].trainer_id, g1.members[1].trainer_id);
  EXPECT_EQ(Filter(all, Kind::kDone).size(), 1u);
  EXPECT_TRUE(sched_->done());
}

// A joiner that took its first step trains in lockstep to the end: it is waited for, and the job
// finishes at its own exit 0, with no "finish" generation.
TEST_F(JobMembershipTest, AJoinerThatSteppedIsWaitedForWhileFinishing) {
  const auto g1 = StartTwoAndGrow(3);
  ASSERT_EQ(cur().world_size(), 3);
  const std::string joiner = cur().members[2].trainer_id;
  sched_->Progress(joiner, 1);  // its first step
  for (int r = 0; r < 2; ++r)
    sched_->TrainerExited(g1.members[r].trainer_id, /*success=*/true, "exit 0");
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  EXPECT_FALSE(sched_->done());
  sched_->TrainerExited(joiner, /*success=*/true, "exit 0");
  auto all = All();
  EXPECT_TRUE(Filter(all, Kind::kCommit).empty());
  EXPECT_EQ(Filter(all, Kind::kDone).size(), 1u);
  EXPECT_TRUE(sched_->done());
}

TEST_F(JobMembershipTest, RepeatedFailuresBackOffLonger) {
  MembershipOptions o;
  o.initial_trainers = 1;
  o.backoff_min_us = 1'000'000;
  Make(o);
  AddNode("a", 1);
  for (int round = 0; round < 3; ++round) {
    sched_->TakeActions();
    sched_->TrainerExited(cur().members[0].trainer_id, false, "exit 1");
    EXPECT_EQ(cur().world_size(), 0);
    const double wait = 1 << round;  // 1 s, 2 s, 4 s
    Advance(wait - 0.5);
    EXPECT_EQ(cur().world_size(), 0) << round;
    Advance(0.6);
    EXPECT_EQ(cur().world_size(), 1) << round;  // nobody to keep training: committed directly
    EXPECT_EQ(cur().reason, "grow_back");
  }
}

TEST_F(JobMembershipTest, HeartbeatLossDropsNodeAndItComesBack) {
  MembershipOptions o;
  o.initial_trainers = 4;
  o.min_trainers = 4;
  o.backoff_min_us = 1'000'000;
  Make(o);
  AddNode("a", 2);
  AddNode("b", 2);
  sched_->TakeActions();
  clock_.Advance(3'000'000);
  sched_->Heartbeat("a");
  clock_.Advance(3'000'000);
  sched_->Heartbeat("a");
  sched_->Tick();  // b silent for 6 s
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "node_loss");
  EXPECT_TRUE(commits[0].next.failure);
  EXPECT_EQ(commits[0].next.world_size(), 2);
  EXPECT_EQ(sched_->connected_nodes(), 1);
  Advance(2);
  AddNode("b", 2);
  Advance(0.1);
  auto prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  EXPECT_EQ(prepares[0].node, "b");
  ReadyAll(prepares);
  commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "grow_back");
  EXPECT_EQ(commits[0].next.world_size(), 4);
}

// A client killed with its trainers: its connection closes, and a member of another node reports
// its collective failed. Either order, the node's members are dead at once (no re-attach, no
// heartbeat timeout), and the record names them; either alone proves nothing.
TEST_F(JobMembershipTest,
       AClosedNodesMembersAreDeadOnceAMemberElsewhereReportsTheGenerationFailed) {
  for (const bool report_first : {false, true}) {
    SCOPED_TRACE(report_first ? "the report first" : "the closed connection first");
    const auto g = StartFourOnTwoNodes();
    ASSERT_EQ(g.world_size(), 4);
    std::vector<std::string> on_b;
    std::string on_a;
    for (const auto& m : g.members)
      (m.node == "b" ? on_b.push_back(m.trainer_id) : void(on_a = m.trainer_id));
    if (report_first) {
      sched_->CommFailed("nobody", g.generation);  // not a member: nothing
      sched_->CommFailed(on_a, g.generation);
      EXPECT_TRUE(Take(Kind::kCommit).empty()) << "no node has closed: nothing to blame";
      sched_->NodeDisconnected("b");
    } else {
      sched_->NodeDisconnected("b");
      EXPECT_TRUE(Take(Kind::kCommit).empty())
          << "a closed connection alone: its trainers may live";
      sched_->CommFailed(on_b[0], g.generation - 1);
      EXPECT_TRUE(Take(Kind::kCommit).empty());
      sched_->CommFailed(on_a, g.generation);
    }
    auto all = All();
    auto commits = Filter(all, Kind::kCommit);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].next.reason, "failure");
    EXPECT_TRUE(commits[0].next.failure);
    ASSERT_EQ(commits[0].next.world_size(), 2);
    for (const auto& m : commits[0].next.members) EXPECT_EQ(m.node, "a");
    int records = 0;
    for (const Action& a : Filter(all, Kind::kEvent)) {
      if (a.event.value("type", "") != "members_lost_with_node") continue;
      ++records;
      EXPECT_EQ(a.event["node"], "b");
      EXPECT_EQ(a.event["trainer_ids"], nlohmann::json(on_b));
      EXPECT_EQ(a.event["generation"], g.generation);
      EXPECT_EQ(a.event["reporter"], on_a);
    }
    EXPECT_EQ(records, 1);
    // The same report again, or about the new generation with no closed node left holding
    // members: nothing more.
    sched_->CommFailed(on_a, g.generation);
    sched_->CommFailed(on_a, cur().generation);
    EXPECT_TRUE(Take(Kind::kCommit).empty());
    // The restarted client re-attaches without them; b's slots are free again.
    ASSERT_OK(sched_->AddNode("b", "127.0.0.1", false, {0, 1}, {}));
    EXPECT_TRUE(Take(Kind::kCommit).empty()) << "they were already gone";
  }
}

// A trainer's exit commits the next generation before a survivor's report about the failed one
// arrives: the report still counts, for a node that closed in that generation.
TEST_F(JobMembershipTest, ALateReportAboutTheFailedGenerationStillDropsAClosedNodesMembers) {
  const auto g = StartFourOnTwoNodes();
  std::vector<std::string> on_a;
  for (const auto& m : g.members) {
    if (m.node == "a") on_a.push_back(m.trainer_id);
  }
  sched_->NodeDisconnected("b");
  sched_->TrainerExited(on_a[1], false, "signal 9");
  ASSERT_EQ(cur().world_size(), 3) << "b's members are still in";
  sched_->TakeActions();
  sched_->CommFailed(on_a[0], g.generation);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "failure");
  ASSERT_EQ(commits[0].next.world_size(), 1);
  EXPECT_EQ(commits[0].next.members[0].trainer_id, on_a[0]);
}

// A failure before a node closed is not its members': they formed the generations after it.
TEST_F(JobMembershipTest, AReportAboutAGenerationBeforeTheNodeClosedDropsNobody) {
  const auto g = StartFourOnTwoNodes();
  std::string on_a;
  for (const auto& m : g.members) {
    if (m.node == "a") on_a = m.trainer_id;
  }
  sched_->SetDesired(3, "ctl");  // a planned change: generation g + 1, all members of b still in
  sched_->TakeActions();
  ASSERT_EQ(cur().generation, g.generation + 1);
  sched_->NodeDisconnected("b");
  sched_->CommFailed(on_a, g.generation);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
}

// A member that cannot re-form, with a closed node holding members: those members are dropped, not
// committed again (reform_retry would wait on them again).
TEST_F(JobMembershipTest, AReformFailureDropsTheMembersOfAClosedNodeInsteadOfRetrying) {
  const auto g = StartFourOnTwoNodes();
  std::string on_a;
  for (const auto& m : g.members) {
    if (m.node == "a") on_a = m.trainer_id;
  }
  sched_->NodeDisconnected("b");
  sched_->ReformFailed(on_a, g.generation);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "failure");
  EXPECT_EQ(commits[0].next.world_size(), 2);
}

// After a server restart, a node that has not re-attached yet has closed nothing in this server's
// lifetime: a survivor's report drops nobody (the restored job waits for its nodes, as before).
TEST_F(JobMembershipTest, ANodeNotYetReattachedAfterARestartIsNotTakenAsDead) {
  const auto g = StartFourOnTwoNodes();
  std::vector<std::string> on_a;
  for (const auto& m : g.members) {
    if (m.node == "a") on_a.push_back(m.trainer_id);
  }
  ClusterState st;
  sched_->Snapshot(&st);
  MembershipOptions o;
  o.initial_trainers = 4;
  Make(o);
  ASSERT_OK(sched_->Restore(st));
  ASSERT_OK(sched_->CheckAdmission("a", st.nodes.at("a").node.session));
  ASSERT_OK(sched_->AddNode("a", "127.0.0.1", false, {0, 1}, on_a));
  sched_->TakeActions();
  sched_->CommFailed(on_a[0], g.generation);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  EXPECT_EQ(cur().world_size(), 4);
}

TEST_F(JobMembershipTest, BoundsClampTheDesiredSize) {
  MembershipOptions o;
  o.min_trainers = 2;
  o.max_trainers = 3;
  o.initial_trainers = 0;  // every free slot, capped by max
  Make(o);
  AddNode("a", 8);
  EXPECT_EQ(cur().world_size(), 3);
  sched_->SetDesired(1, "ctl");
  EXPECT_EQ(cur().world_size(), 2);  // min wins
  sched_->SetDesired(10, "ctl");
  auto prepares = Take(Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  EXPECT_EQ(prepares[0].prepare.joiners.size(), 1u);  // max wins
}

TEST_F(JobMembershipTest, RestartModeReplacesEveryTrainerEachGeneration) {
  MembershipOptions o;
  o.initial_trainers = 3;
  Make(o);
  AddNode("a", 4, /*restart=*/true);
  const auto g1 = cur();
  sched_->TakeActions();
  sched_->SetDesired(2, "script");
  const auto g2 = cur();
  ASSERT_EQ(g2.world_size(), 2);
  for (const auto& m : g2.members) EXPECT_EQ(g1.RankOf(m.trainer_id), -1) << m.trainer_id;
  EXPECT_EQ(g2.members[0].slot, g1.members[0].slot);
  sched_->SetDesired(4, "script");
  EXPECT_TRUE(Take(Kind::kPrepare).empty());  // restart mode: no prepare phase
  EXPECT_EQ(cur().world_size(), 4);
  EXPECT_EQ(cur().generation, 3);
}

TEST_F(JobMembershipTest, ExitZeroFinishesAndTheJobIsDoneWhenAllFinish) {
  const auto g = StartTwo();
  sched_->TrainerExited(g.members[0].trainer_id, true, "exit 0");
  EXPECT_TRUE(Take(Kind::kCommit).empty());  // not replaced
  EXPECT_FALSE(sched_->done());
  sched_->TrainerExited(g.members[1].trainer_id, true, "exit 0");
  EXPECT_TRUE(sched_->done());
  auto all = All();
  EXPECT_EQ(Filter(all, Kind::kDone).size(), 1u);
  bool finished_event = false;
  for (const auto& e : Filter(all, Kind::kEvent)) finished_event |= e.event["type"] == "finished";
  EXPECT_TRUE(finished_event);
  Advance(10);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
}

// Issue 14: rank 0 failing (its final save) after the others finished made a failure generation
// of finished members, which clients then started again. Now the job just finishes.
TEST_F(JobMembershipTest, FailureAfterOthersFinishedMakesNoGenerationAndTheJobFinishes) {
  const auto g = StartTwo();
  sched_->TrainerExited(g.members[1].trainer_id, true, "exit 0");
  sched_->TrainerExited(g.members[0].trainer_id, false, "exit 1");
  auto all = All();
  EXPECT_TRUE(Filter(all, Kind::kCommit).empty()) << "finished members must not be re-formed";
  EXPECT_EQ(Filter(all, Kind::kDone).size(), 1u);
  EXPECT_TRUE(sched_->done());
  EXPECT_EQ(sched_->Summary()["running"], 0);
  EXPECT_EQ(sched_->used_slots(), 0);
  Advance(10);
  EXPECT_TRUE(Take(Kind::kCommit).empty());
}

// `edl ctl stop`: one generation with no members and reason stop, no failure, nothing after it;
// a server restored from that state gathers the size again and resumes above its number.
TEST_F(JobMembershipTest, StopCommitsOneEmptyStopGenerationAndARestoredJobResumes) {
  MembershipOptions o;
  o.initial_trainers = 4;
  Make(o);
  std::vector<proto::MemberInfo> leaving;
  EXPECT_FALSE(sched_->Stop("ctl", &leaving)) << "nothing runs yet";
  AddNode("a", 2);
  AddNode("b", 2);
  sched_->SetDesired(4, "ctl");
  sched_->TakeActions();
  ASSERT_EQ(cur().world_size(), 4);
  const int64_t running = cur().generation;
  ASSERT_TRUE(sched_->Stop("ctl", &leaving));
  EXPECT_EQ(leaving.size(), 4u);
  auto commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, proto::kStopReason);
  EXPECT_FALSE(commits[0].next.failure);
  EXPECT_EQ(commits[0].next.world_size(), 0);
  EXPECT_EQ(commits[0].next.generation, running + 1);
  EXPECT_FALSE(sched_->Stop("ctl", &leaving)) << "one decision";
  for (const auto& m : leaving) sched_->TrainerExited(m.trainer_id, true, "exit 0");
  Advance(10);
  EXPECT_TRUE(Take(Kind::kCommit).empty()) << "no growth, no failure after a stop";
  EXPECT_FALSE(sched_->done());

  ClusterState st;
  sched_->Snapshot(&st);
  Make(o);
  ASSERT_OK(sched_->Restore(st));
  EXPECT_FALSE(sched_->recovering());
  ASSERT_OK(sched_->CheckAdmission("a", st.nodes.at("a").node.session));
  ASSERT_OK(sched_->AddNode("a", "127.0.0.1", false, {0, 1}, {}));
  EXPECT_TRUE(Take(Kind::kCommit).empty()) << "gathers the desired size first, as a first start";
  ASSERT_OK(sched_->AddNode("b", "127.0.0.1", false, {0, 1}, {}));
  commits = Take(Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.reason, "resume");
  EXPECT_EQ(commits[0].next.world_size(), 4);
  EXPECT_GT(commits[0].next.generation, running + 1);
}

TEST_F(JobMembershipTest, LeavingTrainerExitIsNotAFailure) {
  MembershipOptions o;
  o.initial_trainers = 2;
  Make(o);
  AddNode("a", 2);
  const std::string leaving = cur().members[1].trainer_id;
  sched_->SetDesired(1, "ctl");
  sched_->TakeActions();
  sched_->TrainerExited(leaving, true, "exit 0");
  sched_->TrainerExited(leaving, false, "signal 9");
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  EXPECT_EQ(cur().world_size(), 1);
}

TEST_F(JobMembershipTest, KillPicksHighestRanks) {
  MembershipOptions o;
  o.initial_trainers = 4;
  o.min_trainers = 4;
  Make(o);
  AddNode("a", 2);
  AddNode("b", 2);
  sched_->TakeActions();
  sched_->KillTrainers(1);
  auto kills = Take(Kind::kKill);
  ASSERT_EQ(kills.size(), 1u);
  EXPECT_EQ(kills[0].node, "b");
  EXPECT_EQ(kills[0].trainer_ids[0], cur().members[3].trainer_id);
}

TEST_F(JobMembershipTest, KillAllCommitsOneEmptyFailureGenerationThenRestarts) {
  MembershipOptions o;
  o.initial_trainers = 4;
  o.backoff_min_us = 1'000'000;
  Make(o);
  AddNode("a", 2);
  AddNode("b", 2);
  sched_->TakeActions();
  const auto before = cur();
  ASSERT_EQ(before.world_size(), 4);
  sched_->KillAllTrainers();
  auto all = sched_->TakeActions();
  auto kills = Filter(all, Kind::kKill);
  ASSERT_EQ(kills.size(), 2u);  // one per node
  EXPECT_EQ(kills[0].trainer_ids.size() + kills[1].trainer_ids.size(), 4u);
  auto commits = Filter(all, Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);  // one step: nobody re-forms in between
  EXPECT_TRUE(commits[0].next.failure);
  EXPECT_EQ(commits[0].next.world_size(), 0);
  // The deaths arrive later, one by one: expected, no further generation.
  for (const auto& m : before.members) sched_->TrainerExited(m.trainer_id, false, "signal 9");
  EXPECT_TRUE(Take(Kind::kCommit).empty());
  Advance(0.5);
  EXPECT_TRUE(Take(Kind::kCommit).empty());  // backing off
  Advance(1);
  commits = Take(Kind::kCommit);  // nobody holds state: committed at once, no prepare phase
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].next.world_size(), 4);
  for (const auto& m : before.members) EXPECT_EQ(commits[0].next.RankOf(m.trainer_id), -1);
}

TEST_F(JobMembershipTest, DuplicateNodeNameIsRefusedWhileConnected) {
  Make();
  AddNode("a", 1);
  Status s = sched_->AddNode("a", "10.0.0.9", false, {0}, {});
  EXPECT_EQ(s.code(), Status::Code::kAlreadyExists);
  EXPECT_NE(s.message().find("--node_name"), std::string::npos);
  sched_->NodeDisconnected("a");
  EXPECT_OK(sched_->AddNode("a", "10.0.0.9", false, {0}, {cur().members[0].trainer_id}));
  EXPECT_EQ(cur().world_size(), 1);  // re-attached, trainer kept
  EXPECT_EQ(sched_->AddNode("z", "h", false, {}, {}).code(), Status::Code::kInvalidArgument);
}

TEST_F(JobMembershipTest, ReattachWithoutATrainerCountsAsFailure) {
  MembershipOptions o;
  o.initial_trainers = 2;
  Make(o);
  AddNode("a", 2);
  const auto g = cur();
  sched_->NodeDisconnected("a");
  ASSERT_OK(sched_->AddNode("a", "127.0.0.1", false, {0, 1}, {g.members[0].trainer_id}));
  EXPECT_EQ(cur().reason, "failure");
  EXPECT_EQ(cur().world_size(), 1);
}

}  // namespace
}  // namespace edl::jobserver

namespace edl::jobserver {
namespace {

TEST(JobMembershipStartTest, GathersTheInitialSizeOrStartsAfterTheJoinTimeout) {
  ManualClock clock;
  MembershipOptions o;
  o.min_trainers = 1;
  o.initial_trainers = 4;
  o.join_timeout_us = 10'000'000;
  test::OneJobCluster s(o, &clock);
  ASSERT_OK(s.AddNode("a", "h", false, {0, 1}, {}));
  EXPECT_EQ(s.current().generation, 0);  // waiting for 4
  clock.Advance(9'000'000);
  s.Heartbeat("a");
  s.Tick();
  EXPECT_EQ(s.current().generation, 0);
  clock.Advance(1'000'000);
  s.Heartbeat("a");
  s.Tick();
  EXPECT_EQ(s.current().world_size(), 2);  // join timeout: start with what there is
}

}  // namespace
}  // namespace edl::jobserver
