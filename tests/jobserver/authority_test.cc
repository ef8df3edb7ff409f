// The cluster's side of "a node speaks only for itself" (PROTOCOL.md "Client -> server"): which
// trainer ids a node may report about, who may register under a node name (session tokens, the
// NodeRegistry), and the bounds on node names and slots that keep every trainer id decodable; the
// same for a one-job server (here) and a cluster server (ANodeNameIsJudgedTheSameWayInBothModes).
#include <gtest/gtest.h>

#include "edl/proto/messages.h"
#include "jobserver/cluster.h"
#include "tests/jobserver/one_job_cluster.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

constexpr char kTokenA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kTokenB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

class AuthorityTest : public ::testing::Test {
 protected:
  AuthorityTest() { Make(0); }
  void Make(int initial_trainers) {
    MembershipOptions o;
    o.initial_trainers = initial_trainers;
    o.job_id = "job";
    o.join_timeout_us = 10'000'000;
    sched_ = std::make_unique<test::OneJobCluster>(o, &clock_);
  }
  // As the server admits a client's hello: the session check, then the registration.
  Status Add(const std::string& name, int slots, const std::string& token,
             const std::vector<std::string>& running = {}) {
    std::vector<int> s;
    for (int i = 0; i < slots; ++i) s.push_back(i);
    EDL_RETURN_IF_ERROR(sched_->CheckAdmission(name, token));
    return sched_->AddNode(name, "127.0.0.1", false, s, running);
  }
  std::vector<std::string> MembersOf(const std::string& node) {
    std::vector<std::string> out;
    for (const auto& m : sched_->current().members) {
      if (m.node == node) out.push_back(m.trainer_id);
    }
    return out;
  }

  ManualClock clock_;
  std::unique_ptr<test::OneJobCluster> sched_;
};

// A second client on a machine (the same advertised host) offering a slot the first offers is
// refused at once, naming both and the fix; disjoint slots, a gone first client, and loopback
// (every node on this one machine, on purpose) are fine.
TEST_F(AuthorityTest, TwoClientsOnOneMachineMayNotOfferTheSameSlot) {
  ASSERT_OK(sched_->AddNode("a", "10.0.0.5", false, {0, 1}));
  const Status s = sched_->AddNode("b", "10.0.0.5", false, {1, 2});
  EXPECT_EQ(s.code(), Status::Code::kAlreadyExists) << s.ToString();
  EXPECT_NE(s.message().find("node b offers slots 1 of host 10.0.0.5, which node a"),
            std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("--gpus 0,1 and --gpus 2,3"), std::string::npos) << s.ToString();
  EXPECT_FALSE(sched_->IsNodeConnected("b"));
  ASSERT_OK(
      sched_->AddNode("c", "10.0.0.5", false, {2, 3}));  // disjoint: two GPU sets of one machine
  ASSERT_OK(sched_->AddNode("d", "10.0.0.6", false, {0, 1}));  // another machine
  ASSERT_OK(sched_->AddNode("e", "127.0.0.1", false, {0, 1}));
  ASSERT_OK(sched_->AddNode("f", "127.0.0.1", false, {0, 1}));  // the one-machine setup
  sched_->NodeDisconnected("a");
  ASSERT_OK(sched_->AddNode("b", "10.0.0.5", false, {0, 1}));  // a's client is gone
}

TEST_F(AuthorityTest, ANodeSpeaksOnlyForTheTrainersPlacedOnIt) {
  // "a-s0" is a legal node name whose trainer ids start like node "a"'s.
  Make(4);
  ASSERT_OK(Add("a", 2, kTokenA));
  ASSERT_OK(Add("a-s0", 2, kTokenB));
  ASSERT_EQ(sched_->current().world_size(), 4);
  const auto mine = MembersOf("a"), theirs = MembersOf("a-s0");
  ASSERT_EQ(mine.size(), 2u);
  ASSERT_EQ(theirs.size(), 2u);
  for (const std::string& id : mine) {
    EXPECT_TRUE(sched_->PlacedOn(id, "a")) << id;
    EXPECT_TRUE(sched_->IsLiveTrainerOf(id, "a")) << id;
    EXPECT_FALSE(sched_->PlacedOn(id, "a-s0")) << id;
  }
  for (const std::string& id : theirs) {
    EXPECT_FALSE(sched_->PlacedOn(id, "a")) << id;
    EXPECT_FALSE(sched_->IsLiveTrainerOf(id, "a")) << id;
    EXPECT_TRUE(sched_->PlacedOn(id, "a-s0")) << id;
  }
  // Ids nobody issued: a future sequence number, another node's shape, junk.
  EXPECT_FALSE(sched_->PlacedOn("a-s0-999", "a"));
  EXPECT_FALSE(sched_->PlacedOn("a-s0-0", "a"));
  EXPECT_FALSE(sched_->PlacedOn("a-s0-1x", "a"));
  EXPECT_FALSE(sched_->PlacedOn("a-s", "a"));
  EXPECT_FALSE(sched_->PlacedOn("b-s0-1", "a"));

  // Shrink to 2: node a-s0's trainers leave. Their node may still report about them (a leaving
  // trainer's last event and exit); node "a" still may not, and they are no longer live.
  sched_->SetDesired(2, "ctl");
  ASSERT_EQ(sched_->current().world_size(), 2);
  for (const std::string& id : theirs) {
    EXPECT_TRUE(sched_->PlacedOn(id, "a-s0")) << id;
    EXPECT_FALSE(sched_->IsLiveTrainerOf(id, "a-s0")) << id;
    EXPECT_FALSE(sched_->PlacedOn(id, "a")) << id;
  }
}

TEST_F(AuthorityTest, PendingJoinersBelongToTheirNode) {
  ASSERT_OK(Add("a", 1, kTokenA));
  ASSERT_EQ(sched_->current().world_size(), 1);
  ASSERT_OK(Add("b", 1, kTokenB));  // grows through a prepare: b's trainer is a pending joiner
  ASSERT_TRUE(sched_->has_pending());
  std::string joiner;
  for (const Action& a : sched_->TakeActions()) {
    if (a.kind == Action::Kind::kPrepare) joiner = a.prepare.joiners.at(0).trainer_id;
  }
  ASSERT_FALSE(joiner.empty());
  EXPECT_TRUE(sched_->IsLiveTrainerOf(joiner, "b"));
  EXPECT_TRUE(sched_->PlacedOn(joiner, "b"));
  EXPECT_FALSE(sched_->PlacedOn(joiner, "a"));
  EXPECT_FALSE(sched_->IsLiveTrainerOf(joiner, "a"));
}

TEST_F(AuthorityTest, ANodeNameIsHeldByItsSessionToken) {
  ASSERT_OK(Add("a", 2, ""));
  const std::string token_a =
      sched_->SessionOf("a");  // issued at the first join, sent in the welcome
  EXPECT_EQ(token_a.size(), proto::kSessionTokenBytes);
  EXPECT_EQ(sched_->SessionOf("nobody"), "");
  // A second client under the same name, without the token or with another: retryable refusal.
  for (const std::string& token : {std::string(), std::string(kTokenB), std::string("short")}) {
    Status s = sched_->CheckAdmission("a", token);
    EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("session token"), std::string::npos) << s.ToString();
  }
  // The node's own client re-attaches with its token, even while the cluster still counts the
  // old connection (the server drops that one first).
  ASSERT_OK(sched_->CheckAdmission("a", token_a));
  // A crashed node's name is not free to take while it may still come back...
  sched_->NodeDisconnected("a");
  EXPECT_EQ(sched_->CheckAdmission("a", kTokenB).code(), Status::Code::kUnavailable);
  ASSERT_OK(Add("a", 2, token_a));  // ...but its own client gets it back, with the same token.
  EXPECT_TRUE(sched_->IsNodeConnected("a"));
  EXPECT_EQ(sched_->SessionOf("a"), token_a);
  // Once the cluster has lost the node (no heartbeat), the name is free for a first join.
  sched_->NodeDisconnected("a");
  clock_.Advance(6'000'000);
  sched_->Tick();
  EXPECT_EQ(sched_->SessionOf("a"), "");
  ASSERT_OK(Add("a", 2, kTokenB));
  EXPECT_NE(sched_->SessionOf("a"), "");
  EXPECT_NE(sched_->SessionOf("a"), token_a);
}

TEST_F(AuthorityTest, NodeNamesAreBoundedSoEveryTrainerIdFits) {
  const std::string longest(proto::kMaxNodeNameBytes, 'n');
  Status s = sched_->CheckAdmission(longest + "x", "");
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("--node_name"), std::string::npos) << s.ToString();
  s = sched_->AddNode(longest + "x", "127.0.0.1", false, {0});  // not by-passable
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  s = sched_->AddNode("many", "127.0.0.1", false, std::vector<int>(proto::kMaxSlotsPerNode + 1, 0));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();

  // The longest legal name on the highest slot: its ids, and the generation carrying them,
  // decode on every client.
  ASSERT_OK(sched_->CheckAdmission(longest, ""));
  ASSERT_OK(sched_->AddNode(longest, "127.0.0.1", false, {65536}));
  ASSERT_EQ(sched_->current().world_size(), 1);
  const std::string& id = sched_->current().members[0].trainer_id;
  EXPECT_TRUE(proto::IsValidName(id)) << id;
  nlohmann::json j;
  proto::GenerationUpdate::Full(sched_->current()).EncodeTo(&j);
  proto::GenerationUpdate u;
  ASSERT_OK(u.DecodeFrom(j));
  proto::GenerationInfo g;
  ASSERT_OK(u.ApplyTo(&g));
  ASSERT_EQ(g.world_size(), 1);
  EXPECT_EQ(g.members[0].trainer_id, id);
}

// One name rule for every server (proto::CheckNodeName): a one-job server and a cluster server
// accept and refuse the same node names with the same message.
TEST_F(AuthorityTest, ANodeNameIsJudgedTheSameWayInBothModes) {
  ClusterOptions many;
  many.heartbeat_timeout_us = 5'000'000;
  Cluster cluster(many, &clock_);
  const std::string longest(proto::kMaxNodeNameBytes, 'n');
  for (const std::string& name :
       {std::string("-gpu1"), std::string(".hidden"), std::string("a/b"), std::string(),
        longest + "x", std::string("gpu1"), std::string("_x"), longest}) {
    const Status one = sched_->CheckAdmission(name, "");
    const Status two = cluster.CheckAdmission(name, "");
    EXPECT_EQ(one.code(), two.code()) << name;
    EXPECT_EQ(one.message(), two.message()) << name;
    EXPECT_EQ(one.ok(), proto::CheckNodeName(name).ok()) << name;
    ClusterNode n;
    n.name = name;
    n.host = "127.0.0.1";
    n.slots = {0};
    n.types.push_back({"t", {}});
    std::string session;
    bool known = false;
    EXPECT_EQ(cluster.AddNode(n, {}, {}, &session, &known).ok(), one.ok())
        << name;  // registration checks it too
    EXPECT_EQ(sched_->AddNode(name, "127.0.0.1", false, {0}).ok(), one.ok()) << name;
  }
  EXPECT_FALSE(sched_->CheckAdmission("-gpu1", "").ok());
  EXPECT_NE(sched_->CheckAdmission("-gpu1", "").message().find("--node_name"), std::string::npos);
}

}  // namespace
}  // namespace edl::jobserver
