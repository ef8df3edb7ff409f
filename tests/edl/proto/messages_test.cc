#include "edl/proto/messages.h"

#include <limits>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::proto {
namespace {

using nlohmann::json;

GenerationInfo MakeGen(int64_t g, std::vector<std::string> ids) {
  GenerationInfo info;
  info.generation = g;
  info.job_id = "job1";
  info.reason = "script";
  info.master_addr = "10.0.0.1";
  info.master_port = 29500;
  for (const std::string& id : ids) {
    MemberInfo m;
    m.trainer_id = id;
    m.node = "n" + id.substr(0, 1);
    m.slot = static_cast<int>(info.members.size());
    m.rank = static_cast<int>(info.members.size());
    m.host = "127.0.0.1";
    info.members.push_back(m);
  }
  return info;
}

template <typename T>
T RoundTrip(const T& in) {
  json j;
  in.EncodeTo(&j);
  T out;
  Status s = out.DecodeFrom(json::parse(j.dump()));
  EXPECT_TRUE(s.ok()) << s.ToString() << " for " << in.DebugString();
  return out;
}

TEST(MessagesTest, GenerationRoundTrip) {
  GenerationInfo g = MakeGen(7, {"a1", "b2", "a3"});
  g.failure = true;
  GenerationInfo out = RoundTrip(g);
  EXPECT_EQ(out.generation, 7);
  EXPECT_EQ(out.members, g.members);
  EXPECT_TRUE(out.failure);
  EXPECT_EQ(out.world_size(), 3);
  EXPECT_EQ(out.RankOf("a3"), 2);
  EXPECT_EQ(out.RankOf("zz"), -1);
}

TEST(MessagesTest, DeltaAppliesShrinkAndGrow) {
  GenerationInfo g1 = MakeGen(1, {"a1", "b2", "a3", "b4"});
  GenerationInfo g2 = MakeGen(2, {"a1", "a3"});
  g2.members[1].slot = 2;  // survivor keeps its slot
  GenerationUpdate d = GenerationUpdate::Between(g1, g2);
  EXPECT_EQ(d.base_generation, 1);
  EXPECT_EQ(d.removed, (std::vector<std::string>{"b2", "b4"}));
  EXPECT_TRUE(d.added.empty());
  GenerationInfo have = g1;
  ASSERT_OK(RoundTrip(d).ApplyTo(&have));
  EXPECT_EQ(have.members, g2.members);

  GenerationInfo g3 = g2;
  g3.generation = 3;
  MemberInfo j = g1.members[3];
  j.trainer_id = "b9";
  j.rank = 2;
  g3.members.push_back(j);
  d = GenerationUpdate::Between(g2, g3);
  EXPECT_EQ(d.added.size(), 1u);
  ASSERT_OK(RoundTrip(d).ApplyTo(&have));
  EXPECT_EQ(have.members, g3.members);
  EXPECT_EQ(have.generation, 3);
}

TEST(MessagesTest, DeltaAgainstWrongBaseIsRefused) {
  GenerationInfo g1 = MakeGen(1, {"a1", "b2"});
  GenerationInfo g2 = MakeGen(2, {"a1"});
  GenerationUpdate d = GenerationUpdate::Between(g1, g2);
  GenerationInfo other = MakeGen(5, {"a1", "b2"});
  EXPECT_EQ(d.ApplyTo(&other).code(), Status::Code::kFailedPrecondition);
}

TEST(MessagesTest, ReorderedSurvivorsFallBackToFull) {
  GenerationInfo g1 = MakeGen(1, {"a1", "b2"});
  GenerationInfo g2 = MakeGen(2, {"b2", "a1"});
  g2.members[0].slot = 1;
  g2.members[1].slot = 0;
  GenerationUpdate d = GenerationUpdate::Between(g1, g2);
  EXPECT_EQ(d.base_generation, 0);
  GenerationInfo have;
  ASSERT_OK(d.ApplyTo(&have));
  EXPECT_EQ(have.members, g2.members);
}

// Members the way the scheduler names them: "<node>-s<slot>-<seq>", seq counting up.
GenerationInfo MakeCluster(int64_t g, int nodes, int slots, int64_t first_seq) {
  GenerationInfo info = MakeGen(g, {});
  int64_t seq = first_seq;
  for (int n = 0; n < nodes; ++n) {
    for (int s = 0; s < slots; ++s) {
      MemberInfo m;
      m.node = "node" + std::to_string(n);
      m.slot = s;
      m.trainer_id = m.node + "-s" + std::to_string(s) + "-" + std::to_string(seq++);
      m.rank = static_cast<int>(info.members.size());
      m.host = "10.0." + std::to_string(n) + ".1";
      info.members.push_back(m);
    }
  }
  return info;
}

GenerationUpdate WireRoundTrip(const GenerationUpdate& u, size_t* bytes = nullptr) {
  json j;
  u.EncodeTo(&j);
  if (bytes) *bytes = j.dump().size();
  GenerationUpdate back;
  EXPECT_OK(back.DecodeFrom(json::parse(j.dump())));
  return back;
}

TEST(MessagesTest, LargeGrowthAndShrinkTravelAsRuns) {
  // 2 nodes x 8 slots, then 500 more nodes x 8 (the benchmark's large step), then back.
  GenerationInfo small = MakeCluster(1, 2, 8, 1);
  GenerationInfo big = MakeCluster(2, 502, 8, 1);
  size_t bytes = 0;
  GenerationUpdate grow = WireRoundTrip(GenerationUpdate::Between(small, big), &bytes);
  EXPECT_EQ(grow.added.size(), 4000u);
  EXPECT_LT(bytes, 40u * 500 + 400) << "one run per node, not one entry per trainer";
  GenerationInfo held = small;
  ASSERT_OK(grow.ApplyTo(&held));
  EXPECT_EQ(held.members, big.members);

  GenerationInfo back = small;
  back.generation = 3;
  GenerationUpdate shrink = WireRoundTrip(GenerationUpdate::Between(big, back), &bytes);
  EXPECT_EQ(shrink.removed.size(), 4000u);
  EXPECT_LT(bytes, 40u * 500 + 400);
  ASSERT_OK(shrink.ApplyTo(&held));
  EXPECT_EQ(held.members, small.members);

  GenerationInfo full;
  ASSERT_OK(WireRoundTrip(GenerationUpdate::Full(big)).ApplyTo(&full));
  EXPECT_EQ(full.members, big.members);
}

TEST(MessagesTest, MembersOutsideTheRunPatternTravelOneByOne) {
  // Ids not of the form <node>-s<slot>-<seq>, gaps in slots or sequence, and a host change.
  GenerationInfo g = MakeCluster(1, 1, 4, 10);
  g.members[1].trainer_id = "custom";
  g.members[2].slot = 7;
  g.members[2].trainer_id = "node0-s7-12";
  g.members[3].host = "other";
  MemberInfo z = g.members[0];
  z.trainer_id = "node0-s1-011";  // a leading zero does not re-format identically
  z.slot = 1;
  g.members.push_back(z);
  for (size_t i = 0; i < g.members.size(); ++i) g.members[i].rank = static_cast<int>(i);
  GenerationInfo out;
  ASSERT_OK(WireRoundTrip(GenerationUpdate::Full(g)).ApplyTo(&out));
  EXPECT_EQ(out.members, g.members);
  GenerationInfo none = g;
  none.generation = 2;
  none.members.clear();
  GenerationUpdate d = WireRoundTrip(GenerationUpdate::Between(g, none));
  EXPECT_EQ(d.removed.size(), g.members.size());
  ASSERT_OK(d.ApplyTo(&out));
  EXPECT_TRUE(out.members.empty());
}

TEST(MessagesTest, BadRunsAreCorruption) {
  const json base = {{"type", "generation"},  {"generation", 2},  {"base", 0},
                     {"job_id", "j"},         {"reason", "ctl"},  {"failure", false},
                     {"master_addr", "h"},    {"master_port", 1}, {"removed", json::array()},
                     {"added", json::array()}};
  GenerationUpdate u;
  ASSERT_OK(u.DecodeFrom(base));
  const std::vector<std::pair<std::string, json>> bad = {
      {"added", {"n h 0 1000000000 1"}},  // a few bytes must not expand to 10^9 members
      {"added", {"n h 0 0 1"}},           // empty run
      {"added", {"n h -1 2 1"}},
      {"added", {"../x h 0 2 1"}},
      {"added", {"n  0 2 1"}},
      {"added", {"n h 0 2 -5"}},
      {"added", {"n h 00 2 1"}},   // not canonical
      {"added", {"n h 0 2 1 7"}},  // an extra field
      {"added", {"n h 0 2"}},      // a missing one
      {"added", {"n h 0 2 1;"}},   // an empty run after the separator
      {"added", {""}},
      {"added", {"n h 0 2 +1"}},
      {"added", {{"n", "h", 0, 2, 1}}},  // the array form is a member of four fields, not a run
      {"added", {"n h 0 2 1", {"n-s1-2", "n", 1, "h"}}},  // the same trainer twice
      {"added", {"n h 0 2 1;n h 1 1 2"}},                 // the same, inside one string
      {"added", {"n h 0 60000 1;m h 0 60000 1"}},         // too many in all
      {"added", {"n h 0 60000 1", "m h 0 60000 1"}},      // the same, over two strings
      {"removed", {"n 0 1000000000 1"}},
      {"removed", {"n 0 2"}},
      {"removed", {"n h 0 2 1"}},  // a member run where ids are expected
      {"removed", {"a;b"}},
      {"removed", {"a b"}},
      {"removed", {7}},
  };
  for (const auto& [key, value] : bad) {
    json j = base;
    j[key] = value;
    Status s = u.DecodeFrom(j);
    EXPECT_TRUE(s.IsCorruption()) << key << "=" << value.dump() << " -> " << s.ToString();
  }
}

TEST(MessagesTest, OtherMessagesRoundTrip) {
  Hello h;
  h.role = Role::kClient;
  h.mac = std::string(64, 'a');
  h.nonce = std::string(64, 'b');
  h.node = "node1";
  h.host = "10.1.1.1";
  h.mode = NodeMode::kRestart;
  h.slots = {0, 1, 3};
  h.trainers = {"node1-s0-1"};
  Hello h2 = RoundTrip(h);
  EXPECT_EQ(h2.slots, h.slots);
  EXPECT_EQ(h2.trainers, h.trainers);
  EXPECT_EQ(h2.mode, NodeMode::kRestart);

  Prepare p;
  p.generation = 4;
  p.job_id = "j";
  p.world_size = 3;
  p.joiners = MakeGen(4, {"a1", "b2", "c3"}).members;
  p.joiners.erase(p.joiners.begin());
  Prepare p2 = RoundTrip(p);
  ASSERT_EQ(p2.joiners.size(), 2u);
  EXPECT_EQ(p2.joiners[1].rank, 2);

  KvRequest kv;
  kv.req_id = 9;
  kv.op = KvOp::kWait;
  kv.key = "g3/nccl";
  kv.timeout_ms = 1500;
  EXPECT_EQ(RoundTrip(kv).timeout_ms, 1500);
  KvReply r;
  r.req_id = 9;
  r.status = Status::Timeout("late");
  EXPECT_TRUE(RoundTrip(r).status.IsTimeout());

  Progress pr;
  pr.trainer_id = "t1";
  pr.report.step = 12;
  pr.report.loss = 0.5;
  EXPECT_EQ(RoundTrip(pr).report.step, 12);
  EXPECT_EQ(RoundTrip(pr).report.samples, -1) << "not reported: absent on the wire";
  pr.report.samples = 768;
  EXPECT_EQ(RoundTrip(pr).report.samples, 768);
  // What the job measures of itself: absent until measured, then as sent.
  EXPECT_EQ(RoundTrip(pr).report.noise_steps, 0);
  EXPECT_EQ(RoundTrip(pr).report.noise_scale, -1);
  EXPECT_EQ(RoundTrip(pr).report.sync_s, -1);
  pr.report.noise_steps = 40;
  pr.report.grad_sqr = -0.25;  // an early estimate may be below 0
  pr.report.grad_var = 3.5;
  pr.report.compute_s_per_sample = 0.002;
  pr.report.sync_s = 0.04;
  const Progress got = RoundTrip(pr);
  EXPECT_EQ(got.report.noise_steps, 40);
  EXPECT_EQ(got.report.grad_sqr, -0.25);
  EXPECT_EQ(got.report.grad_var, 3.5);
  EXPECT_EQ(got.report.noise_scale, -1);
  EXPECT_EQ(got.report.compute_s_per_sample, 0.002);
  EXPECT_EQ(got.report.sync_s, 0.04);
  EXPECT_EQ(got.report.batch, 0) << "not reported: absent on the wire";
  EXPECT_FALSE(pr.Encoded().contains("batch_policy"));
  pr.report.batch = 48;
  pr.report.batch_policy = BatchPolicy::kFixedGlobal;
  EXPECT_EQ(pr.Encoded().value("batch_policy", ""), "fixed-global");
  EXPECT_EQ(RoundTrip(pr).report.batch, 48);
  EXPECT_EQ(RoundTrip(pr).report.batch_policy, BatchPolicy::kFixedGlobal);

  TrainerExit e;
  e.trainer_id = "t1";
  e.signal = 9;
  EXPECT_EQ(RoundTrip(e).signal, 9);

  CtlRequest c;
  c.command = CtlCommand::kScale;
  c.n = 5;
  EXPECT_EQ(RoundTrip(c).n, 5);
  c.service = "kd";
  EXPECT_EQ(RoundTrip(c).service, "kd");
  c.job = "j";
  EXPECT_FALSE(c.DecodeFrom(c.Encoded()).ok()) << "a scale names a job or a service, not both";
  c.job.clear();
}

TEST(MessagesTest, EveryBadFieldIsCorruption) {
  const json good_hello = {{"type", "hello"},
                           {"role", "client"},
                           {"mac", std::string(64, 'a')},
                           {"nonce", std::string(64, 'b')},
                           {"node", "n1"},
                           {"host", "h"},
                           {"mode", "inplace"},
                           {"slots", {0, 1}},
                           {"trainers", json::array()}};
  Hello h;
  ASSERT_OK(h.DecodeFrom(good_hello));
  const std::vector<std::pair<std::string, json>> bad = {
      {"role", "admin"},  {"role", 5},        {"mac", std::string(100, 'a')},
      {"nonce", "short"}, {"node", "../etc"}, {"node", ""},
      {"host", ""},       {"mode", "turbo"},  {"slots", {0, 0}},
      {"slots", {-1}},    {"slots", "0,1"},   {"trainers", {"a b"}},
      {"node", nullptr}};
  for (const auto& [key, value] : bad) {
    json j = good_hello;
    j[key] = value;
    Status s = h.DecodeFrom(j);
    EXPECT_TRUE(s.IsCorruption()) << key << "=" << value.dump() << " -> " << s.ToString();
    EXPECT_NE(s.message().find(key), std::string::npos) << s.ToString();
  }
  GenerationInfo g;
  EXPECT_TRUE(g.DecodeFrom(json{{"type", "generation"}}).IsCorruption());
  json gj;
  MakeGen(1, {"a1", "a1"}).EncodeTo(&gj);
  EXPECT_TRUE(g.DecodeFrom(gj).IsCorruption());  // duplicate member
  MakeGen(1, {"a1"}).EncodeTo(&gj);
  gj["members"][0][2] = -3;
  EXPECT_TRUE(g.DecodeFrom(gj).IsCorruption());
  gj["members"][0] = json::array({"a1", "n", 0});
  EXPECT_TRUE(g.DecodeFrom(gj).IsCorruption());
  gj = json{{"type", "kv"}, {"req_id", 1}, {"op", "drop"}, {"key", "k"}};
  KvRequest kv;
  EXPECT_TRUE(kv.DecodeFrom(gj).IsCorruption());
  gj = json{{"type", "kv"}, {"req_id", 1}, {"op", "wait"}, {"key", "k"}, {"timeout_ms", -1}};
  EXPECT_TRUE(kv.DecodeFrom(gj).IsCorruption());
  gj = json{{"type", "kv"}, {"req_id", 1}, {"op", "get"}, {"key", ""}};
  EXPECT_TRUE(kv.DecodeFrom(gj).IsCorruption());
  Progress pr;
  EXPECT_TRUE(pr.DecodeFrom(json{{"type", "progress"}, {"step", "x"}}).IsCorruption());
  const json progress = {{"type", "progress"}, {"generation", 1}, {"step", 2},
                         {"epoch", 0},         {"loss", 0.5},     {"images_per_sec", 1.0},
                         {"world_size", 2}};
  ASSERT_OK(pr.DecodeFrom(progress));
  for (const auto& [key, value] : {std::pair<const char*, json>{"sync_s", -0.5},
                                   {"compute_s_per_sample", "fast"},
                                   {"noise_steps", -1},
                                   {"batch", 0},
                                   {"batch", "64"}}) {
    json one = progress;
    one[key] = value;
    const Status s = pr.DecodeFrom(one);
    EXPECT_TRUE(s.IsCorruption()) << key;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  }
  // A batch names its policy, one of the two.
  json batch = progress;
  batch["batch"] = 64;
  EXPECT_NE(pr.DecodeFrom(batch).message().find("'batch_policy' is missing"), std::string::npos);
  batch["batch_policy"] = "fixed";
  EXPECT_NE(pr.DecodeFrom(batch).message().find("'fixed-local' or 'fixed-global'"),
            std::string::npos)
      << pr.DecodeFrom(batch).message();
  batch["batch_policy"] = 1;
  EXPECT_TRUE(pr.DecodeFrom(batch).IsCorruption());
  batch["batch_policy"] = "fixed-local";
  ASSERT_OK(pr.DecodeFrom(batch));
  EXPECT_EQ(pr.report.batch_policy, BatchPolicy::kFixedLocal);
  json partial = progress;  // a noise estimate needs its three values, and a scale >= 0 or -1
  partial["noise_steps"] = 3;
  EXPECT_TRUE(pr.DecodeFrom(partial).IsCorruption());
  partial.update({{"grad_sqr", 1.0}, {"grad_var", 2.0}, {"noise_scale", -2.0}});
  EXPECT_NE(pr.DecodeFrom(partial).message().find("noise_scale"), std::string::npos);
  partial["noise_scale"] = 2.0;
  ASSERT_OK(pr.DecodeFrom(partial));
  EXPECT_EQ(pr.report.noise_scale, 2.0);
  CtlRequest c;
  EXPECT_TRUE(c.DecodeFrom(json{{"type", "ctl"}, {"command", "rm -rf"}}).IsCorruption());
  EXPECT_TRUE(c.DecodeFrom(json{{"type", "ctl"}, {"command", "scale"}, {"n", -2}}).IsCorruption());
  Prepare p;
  EXPECT_TRUE(p.DecodeFrom(json{{"type", "prepare"},
                                {"generation", 2},
                                {"job_id", "j"},
                                {"world_size", 1},
                                {"master_addr", ""},
                                {"master_port", 0},
                                {"joiners", {{"a", "n", 0, "h", 5}}}})
                  .IsCorruption());
}

TEST(MessagesTest, NamesAreSafeForFiles) {
  EXPECT_TRUE(IsValidName("node-1.s0_7"));
  EXPECT_FALSE(IsValidName(".."));
  EXPECT_FALSE(IsValidName("a/b"));
  EXPECT_FALSE(IsValidName(""));
  EXPECT_FALSE(IsValidName(std::string(200, 'a')));
}

}  // namespace
}  // namespace edl::proto

namespace edl::proto {
namespace {

TEST(MessagesTest, RunFieldsAreRangeCheckedBeforeAnyArithmetic) {
  const json base = {{"type", "generation"},  {"generation", 2},  {"base", 0},
                     {"job_id", "j"},         {"reason", "ctl"},  {"failure", false},
                     {"master_addr", "h"},    {"master_port", 1}, {"removed", json::array()},
                     {"added", json::array()}};
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  const std::vector<std::pair<std::string, json>> bad = {
      {"added", {"n h 9223372036854775807 2 1"}},  // slot + count would overflow
      {"added", {"n h 0 9223372036854775807 1"}},
      {"added", {"n h 0 2 9223372036854775807"}},  // seq + count would overflow
      {"added", {"n h 18446744073709551615 2 1"}},
      {"added", {"n h 0 2 99999999999999999999999999999999"}},
      {"added", {"n h 65535 5 1"}},  // runs past the last slot
      {"added", {"n bad!host 0 2 1"}},
      {"added", {{"t1", "n", kHuge, "h"}}},
      {"removed", {"n 9223372036854775807 2 1"}},
      {"removed", {"n 0 2 9223372036854775807"}},
  };
  GenerationUpdate u;
  for (const auto& [key, value] : bad) {
    json j = base;
    j[key] = value;
    Status s = u.DecodeFrom(j);
    EXPECT_TRUE(s.IsCorruption()) << key << "=" << value.dump() << " -> " << s.ToString();
  }
  json j = base;
  j["added"] = {"n h 65534 2 " + std::to_string((int64_t{1} << 53) - 1)};
  ASSERT_OK(u.DecodeFrom(j));
  ASSERT_EQ(u.added.size(), 2u);
  EXPECT_EQ(u.added[1].trainer_id, "n-s65535-" + std::to_string(int64_t{1} << 53));
}

TEST(MessagesTest, HostsAreHostnamesOrIpLiterals) {
  for (const char* h :
       {"127.0.0.1", "::1", "fe80::1", "gpu01", "gpu-01.cluster.local", "node_7", "10.0.0.1"}) {
    EXPECT_TRUE(IsValidHost(h)) << h;
  }
  for (const std::string& h :
       {std::string(""), std::string("a b"), std::string("-lead"), std::string("trail-"),
        std::string("a..b"), std::string(".a"), std::string("a;rm -rf /"), std::string("::g"),
        std::string("x/y"), std::string(64, 'a') + ".b", std::string(254, 'a'),
        std::string("h\n")}) {
    EXPECT_FALSE(IsValidHost(h)) << h;
  }
  json hello = {{"type", "hello"},
                {"role", "client"},
                {"mac", std::string(64, 'a')},
                {"nonce", std::string(64, 'b')},
                {"node", "n1"},
                {"host", "$(reboot)"},
                {"mode", "inplace"},
                {"slots", {0, 1}},
                {"trainers", json::array()}};
  Hello h;
  Status s = h.DecodeFrom(hello);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.ToString();
  hello["host"] = "::1";
  EXPECT_OK(h.DecodeFrom(hello));
  hello["slots"] = json::array();
  for (int i = 0; i <= static_cast<int>(kMaxSlotsPerNode); ++i) hello["slots"].push_back(i);
  EXPECT_TRUE(h.DecodeFrom(hello).IsCorruption());
  hello["slots"] = {std::numeric_limits<uint64_t>::max()};
  EXPECT_TRUE(h.DecodeFrom(hello).IsCorruption());
  GenerationInfo g = MakeGen(1, {"a1"});
  json gj;
  g.EncodeTo(&gj);
  gj["master_addr"] = "evil host";
  EXPECT_TRUE(g.DecodeFrom(gj).IsCorruption());
  gj["master_addr"] = "";  // not known yet
  EXPECT_OK(g.DecodeFrom(gj));
}

TEST(MessagesTest, PeerTextInErrorsIsEscapedAndCut) {
  Hello h;
  json hello = {{"type", "hello"},
                {"role", "client"},
                {"mac", std::string(64, 'a')},
                {"nonce", std::string(64, 'b')},
                {"node", std::string(100, '\x1b')},
                {"host", "h"},
                {"mode", "inplace"},
                {"slots", {0}},
                {"trainers", json::array()}};
  Status s = h.DecodeFrom(hello);
  ASSERT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << s.ToString();
  EXPECT_LT(s.message().size(), 200u) << s.ToString();
  ErrorMsg e;
  ASSERT_OK(e.DecodeFrom(json{
      {"type", "error"}, {"code", "Aborted"}, {"message", "\x1b[2Jbye" + std::string(4000, 'x')}}));
  const Status st = e.ToStatus();
  EXPECT_TRUE(st.IsAborted());
  EXPECT_EQ(st.message().find('\x1b'), std::string::npos);
  EXPECT_LT(st.message().size(), 1100u);
  ASSERT_OK(e.DecodeFrom(json{{"type", "error"}, {"code", "\x1bNope"}, {"message", "m"}}));
  EXPECT_EQ(e.ToStatus().message().find('\x1b'), std::string::npos);
  // The optional proof round-trips.
  e.mac = std::string(64, 'c');
  json j;
  e.EncodeTo(&j);
  ErrorMsg e2;
  ASSERT_OK(e2.DecodeFrom(j));
  EXPECT_EQ(e2.mac, e.mac);
}

// Cluster mode: a node's job types in its hello, a job's type and flags for the client, the
// trainer's job on a KV request, and the cluster's ctl commands.
TEST(MessagesTest, ClusterFieldsRoundTripAndAreBounded) {
  Hello h;
  h.role = Role::kClient;
  h.nonce = std::string(64, 'a');
  h.node = "n1";
  h.host = "127.0.0.1";
  h.mode = NodeMode::kInplace;
  h.slots = {0, 1};
  h.job_types = {{"resnet", {"epochs", "lr"}}, {"bert", {}}};
  Hello back = RoundTrip(h);
  ASSERT_EQ(back.job_types.size(), 2u);
  EXPECT_EQ(back.job_types[0].name, "resnet");
  EXPECT_EQ(back.job_types[0].settable, (std::vector<std::string>{"epochs", "lr"}));

  JobInfo info;
  info.job_id = "a";
  info.job_type = "resnet";
  info.flags = {{"epochs", "3"}, {"checkpoint_dir", "/ckpt/a"}};
  EXPECT_EQ(RoundTrip(info).flags, info.flags);

  KvRequest kv;
  kv.op = KvOp::kGet;
  kv.key = "gen/1/x";
  kv.job = "a";
  EXPECT_EQ(RoundTrip(kv).job, "a");

  CtlRequest c;
  c.command = CtlCommand::kSubmit;
  c.spec = {{"name", "a"}};
  EXPECT_EQ(RoundTrip(c).spec, c.spec);

  auto refused = [](const json& j, auto* msg, const std::string& field) {
    Status s = msg->DecodeFrom(j);
    EXPECT_TRUE(s.IsCorruption()) << j.dump();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.ToString();
  };
  json hj;
  h.EncodeTo(&hj);
  json bad = hj;
  bad["job_types"][0]["settable"] = json::array({"Not-A-Flag"});
  refused(bad, &back, "job_types");
  bad = hj;
  bad["job_types"] = json::array();
  for (int i = 0; i < 65; ++i)
    bad["job_types"].push_back({{"name", "t" + std::to_string(i)}, {"settable", json::array()}});
  refused(bad, &back, "job_types");
  bad = hj;
  bad["job_types"][0]["name"] = "../x";
  refused(bad, &back, "job_types");

  json ij;
  info.EncodeTo(&ij);
  JobInfo info_back;
  json ibad = ij;
  ibad["flags"]["epochs"] = std::string(300, '1');
  refused(ibad, &info_back, "flags");
  ibad = ij;
  ibad["flags"]["epochs"] = 3;
  refused(ibad, &info_back, "flags");
  ibad = ij;
  ibad["job_type"] = "a b";
  refused(ibad, &info_back, "job_type");

  CtlRequest c_back;
  refused(json{{"type", "ctl"}, {"command", "submit"}}, &c_back, "spec");
  refused(json{{"type", "ctl"}, {"command", "cancel"}}, &c_back, "job");
  refused(json{{"type", "ctl"}, {"command", "reboot"}}, &c_back, "command");
  KvRequest kv_back;
  refused(json{{"type", "kv"}, {"req_id", 1}, {"op", "get"}, {"key", "k"}, {"job", "../a"}},
          &kv_back, "job");
}

TEST(MessagesTest, CheckpointDirMustLieUnderTheRoot) {
  EXPECT_EQ(CheckpointDirProblem("/ckpt/a", "/ckpt"), "");
  EXPECT_EQ(CheckpointDirProblem("/ckpt/a/b", "/ckpt/"), "");
  EXPECT_NE(CheckpointDirProblem("/ckpt", "/ckpt"), "");
  EXPECT_NE(CheckpointDirProblem("/ckptx/a", "/ckpt"), "");
  EXPECT_NE(CheckpointDirProblem("/ckpt/../etc", "/ckpt"), "");
  EXPECT_NE(CheckpointDirProblem("/ckpt/./a", "/ckpt"), "");
  EXPECT_NE(CheckpointDirProblem("ckpt/a", "/ckpt"), "");
  EXPECT_NE(CheckpointDirProblem("/ckpt/a", ""), "");
}

}  // namespace
// A spare's assignment is env contract variables: bounded in count and size, names of capitals,
// digits and '_', string values without NUL; anything else is refused naming the field.
TEST(MessagesTest, SpareAssignIsBounded) {
  SpareAssign a;
  a.env = {{"EDL_TRAINER_ID", "n1-s0-3"}, {"RANK", "2"}};
  SpareAssign back;
  ASSERT_OK(back.DecodeFrom(a.Encoded()));
  EXPECT_EQ(back.env, a.env);
  SpareHello h;
  h.spare_id = "n1-spare-1";
  SpareHello hb;
  ASSERT_OK(hb.DecodeFrom(h.Encoded()));
  EXPECT_EQ(hb.spare_id, "n1-spare-1");
  std::vector<nlohmann::json> bad;
  nlohmann::json many = nlohmann::json::object();
  for (size_t i = 0; i <= kMaxSpareEnvVars; ++i) many["V" + std::to_string(i)] = "x";
  bad.push_back({{"type", "spare_assign"}, {"env", many}});
  bad.push_back({{"type", "spare_assign"}, {"env", {{"lower", "x"}}}});
  bad.push_back({{"type", "spare_assign"}, {"env", {{"RANK", 2}}}});
  bad.push_back({{"type", "spare_assign"}, {"env", {{"RANK", std::string("1\0", 2)}}}});
  bad.push_back({{"type", "spare_assign"},
                 {"env", {{"RANK", std::string(kMaxSpareEnvValueBytes + 1, '1')}}}});
  bad.push_back({{"type", "spare_assign"}, {"env", "RANK=1"}});
  for (const nlohmann::json& j : bad) {
    SpareAssign got;
    Status s = got.DecodeFrom(j);
    EXPECT_FALSE(s.ok()) << j.dump().substr(0, 200);
    EXPECT_NE(s.message().find("env"), std::string::npos) << s.ToString();
  }
}

}  // namespace edl::proto
