// The node agent's rules (jobclient/node_agent.h) without sockets, processes or threads: the test
// plays the server (welcomes and frames), the trainers (frames on numbered channels), the shell's
// process table (starts, exits, stopped probes) and time (a ManualClock and Tick), and checks the
// actions the agent asks for after each input. Nothing here waits or sleeps.
#include "jobclient/node_agent.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "edl/proto/frame.h"
#include "edl/runtime/env_contract.h"
#include "tests/testutil.h"

namespace edl::jobclient {
namespace {

using Kind = AgentAction::Kind;
using launcher::ExitInfo;
using nlohmann::json;
namespace env = launcher::env;

proto::MemberInfo Placed(const std::string& id, const std::string& node, int slot, int rank) {
  proto::MemberInfo m;
  m.trainer_id = id;
  m.node = node;
  m.slot = slot;
  m.rank = rank;
  m.host = "127.0.0.1";
  return m;
}

ExitInfo Exited(int code) {
  ExitInfo info;
  info.exited = true;
  info.code = code;
  return info;
}

// The actions of `kind` among `acts`, in order.
std::vector<AgentAction> OfKind(const std::vector<AgentAction>& acts, Kind kind) {
  std::vector<AgentAction> out;
  for (const AgentAction& a : acts) {
    if (a.kind == kind) out.push_back(a);
  }
  return out;
}

// The ids of the actions of `kind`, in order.
std::vector<std::string> IdsOf(const std::vector<AgentAction>& acts, Kind kind) {
  std::vector<std::string> out;
  for (const AgentAction& a : OfKind(acts, kind)) out.push_back(a.id);
  return out;
}

// The frames of type `type` that `acts` send to the server, in order.
std::vector<json> ToServer(const std::vector<AgentAction>& acts, const std::string& type) {
  std::vector<json> out;
  for (const AgentAction& a : OfKind(acts, Kind::kSendServer)) {
    if (proto::TypeOf(a.frame) == type) out.push_back(a.frame);
  }
  return out;
}

// The frames of type `type` that `acts` send on channel `ch` (sent, or sent before a close).
std::vector<json> ToChannel(const std::vector<AgentAction>& acts, ChannelId ch,
                            const std::string& type) {
  std::vector<json> out;
  for (const AgentAction& a : acts) {
    if ((a.kind == Kind::kSendChannel || a.kind == Kind::kSendAndCloseChannel) && a.channel == ch &&
        proto::TypeOf(a.frame) == type) {
      out.push_back(a.frame);
    }
  }
  return out;
}

class NodeAgentTest : public ::testing::Test {
 protected:
  NodeAgentTest() {
    options_.node_name = "n1";
    options_.slots = {0, 1};
    options_.gpu_slots = true;
    options_.socket_path = "/run/edl/n1.sock";
    options_.log_dir = "/var/log/edl";
    options_.stop_grace_ms = 5000;
    options_.leave_grace_ms = 30000;
    options_.trainer_timeout_ms = 20000;
    options_.stopped_silence_ms = 400;
    options_.trainer_argv = {"/opt/trainer", "--epochs", "3"};
    options_.spares = 0;  // the spares cases turn them on
  }

  // The agent, made with options_ at first use (a case may change them before).
  NodeAgent& agent() {
    if (!agent_) agent_ = std::make_unique<NodeAgent>(options_, &clock_);
    return *agent_;
  }

  // Actions since the last call; every start is answered as the shell does when it succeeds.
  std::vector<AgentAction> Take() {
    std::vector<AgentAction> acts = agent().TakeActions();
    for (const AgentAction& a : acts) {
      if (a.kind == Kind::kStartTrainer || a.kind == Kind::kStartSpare) {
        agent().OnProcessStarted(a.id, next_pid_++);
      }
    }
    std::vector<AgentAction> more = agent().TakeActions();
    acts.insert(acts.end(), more.begin(), more.end());
    return acts;
  }

  void ServerUp(bool dropped = false) {
    proto::Welcome w;
    w.job_id = "job7";
    w.heartbeat_ms = 1000;
    w.dropped = dropped;
    agent().OnServerUp(w);
  }

  void Generation(int64_t n, std::vector<proto::MemberInfo> members,
                  const std::string& reason = "script") {
    proto::GenerationInfo g;
    g.generation = n;
    g.job_id = "job7";
    g.reason = reason;
    g.members = std::move(members);
    g.master_addr = "127.0.0.1";
    g.master_port = 29500 + static_cast<int>(n);
    agent().OnGeneration(proto::GenerationUpdate::Full(g));
  }

  // A new channel saying trainer_hello as `id`.
  ChannelId TrainerHello(const std::string& id) {
    const ChannelId ch = next_channel_++;
    proto::TrainerHello h;
    h.trainer_id = id;
    agent().OnChannelFrame(ch, h.Encoded());
    return ch;
  }
  ChannelId SpareHello(const std::string& id) {
    const ChannelId ch = next_channel_++;
    proto::SpareHello h;
    h.spare_id = id;
    agent().OnChannelFrame(ch, h.Encoded());
    return ch;
  }

  void Exit(const std::string& id, ExitInfo info, const std::string& last_line = "") {
    ProcessExit e;
    e.id = id;
    e.info = info;
    e.last_log_line = last_line;
    agent().OnProcessExited(e);
  }

  void Tick() { agent().Tick(clock_.NowMicros()); }

  // Connected, generation 1 with n1-a on slot 0 and n1-b on slot 1, both started and connected.
  void TwoTrainersRunning() {
    ServerUp();
    Generation(1, {Placed("n1-a", "n1", 0, 0), Placed("n1-b", "n1", 1, 1)}, "start");
    ASSERT_EQ(IdsOf(Take(), Kind::kStartTrainer), (std::vector<std::string>{"n1-a", "n1-b"}));
    a_ = TrainerHello("n1-a");
    b_ = TrainerHello("n1-b");
    Take();
  }

  NodeAgentOptions options_;
  ManualClock clock_;
  std::unique_ptr<NodeAgent> agent_;
  int next_pid_ = 70000;
  ChannelId next_channel_ = 1;
  ChannelId a_ = 0, b_ = 0;
};

// ---- trainers start with their env, and hear the generation on their channel

TEST_F(NodeAgentTest, GenerationStartsThisNodesMembersWithTheirEnvAndPushesItToTheirChannels) {
  ServerUp();
  Generation(1,
             {Placed("n1-a", "n1", 1, 0), Placed("n2-a", "n2", 0, 1), Placed("n1-b", "n1", 0, 2)},
             "start");
  const std::vector<AgentAction> starts = OfKind(Take(), Kind::kStartTrainer);
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].id, "n1-a");
  EXPECT_EQ(starts[0].spec.argv, options_.trainer_argv);
  EXPECT_EQ(starts[0].spec.log_path, "/var/log/edl/n1-a.log");
  EXPECT_EQ(starts[0].spec.env.at(env::kJobId), "job7");
  EXPECT_EQ(starts[0].spec.env.at(env::kSlot), "1");
  EXPECT_EQ(starts[0].spec.env.at(env::kCudaVisibleDevices), "1");
  EXPECT_EQ(starts[0].spec.env.at(env::kWorldSize), "3");
  EXPECT_EQ(starts[0].spec.env.at(env::kLocalWorldSize), "2");
  EXPECT_EQ(starts[1].spec.env.at(env::kRank), "2");
  EXPECT_EQ(starts[1].spec.env.at(env::kLocalRank), "1");
  const ChannelId ch = TrainerHello("n1-b");
  const std::vector<AgentAction> acts = Take();
  ASSERT_EQ(OfKind(acts, Kind::kSetChannelIdle).size(), 1u);
  EXPECT_EQ(OfKind(acts, Kind::kSetChannelIdle)[0].idle_ms, 0)
      << "liveness is the agent's from now on";
  EXPECT_EQ(ToChannel(acts, ch, proto::msg::kWelcome).size(), 1u);
  ASSERT_EQ(ToChannel(acts, ch, proto::msg::kGeneration).size(), 1u);
  // The next generation travels as a delta against the one the channel holds.
  Generation(2, {Placed("n1-a", "n1", 1, 0), Placed("n1-b", "n1", 0, 1)});
  const std::vector<json> pushed = ToChannel(Take(), ch, proto::msg::kGeneration);
  ASSERT_EQ(pushed.size(), 1u);
  proto::GenerationUpdate u;
  ASSERT_OK(u.DecodeFrom(pushed[0]));
  EXPECT_EQ(u.base_generation, 1);
}

TEST_F(NodeAgentTest, TrainerHelloOfAnIdNotStartedHereIsRefused) {
  ServerUp();
  const ChannelId ch = TrainerHello("n1-zz");
  const std::vector<AgentAction> acts = Take();
  ASSERT_EQ(OfKind(acts, Kind::kSendAndCloseChannel).size(), 1u);
  EXPECT_EQ(OfKind(acts, Kind::kSendAndCloseChannel)[0].channel, ch);
  EXPECT_EQ(OfKind(acts, Kind::kSendAndCloseChannel)[0].status.code(),
            Status::Code::kFailedPrecondition);
  EXPECT_EQ(ToChannel(acts, ch, proto::msg::kError).size(), 1u);
}

// ---- reconnect

TEST_F(NodeAgentTest, OutboxQueuedWhileDisconnectedIsSentOnceOnTheNextWelcome) {
  TwoTrainersRunning();
  agent().OnServerDown(Status::IOError("the server went away"));
  EXPECT_FALSE(agent().connected());
  proto::Ready r;
  r.generation = 1;
  agent().OnChannelFrame(a_, r.Encoded());
  proto::Progress p;
  p.report.step = 5;
  agent().OnChannelFrame(a_, p.Encoded());  // progress is not kept: the next one replaces it
  Exit("n1-b", Exited(3), "RuntimeError: boom");
  std::vector<AgentAction> acts = Take();
  EXPECT_TRUE(OfKind(acts, Kind::kSendServer).empty()) << "nothing goes to a server that is away";
  EXPECT_EQ(agent().outbox_size(), 2u);
  ServerUp();
  acts = Take();
  const std::vector<AgentAction> sent = OfKind(acts, Kind::kSendServer);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(proto::TypeOf(sent[0].frame), proto::msg::kReady);
  EXPECT_EQ(sent[0].frame["trainer_id"], "n1-a");
  proto::TrainerExit e;
  ASSERT_OK(e.DecodeFrom(sent[1].frame));
  EXPECT_EQ(e.trainer_id, "n1-b");
  EXPECT_EQ(e.code, 3);
  EXPECT_EQ(e.error, "RuntimeError: boom");
  EXPECT_EQ(agent().outbox_size(), 0u);
  // Another reconnect sends none of it again.
  agent().OnServerDown(Status::IOError("again"));
  ServerUp();
  EXPECT_TRUE(OfKind(Take(), Kind::kSendServer).empty());
}

TEST_F(NodeAgentTest, FullOutboxDropsAndCountsTheRest) {
  options_.max_outbox = 2;
  TwoTrainersRunning();
  agent().OnServerDown(Status::IOError("away"));
  proto::Ready r;
  for (int i = 1; i <= 3; ++i) {
    r.generation = i;
    agent().OnChannelFrame(a_, r.Encoded());
  }
  EXPECT_EQ(agent().outbox_size(), 2u);
  EXPECT_EQ(agent().outbox_dropped(), 1);
  Take();
  ServerUp();
  const std::vector<json> ready = ToServer(Take(), proto::msg::kReady);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0]["generation"], 1);
  EXPECT_EQ(ready[1]["generation"], 2);
}

TEST_F(NodeAgentTest, KvRequestsPendingAtADisconnectAreAnsweredUnavailable) {
  TwoTrainersRunning();
  proto::KvRequest r;
  r.req_id = 42;
  r.op = proto::KvOp::kWait;
  r.key = "gen/1/gloo/0";
  r.timeout_ms = 3'600'000;
  agent().OnChannelFrame(a_, r.Encoded());
  ASSERT_EQ(ToServer(Take(), proto::msg::kKv).size(), 1u);
  agent().OnServerDown(Status::IOError("connection reset"));
  std::vector<json> replies = ToChannel(Take(), a_, proto::msg::kKvReply);
  ASSERT_EQ(replies.size(), 1u);
  proto::KvReply rep;
  ASSERT_OK(rep.DecodeFrom(replies[0]));
  EXPECT_EQ(rep.req_id, 42u) << "the trainer's own id";
  EXPECT_EQ(rep.status.code(), Status::Code::kUnavailable);
  EXPECT_NE(rep.status.message().find("lost its server connection"), std::string::npos)
      << rep.status.ToString();
  // While the server is away a request is answered at once and not sent anywhere.
  r.req_id = 43;
  agent().OnChannelFrame(b_, r.Encoded());
  const std::vector<AgentAction> acts = Take();
  EXPECT_TRUE(OfKind(acts, Kind::kSendServer).empty());
  replies = ToChannel(acts, b_, proto::msg::kKvReply);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_OK(rep.DecodeFrom(replies[0]));
  EXPECT_EQ(rep.req_id, 43u);
  EXPECT_EQ(rep.status.code(), Status::Code::kUnavailable);
}

TEST_F(NodeAgentTest, DroppedWelcomeStopsEveryStaleTrainer) {
  TwoTrainersRunning();
  agent().OnServerDown(Status::IOError("cut off"));
  ServerUp(/*dropped=*/true);
  EXPECT_EQ(IdsOf(Take(), Kind::kTerminate), (std::vector<std::string>{"n1-a", "n1-b"}));
  clock_.Advance(options_.stop_grace_ms * 1000 - 1);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kKill).empty());
  clock_.Advance(1);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kKill), (std::vector<std::string>{"n1-a", "n1-b"}));
  // A dropped welcome with nothing running stops nothing.
  Exit("n1-a", ExitInfo());
  Exit("n1-b", ExitInfo());
  Take();
  agent().OnServerDown(Status::IOError("again"));
  ServerUp(/*dropped=*/true);
  EXPECT_TRUE(OfKind(Take(), Kind::kTerminate).empty());
}

TEST_F(NodeAgentTest, HelloListsMembersAndPreparedJoinersWithTheirGenerations) {
  TwoTrainersRunning();
  proto::Prepare p;
  p.generation = 3;
  p.job_id = "job7";
  p.world_size = 3;
  p.joiners = {Placed("n1-j", "n1", 1, 2)};  // slot 1 is n1-b's: the joiner waits for it
  agent().OnPrepare(p);
  EXPECT_TRUE(OfKind(Take(), Kind::kStartTrainer).empty());
  Generation(2, {Placed("n1-a", "n1", 0, 0)});  // n1-b leaves; the joiner is for generation 3
  Take();
  proto::Hello h;
  agent().FillHello(&h);
  EXPECT_EQ(h.trainers, (std::vector<std::string>{"n1-a"}));
  EXPECT_EQ(h.trainer_generations, (std::vector<int64_t>{2}));
  Exit("n1-b", Exited(0));  // slot 1 frees: the joiner starts
  EXPECT_EQ(IdsOf(Take(), Kind::kStartTrainer), (std::vector<std::string>{"n1-j"}));
  h = proto::Hello();
  agent().FillHello(&h);
  EXPECT_EQ(h.trainers, (std::vector<std::string>{"n1-a", "n1-j"}));
  EXPECT_EQ(h.trainer_generations, (std::vector<int64_t>{2, 3}));
}

// ---- warm spares

TEST_F(NodeAgentTest, SpareStartsOnceTrainersRunAndBecomesTheNextTrainer) {
  options_.spares = 1;
  ServerUp();
  Generation(1, {Placed("n1-a", "n1", 0, 0)}, "start");
  Take();
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty()) << "n1-a still prepares";
  const ChannelId a = TrainerHello("n1-a");
  Take();
  Tick();
  std::vector<AgentAction> acts = Take();
  const std::vector<AgentAction> spares = OfKind(acts, Kind::kStartSpare);
  ASSERT_EQ(spares.size(), 1u);
  EXPECT_EQ(spares[0].id, "n1-spare-1");
  EXPECT_EQ(spares[0].spec.argv, options_.trainer_argv);
  EXPECT_EQ(spares[0].spec.log_path, "/var/log/edl/n1-spare-1.log");
  EXPECT_EQ(spares[0].spec.env.at(env::kSpare),
            "host");  // GPU slots: the GPU comes with the assignment
  EXPECT_EQ(spares[0].spec.env.count(env::kCudaVisibleDevices), 0u);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty()) << "one spare at a time";
  const ChannelId s = SpareHello("n1-spare-1");
  acts = Take();
  EXPECT_EQ(ToChannel(acts, s, proto::msg::kWelcome).size(), 1u);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty()) << "the job has its one spare";
  // A spare's channel carries heartbeats only.
  agent().OnChannelFrame(s, proto::Heartbeat().Encoded());
  EXPECT_TRUE(Take().empty());
  // The next trainer is the spare's process.
  Generation(2, {Placed("n1-a", "n1", 0, 0), Placed("n1-b", "n1", 1, 1)});
  acts = Take();
  EXPECT_TRUE(OfKind(acts, Kind::kStartTrainer).empty()) << "no process is started for n1-b";
  const std::vector<AgentAction> handed = OfKind(acts, Kind::kHandOverSpare);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].id, "n1-spare-1");
  EXPECT_EQ(handed[0].to_id, "n1-b");
  EXPECT_EQ(handed[0].channel, s);
  EXPECT_EQ(handed[0].from_log, "/var/log/edl/n1-spare-1.log");
  EXPECT_EQ(handed[0].to_log, "/var/log/edl/n1-b.log");
  proto::SpareAssign assign;
  ASSERT_OK(assign.DecodeFrom(handed[0].frame));
  EXPECT_EQ(assign.env[env::kTrainerId], "n1-b");
  EXPECT_EQ(assign.env[env::kCudaVisibleDevices], "1");
  EXPECT_EQ(assign.env[env::kRank], "1");
  EXPECT_EQ(assign.env.count(env::kSpare), 0u);
  // It connects again as n1-b; its process's end is n1-b's.
  const ChannelId b = TrainerHello("n1-b");
  EXPECT_EQ(ToChannel(Take(), b, proto::msg::kWelcome).size(), 1u);
  Exit("n1-b", Exited(0));
  const std::vector<json> exits = ToServer(Take(), proto::msg::kTrainerExit);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0]["trainer_id"], "n1-b");
  (void)a;
}

TEST_F(NodeAgentTest, SpareThatEndsBeforeItIsAssignedBacksOffDoubling) {
  options_.spares = 1;
  ServerUp();
  Generation(1, {Placed("n1-a", "n1", 0, 0)}, "start");
  Take();
  TrainerHello("n1-a");
  Tick();
  ASSERT_EQ(IdsOf(Take(), Kind::kStartSpare), (std::vector<std::string>{"n1-spare-1"}));
  Exit("n1-spare-1", Exited(1), "ImportError: no module");
  EXPECT_TRUE(ToServer(Take(), proto::msg::kTrainerExit).empty())
      << "a spare is no trainer of the job";
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty()) << "backs off 1 s";
  clock_.Advance(1'000'000);
  Tick();
  ASSERT_EQ(IdsOf(Take(), Kind::kStartSpare), (std::vector<std::string>{"n1-spare-2"}));
  Exit("n1-spare-2", Exited(1));
  clock_.Advance(1'999'999);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty()) << "the second failure in a row: 2 s";
  clock_.Advance(1);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kStartSpare), (std::vector<std::string>{"n1-spare-3"}));
}

TEST_F(NodeAgentTest, SpareThatSaysTrainerHelloTurnsSparesOffForTheJob) {
  options_.spares = 1;
  ServerUp();
  Generation(1, {Placed("n1-a", "n1", 0, 0)}, "start");
  Take();
  TrainerHello("n1-a");
  Tick();
  ASSERT_EQ(IdsOf(Take(), Kind::kStartSpare), (std::vector<std::string>{"n1-spare-1"}));
  const ChannelId ch = TrainerHello("n1-spare-1");  // a command that does not wait as a spare
  std::vector<AgentAction> acts = Take();
  ASSERT_EQ(OfKind(acts, Kind::kSendAndCloseChannel).size(), 1u);
  EXPECT_EQ(OfKind(acts, Kind::kSendAndCloseChannel)[0].channel, ch);
  EXPECT_EQ(IdsOf(acts, Kind::kTerminate), (std::vector<std::string>{"n1-spare-1"}));
  // Released: its end is no failure, and no spare of the job is started again.
  Exit("n1-spare-1", ExitInfo());
  Take();
  clock_.Advance(3600'000'000);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartSpare).empty());
}

TEST_F(NodeAgentTest, ReleasedSpareThatIgnoresSigtermIsKilledAfterTheGrace) {
  options_.spares = 1;
  ServerUp();
  Generation(1, {Placed("n1-a", "n1", 0, 0)}, "start");
  Take();
  TrainerHello("n1-a");
  Tick();
  ASSERT_EQ(IdsOf(Take(), Kind::kStartSpare).size(), 1u);
  agent().OnDone();
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kTerminate), (std::vector<std::string>{"n1-spare-1"}));
  clock_.Advance(options_.stop_grace_ms * 1000);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kKill), (std::vector<std::string>{"n1-spare-1"}));
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kKill).empty()) << "once";
}

// ---- KV routing

TEST_F(NodeAgentTest, KvRequestIdsAreRewrittenAndEachReplyGoesBackUnderItsTrainersOwnId) {
  TwoTrainersRunning();
  proto::KvRequest r;
  r.req_id = 7;
  r.op = proto::KvOp::kGet;
  r.key = "k";
  agent().OnChannelFrame(a_, r.Encoded());
  agent().OnChannelFrame(b_, r.Encoded());  // the same id from another trainer
  const std::vector<json> sent = ToServer(Take(), proto::msg::kKv);
  ASSERT_EQ(sent.size(), 2u);
  proto::KvRequest fa, fb;
  ASSERT_OK(fa.DecodeFrom(sent[0]));
  ASSERT_OK(fb.DecodeFrom(sent[1]));
  EXPECT_NE(fa.req_id, fb.req_id);
  EXPECT_EQ(fa.job, "") << "the welcome's job keeps the unscoped form";
  proto::KvReply rep;
  rep.req_id = fb.req_id;
  rep.value = "for b";
  agent().OnKvReply(rep);
  std::vector<AgentAction> acts = Take();
  EXPECT_TRUE(ToChannel(acts, a_, proto::msg::kKvReply).empty());
  std::vector<json> got = ToChannel(acts, b_, proto::msg::kKvReply);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_OK(rep.DecodeFrom(got[0]));
  EXPECT_EQ(rep.req_id, 7u);
  EXPECT_EQ(rep.value, "for b");
  rep.req_id = fa.req_id;
  agent().OnKvReply(rep);
  EXPECT_EQ(ToChannel(Take(), a_, proto::msg::kKvReply).size(), 1u);
  agent().OnKvReply(rep);  // answered already: the route is gone
  EXPECT_TRUE(Take().empty());
}

TEST_F(NodeAgentTest, KvReplyForATrainerThatIsGoneIsDropped) {
  TwoTrainersRunning();
  proto::KvRequest r;
  r.req_id = 9;
  r.key = "k";
  agent().OnChannelFrame(a_, r.Encoded());
  proto::KvRequest f;
  const std::vector<json> sent = ToServer(Take(), proto::msg::kKv);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_OK(f.DecodeFrom(sent[0]));
  Exit("n1-a", Exited(1));
  Take();
  proto::KvReply rep;
  rep.req_id = f.req_id;
  agent().OnKvReply(rep);
  EXPECT_TRUE(OfKind(Take(), Kind::kSendChannel).empty());
}

// ---- trainer exits

TEST_F(NodeAgentTest, ExitIsReportedOnceAndTheSlotsQueuedStartRuns) {
  TwoTrainersRunning();
  // n1-a leaves slot 0 to n1-c: n1-c waits until n1-a has exited.
  Generation(2, {Placed("n1-b", "n1", 1, 0), Placed("n1-c", "n1", 0, 1)});
  EXPECT_TRUE(OfKind(Take(), Kind::kStartTrainer).empty());
  Exit("n1-a", Exited(0));
  std::vector<AgentAction> acts = Take();
  const std::vector<json> exits = ToServer(acts, proto::msg::kTrainerExit);
  ASSERT_EQ(exits.size(), 1u);
  proto::TrainerExit e;
  ASSERT_OK(e.DecodeFrom(exits[0]));
  EXPECT_EQ(e.trainer_id, "n1-a");
  EXPECT_TRUE(e.success());
  EXPECT_EQ(e.error, "");
  ASSERT_EQ(OfKind(acts, Kind::kCloseChannel).size(), 1u);
  EXPECT_EQ(OfKind(acts, Kind::kCloseChannel)[0].channel, a_);
  const std::vector<AgentAction> starts = OfKind(acts, Kind::kStartTrainer);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].id, "n1-c");
  EXPECT_EQ(starts[0].spec.env.at(env::kSlot), "0");
  EXPECT_EQ(starts[0].spec.env.at(env::kGeneration), "2");
  Exit("n1-a", Exited(0));  // the shell cannot report it twice; the agent would not either
  EXPECT_TRUE(Take().empty());
}

TEST_F(NodeAgentTest, EndedMemberIsNotStartedAgainByALaterGenerationListingIt) {
  TwoTrainersRunning();
  ExitInfo lost;
  lost.lost = true;
  Exit("n1-a", lost, "Segmentation fault");
  const std::vector<json> exits = ToServer(Take(), proto::msg::kTrainerExit);
  ASSERT_EQ(exits.size(), 1u);
  proto::TrainerExit e;
  ASSERT_OK(e.DecodeFrom(exits[0]));
  EXPECT_FALSE(e.success()) << "a lost child is never a success";
  EXPECT_EQ(e.code, 1);
  EXPECT_EQ(e.error, "Segmentation fault");
  // A generation sent before the server heard of the exit still lists n1-a.
  Generation(2,
             {Placed("n1-a", "n1", 0, 0), Placed("n1-b", "n1", 1, 1), Placed("n2-a", "n2", 0, 2)});
  EXPECT_TRUE(OfKind(Take(), Kind::kStartTrainer).empty());
}

TEST_F(NodeAgentTest, StartThatFailsIsReportedAsExit127) {
  ServerUp();
  Generation(1, {Placed("n1-a", "n1", 0, 0)}, "start");
  ASSERT_EQ(IdsOf(agent().TakeActions(), Kind::kStartTrainer), (std::vector<std::string>{"n1-a"}));
  agent().OnProcessStartFailed("n1-a", Status::NotFound("/opt/trainer: no such file"));
  const std::vector<json> exits = ToServer(Take(), proto::msg::kTrainerExit);
  ASSERT_EQ(exits.size(), 1u);
  proto::TrainerExit e;
  ASSERT_OK(e.DecodeFrom(exits[0]));
  EXPECT_EQ(e.code, 127);
  EXPECT_NE(e.error.find("no such file"), std::string::npos) << e.error;
  EXPECT_FALSE(agent().has_trainers());
}

TEST_F(NodeAgentTest, JoinerTheCommitLeavesOutIsKilled) {
  TwoTrainersRunning();
  Generation(2, {Placed("n1-a", "n1", 0, 0)});
  Exit("n1-b", Exited(0));
  Take();
  proto::Prepare p;
  p.generation = 3;
  p.job_id = "job7";
  p.world_size = 2;
  p.joiners = {Placed("n1-j", "n1", 1, 1), Placed("n1-x", "n1", 7, 2)};  // slot 7 is not ours
  agent().OnPrepare(p);
  const std::vector<AgentAction> starts = OfKind(Take(), Kind::kStartTrainer);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].id, "n1-j");
  EXPECT_EQ(starts[0].spec.env.at(env::kJoining), "1");
  EXPECT_EQ(starts[0].spec.env.at(env::kLocalRank), "0");
  Generation(3, {Placed("n1-a", "n1", 0, 0)}, "join_timeout");
  const std::vector<AgentAction> acts = Take();
  EXPECT_EQ(IdsOf(acts, Kind::kKill), (std::vector<std::string>{"n1-j"}));
  EXPECT_TRUE(OfKind(acts, Kind::kTerminate).empty());
}

// ---- graces and liveness on the manual clock

TEST_F(NodeAgentTest, LeaverGetsItsGraceThenSigtermThenSigkill) {
  options_.trainer_timeout_ms = 3600 * 1000;  // the channels stay quiet meanwhile
  TwoTrainersRunning();
  Generation(2, {Placed("n1-a", "n1", 0, 0)});
  EXPECT_TRUE(OfKind(Take(), Kind::kTerminate).empty()) << "in place, a leaver exits by itself";
  clock_.Advance(options_.leave_grace_ms * 1000 - 1);
  Tick();
  std::vector<AgentAction> acts = Take();
  EXPECT_TRUE(OfKind(acts, Kind::kTerminate).empty());
  clock_.Advance(1);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kTerminate), (std::vector<std::string>{"n1-b"}));
  clock_.Advance(options_.stop_grace_ms * 1000 - 1);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kKill).empty());
  clock_.Advance(1);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kKill), (std::vector<std::string>{"n1-b"}));
  Tick();
  acts = Take();
  EXPECT_TRUE(OfKind(acts, Kind::kKill).empty()) << "once";
  EXPECT_TRUE(OfKind(acts, Kind::kTerminate).empty());
}

TEST_F(NodeAgentTest, RestartModeStopsALeaverAtOnce) {
  options_.restart_mode = true;
  TwoTrainersRunning();
  Generation(2, {Placed("n1-c", "n1", 0, 0), Placed("n2-a", "n2", 0, 1)});
  const std::vector<AgentAction> acts = Take();
  EXPECT_EQ(IdsOf(acts, Kind::kTerminate), (std::vector<std::string>{"n1-a", "n1-b"}));
  EXPECT_TRUE(OfKind(acts, Kind::kStartTrainer).empty()) << "slot 0 is still n1-a's";
  Exit("n1-a", Exited(0));
  EXPECT_EQ(IdsOf(Take(), Kind::kStartTrainer), (std::vector<std::string>{"n1-c"}));
}

TEST_F(NodeAgentTest, SilentTrainerIsKilledAfterTheTimeout) {
  TwoTrainersRunning();
  const int64_t timeout_us = options_.trainer_timeout_ms * 1000;
  clock_.Advance(timeout_us - 1000);
  agent().OnChannelFrame(b_, proto::Heartbeat().Encoded());  // n1-b keeps talking
  clock_.Advance(999);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kKill).empty());
  clock_.Advance(2);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kKill), (std::vector<std::string>{"n1-a"}));
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kKill).empty()) << "once";
}

TEST_F(NodeAgentTest, SilentTrainerFoundStoppedIsKilledWithoutWaitingForTheTimeout) {
  TwoTrainersRunning();
  clock_.Advance(options_.stopped_silence_ms * 1000);
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kProbeStopped).empty()) << "not yet past the silence";
  clock_.Advance(1);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kProbeStopped), (std::vector<std::string>{"n1-a", "n1-b"}));
  agent().OnChannelFrame(b_, proto::Heartbeat().Encoded());  // n1-b spoke since the probe
  agent().OnProcessStopped("n1-b");
  agent().OnProcessStopped("n1-a");
  EXPECT_EQ(IdsOf(Take(), Kind::kKill), (std::vector<std::string>{"n1-a"}));
  clock_.Advance(1'000'000);
  Tick();
  EXPECT_EQ(IdsOf(Take(), Kind::kProbeStopped), (std::vector<std::string>{"n1-b"}))
      << "n1-a is killed";
}

// ---- channels

TEST_F(NodeAgentTest, MalformedEventIsDroppedWithoutClosingTheChannel) {
  TwoTrainersRunning();
  json bad = {{"type", proto::msg::kEvent}, {"event", {{"event", 5}}}};
  agent().OnChannelFrame(a_, bad);
  bad["event"] = {{"event", "comm_failed"}, {"generation", "one"}};
  agent().OnChannelFrame(a_, bad);
  EXPECT_TRUE(Take().empty()) << "neither relayed nor closed";
  const json good = {{"type", proto::msg::kEvent}, {"event", {{"event", "sync"}}}};
  agent().OnChannelFrame(a_, good);
  const std::vector<json> events = ToServer(Take(), proto::msg::kEvent);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["trainer_id"], "n1-a");
  // A frame that does not decode is another matter: the channel is closed.
  agent().OnChannelFrame(a_, json{{"type", proto::msg::kReady}, {"generation", "x"}});
  const std::vector<AgentAction> closes = OfKind(Take(), Kind::kCloseChannel);
  ASSERT_EQ(closes.size(), 1u);
  EXPECT_EQ(closes[0].channel, a_);
  // The trainer may connect again once the channel is gone.
  agent().OnChannelClosed(a_, closes[0].status);
  const ChannelId again = TrainerHello("n1-a");
  EXPECT_EQ(ToChannel(Take(), again, proto::msg::kWelcome).size(), 1u);
}

TEST_F(NodeAgentTest, ServiceWatchIsAskedOnceAndRenewedOnEveryWelcome) {
  TwoTrainersRunning();
  proto::ServiceWatch w;
  w.service = "teacher";
  agent().OnChannelFrame(a_, w.Encoded());
  agent().OnChannelFrame(b_, w.Encoded());
  EXPECT_EQ(ToServer(Take(), proto::msg::kServiceWatch).size(), 1u);
  proto::ServiceMembers m;
  m.service = "teacher";
  agent().OnServiceMembers(m);
  std::vector<AgentAction> acts = Take();
  EXPECT_EQ(ToChannel(acts, a_, proto::msg::kServiceMembers).size(), 1u);
  EXPECT_EQ(ToChannel(acts, b_, proto::msg::kServiceMembers).size(), 1u);
  agent().OnServerDown(Status::IOError("away"));
  ServerUp();
  EXPECT_EQ(ToServer(Take(), proto::msg::kServiceWatch).size(), 1u);
}

// ---- job info, stop and shutdown

TEST_F(NodeAgentTest, JobInfoIsTakenOnlyForTheNodesTypesAndSettableFlags) {
  options_.trainer_argv.clear();
  options_.job_types["resnet"] = {{"/opt/resnet"}, {"lr"}};
  ServerUp();
  proto::JobInfo info;
  info.job_id = "j1";
  info.job_type = "resnet";
  info.flags = {{"epochs", "9"}};  // not settable here
  agent().OnJobInfo(info);
  proto::GenerationInfo g;
  g.generation = 1;
  g.job_id = "j1";
  g.members = {Placed("n1-a", "n1", 0, 0)};
  agent().OnGeneration(proto::GenerationUpdate::Full(g));
  EXPECT_TRUE(OfKind(Take(), Kind::kStartTrainer).empty()) << "a refused job runs nothing";
  info.flags = {{"lr", "0.1"}};
  agent().OnJobInfo(info);
  agent().OnGeneration(proto::GenerationUpdate::Full(g));
  const std::vector<AgentAction> starts = OfKind(Take(), Kind::kStartTrainer);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].spec.argv, (std::vector<std::string>{"/opt/resnet", "--lr=0.1"}));
  // Its KV requests name their job.
  const ChannelId ch = TrainerHello("n1-a");
  Take();
  proto::KvRequest r;
  r.req_id = 1;
  r.key = "k";
  agent().OnChannelFrame(ch, r.Encoded());
  const std::vector<json> sent = ToServer(Take(), proto::msg::kKv);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0]["job"], "j1");
}

TEST_F(NodeAgentTest, ShutdownTerminatesEveryTrainerAndSendsTheirEnds) {
  TwoTrainersRunning();
  agent().OnStop();
  std::vector<AgentAction> acts = Take();
  ASSERT_EQ(OfKind(acts, Kind::kShutdown).size(), 1u);
  EXPECT_EQ(OfKind(acts, Kind::kShutdown)[0].code, 0);
  agent().Shutdown();
  EXPECT_EQ(IdsOf(Take(), Kind::kTerminate), (std::vector<std::string>{"n1-a", "n1-b"}));
  ExitInfo term;
  term.signal = SIGTERM;
  Exit("n1-a", term);
  Exit("n1-b", term);
  acts = Take();
  EXPECT_EQ(ToServer(acts, proto::msg::kTrainerExit).size(), 2u);
  EXPECT_TRUE(OfKind(acts, Kind::kStartTrainer).empty());
  // Nothing starts any more.
  Generation(2, {Placed("n1-c", "n1", 0, 0)});
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kStartTrainer).empty());
}

TEST_F(NodeAgentTest, FinishedJobShutsTheClientDownOnceNoTrainerRuns) {
  options_.exit_when_done = true;
  TwoTrainersRunning();
  agent().OnDone();
  Tick();
  EXPECT_TRUE(OfKind(Take(), Kind::kShutdown).empty());
  Exit("n1-a", Exited(0));
  Exit("n1-b", Exited(0));
  Take();
  Tick();
  const std::vector<AgentAction> acts = OfKind(Take(), Kind::kShutdown);
  ASSERT_EQ(acts.size(), 1u);
  EXPECT_EQ(acts[0].why, "the job finished");
}

}  // namespace
}  // namespace edl::jobclient
