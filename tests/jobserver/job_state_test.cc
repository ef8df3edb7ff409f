// The server's durable state (jobserver/STATE.md): value encodings (round trip, version
// mismatch, truncation, hostile fields), the RocksDB store (round trip across reopen, a damaged
// value or directory refused), and the scheduler resuming from a snapshot (numbers above every
// issued one, survivors adopted without a new generation, a rolled-back joiner killed).
#include "jobserver/job_state.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <rocksdb/db.h>

#include "jobserver/cluster_state.h"
#include "jobserver/scheduler.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using Kind = Action::Kind;
using nlohmann::json;

proto::MemberInfo Member(const std::string& id, const std::string& node, int slot, int rank) {
  proto::MemberInfo m;
  m.trainer_id = id;
  m.node = node;
  m.slot = slot;
  m.host = "127.0.0.1";
  m.rank = rank;
  return m;
}

JobState Sample() {
  JobState s;
  s.job_id = "job";
  s.max_generation = 7;
  s.current.generation = 6;
  s.current.job_id = "job";
  s.current.reason = "script";
  s.current.master_addr = "127.0.0.1";
  s.current.master_port = 29506;
  s.current.members = {Member("a-s0-1", "a", 0, 0), Member("b-s1-4", "b", 1, 1)};
  s.finished = {"b-s1-4"};
  s.next_trainer_seq = 9;
  s.desired = 3;
  s.desired_reason = "ctl";
  s.need_grow_back = true;
  s.clock_started = true;
  s.scale_elapsed_us = 12'345'678;
  s.script_next = 2;
  s.script_offset_us = 40'000'000;
  s.demo_size = 2;
  s.demo_steps = 5;
  NodeState n;
  n.name = "a";
  n.host = "10.0.0.1";
  n.slots = {0, 1};
  n.order = 0;
  n.session = std::string(64, 'f');
  s.nodes["a"] = n;
  n.name = "b";
  n.host = "10.0.0.2";
  n.restart_mode = true;
  n.order = 1;
  s.nodes["b"] = n;
  return s;
}

void ExpectSame(const JobState& a, const JobState& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.max_generation, b.max_generation);
  EXPECT_EQ(a.current.DebugString(), b.current.DebugString());
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.done, b.done);
  EXPECT_EQ(a.next_trainer_seq, b.next_trainer_seq);
  EXPECT_EQ(a.desired, b.desired);
  EXPECT_EQ(a.desired_reason, b.desired_reason);
  EXPECT_EQ(a.need_grow_back, b.need_grow_back);
  EXPECT_EQ(a.clock_started, b.clock_started);
  EXPECT_EQ(a.scale_elapsed_us, b.scale_elapsed_us);
  EXPECT_EQ(a.script_next, b.script_next);
  EXPECT_EQ(a.script_offset_us, b.script_offset_us);
  EXPECT_EQ(a.demo_size, b.demo_size);
  EXPECT_EQ(a.demo_steps, b.demo_steps);
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (const auto& [name, n] : a.nodes) {
    const NodeState& m = b.nodes.at(name);
    EXPECT_EQ(n.host, m.host);
    EXPECT_EQ(n.restart_mode, m.restart_mode);
    EXPECT_EQ(n.slots, m.slots);
    EXPECT_EQ(n.order, m.order);
    EXPECT_EQ(n.session, m.session);
  }
}

TEST(JobStateEncodingTest, RoundTrip) {
  const JobState s = Sample();
  JobState d;
  ASSERT_OK(DecodeJobMeta("job/job/meta", EncodeJobMeta(s), &d));
  ASSERT_OK(DecodeGeneration("job/job/generation", EncodeGeneration(s), &d));
  for (const auto& [name, n] : s.nodes) {
    ASSERT_OK(DecodeNode(kNodeKeyPrefix + name, EncodeNode(n), &d.nodes[name]));
  }
  ExpectSame(s, d);
}

TEST(JobStateEncodingTest, AnotherFormatVersionIsRefusedNamingBoth) {
  json j = json::parse(EncodeJobMeta(Sample()));
  j["v"] = kStateFormatVersion + 1;
  JobState d;
  const Status st = DecodeJobMeta("job/job/meta", j.dump(), &d);
  EXPECT_TRUE(st.code() == Status::Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("format version " + std::to_string(kStateFormatVersion + 1)), std::string::npos);
  EXPECT_NE(st.message().find("reads version " + std::to_string(kStateFormatVersion)), std::string::npos);
  EXPECT_NE(st.message().find("job/job/meta"), std::string::npos);
  j.erase("v");
  EXPECT_TRUE(DecodeJobMeta("job/job/meta", j.dump(), &d).IsCorruption());
}

TEST(JobStateEncodingTest, EveryTruncationIsCorruption) {
  const JobState s = Sample();
  const std::string values[] = {EncodeJobMeta(s), EncodeGeneration(s), EncodeNode(s.nodes.at("a"))};
  for (int kind = 0; kind < 3; ++kind) {
    const std::string& v = values[kind];
    for (size_t n = 0; n < v.size(); ++n) {
      JobState d;
      NodeState node;
      const std::string cut = v.substr(0, n);
      const Status st = kind == 0   ? DecodeJobMeta("k", cut, &d)
                        : kind == 1 ? DecodeGeneration("k", cut, &d)
                                    : DecodeNode(kNodeKeyPrefix + std::string("a"), cut, &node);
      ASSERT_TRUE(st.IsCorruption()) << kind << " cut at " << n << ": " << st.ToString();
      EXPECT_NE(st.message().find("move it aside"), std::string::npos) << st.ToString();
    }
  }
}

TEST(JobStateEncodingTest, HostileFieldsAreRefused) {
  JobState d;
  NodeState node;
  auto meta = [](const char* k, json v) {
    json j = json::parse(EncodeJobMeta(Sample()));
    j[k] = std::move(v);
    return j.dump();
  };
  EXPECT_TRUE(DecodeJobMeta("k", meta("max_generation", -1), &d).IsCorruption());
  EXPECT_TRUE(DecodeJobMeta("k", meta("next_trainer_seq", 0), &d).IsCorruption());
  EXPECT_TRUE(DecodeJobMeta("k", meta("desired", "3"), &d).IsCorruption());
  EXPECT_TRUE(DecodeJobMeta("k", meta("job_id", "../etc"), &d).IsCorruption());
  EXPECT_TRUE(DecodeJobMeta("k", "[1,2]", &d).IsCorruption());
  auto gen = [](const std::function<void(json*)>& f) {
    json j = json::parse(EncodeGeneration(Sample()));
    f(&j);
    return j.dump();
  };
  EXPECT_TRUE(DecodeGeneration("k", gen([](json* j) { (*j)["finished"] = {"nobody"}; }), &d).IsCorruption());
  EXPECT_TRUE(DecodeGeneration("k", gen([](json* j) { (*j)["members"][1] = (*j)["members"][0]; }), &d)
                  .IsCorruption());
  EXPECT_TRUE(DecodeGeneration("k", gen([](json* j) { (*j)["generation"] = "6"; }), &d).IsCorruption());
  auto nd = [](const char* k, json v) {
    json j = json::parse(EncodeNode(Sample().nodes.at("a")));
    j[k] = std::move(v);
    return j.dump();
  };
  const std::string key = std::string(kNodeKeyPrefix) + "a";
  EXPECT_TRUE(DecodeNode(key, nd("name", "b"), &node).IsCorruption());  // not its key
  EXPECT_TRUE(DecodeNode(key, nd("slots", json::array({0, 0})), &node).IsCorruption());
  EXPECT_TRUE(DecodeNode(key, nd("slots", json::array()), &node).IsCorruption());
  EXPECT_TRUE(DecodeNode(key, nd("mode", "other"), &node).IsCorruption());
  EXPECT_TRUE(DecodeNode(key, nd("host", "a b"), &node).IsCorruption());
  EXPECT_TRUE(DecodeNode(key, nd("session", std::string(65, 'f')), &node).IsCorruption());
}

TEST(StateStoreTest, SavesAndLoadsAcrossReopenAndDropsForgottenNodes) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  JobState s = Sample();
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    EXPECT_TRUE(created);
    JobState none;
    bool found = true;
    ASSERT_OK(store.Load("job", &none, &found));
    EXPECT_FALSE(found);
    ASSERT_OK(store.Save(s));
    s.nodes.erase("b");
    s.max_generation = 8;
    ASSERT_OK(store.Save(s));
  }
  StateStore store;
  bool created = true;
  ASSERT_OK(store.Open(path, &created));
  EXPECT_FALSE(created);
  JobState d;
  bool found = false;
  ASSERT_OK(store.Load("job", &d, &found));
  ASSERT_TRUE(found);
  ExpectSame(s, d);
  bool other = true;
  JobState o;
  ASSERT_OK(store.Load("other-job", &o, &other));  // one key range per job
  EXPECT_FALSE(other);
  EXPECT_EQ(o.nodes.size(), 1u);  // the cluster's nodes are shared
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_all,
            std::filesystem::perms::none);
}

TEST(StateStoreTest, ADamagedValueOrDirectoryIsRefusedNamingTheFix) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    ASSERT_OK(store.Save(Sample()));
  }
  {  // Another program writes a truncated value.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, path, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string v = EncodeGeneration(Sample());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), JobKeyPrefix("job") + "generation", v.substr(0, v.size() / 2)).ok());
  }
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    JobState d;
    bool found = false;
    const Status st = store.Load("job", &d, &found);
    EXPECT_TRUE(st.IsCorruption()) << st.ToString();
    EXPECT_NE(st.message().find("job/job/generation"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("move it aside"), std::string::npos) << st.ToString();
  }
  // A damaged database: every file's bytes garbled.
  for (const auto& f : std::filesystem::directory_iterator(path)) {
    if (f.path().filename().string().rfind("MANIFEST", 0) == 0) {
      std::ofstream(f.path(), std::ios::trunc) << "garbage";
    }
  }
  StateStore store;
  bool created = false;
  const Status st = store.Open(path, &created);
  EXPECT_TRUE(st.IsCorruption()) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  // A file where the directory should be.
  std::ofstream(dir.Join("file")) << "x";
  StateStore other;
  EXPECT_TRUE(other.Open(dir.Join("file"), &created).code() == Status::Code::kFailedPrecondition);
}

// The teacher services (`job/<job_id>/services`, `cluster/services`): kept beside the job through
// real RocksDB, absent in an older state (no desired counts), and a damaged value is refused
// naming its key.
TEST(StateStoreTest, ServicesAreKeptBesideTheJobAndADamagedValueIsRefused) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  const std::string key = JobKeyPrefix("job") + "services";
  JobState s = Sample();
  s.services.desired = {{"kd", 2}, {"kd2", 0}};
  s.services.restarts = {{"kd", 3}};
  s.services.next_seq = 9;
  s.services.teachers = {{"a-t7", "kd", "a"}, {"b-t8", "kd", "b"}};
  // A fresh store on the directory loads the job into *d.
  auto load = [&](JobState* d, bool* found) {
    StateStore store;
    bool created = false;
    EXPECT_OK(store.Open(path, &created));
    return store.Load("job", d, found);
  };
  // Another program (or an older server) changes the key directly; empty `value`: deletes it.
  auto raw = [&](const std::string& value) {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &db).ok());
    std::unique_ptr<rocksdb::DB> owned(db);
    ASSERT_TRUE((value.empty() ? db->Delete(rocksdb::WriteOptions(), key) : db->Put(rocksdb::WriteOptions(), key, value)).ok());
  };
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    ASSERT_OK(store.Save(s));
  }
  JobState d;
  bool found = false;
  ASSERT_OK(load(&d, &found));
  ASSERT_TRUE(found);
  EXPECT_EQ(d.services.desired, s.services.desired);
  EXPECT_EQ(d.services.restarts, s.services.restarts);
  EXPECT_EQ(d.services.next_seq, 9u);
  ASSERT_EQ(d.services.teachers.size(), 2u);
  EXPECT_EQ(d.services.teachers[1].name, "b-t8");
  EXPECT_EQ(d.services.teachers[1].node, "b");
  raw("");  // a state written before services were kept
  JobState older;
  ASSERT_OK(load(&older, &found));
  EXPECT_TRUE(found);
  EXPECT_TRUE(older.services.empty());
  raw(R"({"v":1,"desired":{"kd":99999},"restarts":{},"next_seq":1,"teachers":[]})");
  const Status st = load(&older, &found);
  EXPECT_TRUE(st.IsCorruption()) << st.ToString();
  EXPECT_NE(st.message().find("job/job/services"), std::string::npos) << st.ToString();

  // The cluster layout: one `cluster/services` key, optional on decode.
  ClusterState c;
  c.services = s.services;
  std::map<std::string, std::string> kv = EncodeClusterState(c);
  ASSERT_EQ(kv.count("cluster/services"), 1u);
  ClusterState back;
  ASSERT_OK(DecodeClusterState(kv, &back, &found));
  EXPECT_TRUE(found);
  EXPECT_EQ(back.services.desired, s.services.desired);
  EXPECT_EQ(back.services.teachers.size(), 2u);
  kv.erase("cluster/services");
  ASSERT_OK(DecodeClusterState(kv, &back, &found));
  EXPECT_TRUE(back.services.empty());
  kv["cluster/services"] = "{\"v\":1";
  const Status cs = DecodeClusterState(kv, &back, &found);
  EXPECT_TRUE(cs.IsCorruption()) << cs.ToString();
  EXPECT_NE(cs.message().find("cluster/services"), std::string::npos) << cs.ToString();
}

// ---- the scheduler resumes

class SchedulerRestoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Scheduler> Make(int initial_trainers = 0) {
    SchedulerOptions o;
    o.job_id = "job";
    o.initial_trainers = initial_trainers;
    o.heartbeat_timeout_us = 5'000'000;
    o.join_timeout_us = 10'000'000;
    return std::make_unique<Scheduler>(o, &clock_);
  }
  static std::vector<Action> Of(std::vector<Action> all, Kind kind) {
    std::vector<Action> out;
    for (Action& a : all) {
      if (a.kind == kind) out.push_back(std::move(a));
    }
    return out;
  }
  ManualClock clock_;
};

TEST_F(SchedulerRestoreTest, SurvivorsAreAdoptedAndNumbersGoOnAboveEveryIssuedOne) {
  auto s1 = Make(3);
  const std::string tok_a(64, 'a'), tok_b(64, 'b');
  ASSERT_OK(s1->AddNode("a", "127.0.0.1", false, {0, 1}, {}, tok_a));
  ASSERT_OK(s1->AddNode("b", "127.0.0.1", false, {0, 1}, {}, tok_b));
  ASSERT_EQ(s1->current().world_size(), 3);
  s1->SetDesired(4, "ctl");  // a grow in flight: generation 2 prepared, not committed
  ASSERT_TRUE(s1->has_pending());
  auto prepares = Of(s1->TakeActions(), Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  const std::string joiner = prepares[0].prepare.joiners.at(0).trainer_id;
  JobState saved;
  s1->Snapshot(&saved);
  EXPECT_EQ(saved.max_generation, 2);
  const proto::GenerationInfo before = s1->current();

  // The server dies; a new one resumes.
  auto s2 = Make();
  s2->Restore(saved);
  EXPECT_TRUE(s2->recovering());
  EXPECT_EQ(s2->current().DebugString(), before.DebugString());
  std::vector<std::string> on_a, on_b;
  for (const auto& m : before.members) (m.node == "a" ? on_a : on_b).push_back(m.trainer_id);
  // A node without its token may not take the name.
  EXPECT_TRUE(s2->CheckAdmission("a", "").code() == Status::Code::kUnavailable);
  ASSERT_OK(s2->CheckAdmission("a", tok_a));
  ASSERT_OK(s2->AddNode("a", "127.0.0.1", false, {0, 1}, on_a, tok_a, std::vector<int64_t>(on_a.size(), 1)));
  std::vector<std::string> b_running = on_b;
  b_running.push_back(joiner);
  std::vector<int64_t> b_gens(on_b.size(), 1);
  b_gens.push_back(2);
  ASSERT_OK(s2->AddNode("b", "127.0.0.1", false, {0, 1}, b_running, tok_b, b_gens));
  EXPECT_FALSE(s2->recovering());
  auto all = s2->TakeActions();
  EXPECT_TRUE(Of(all, Kind::kCommit).empty()) << "the survivors were adopted without a new generation";
  auto kills = Of(all, Kind::kKill);
  ASSERT_EQ(kills.size(), 1u);
  EXPECT_EQ(kills[0].node, "b");
  EXPECT_EQ(kills[0].trainer_ids, std::vector<std::string>{joiner});
  // The grow is made again, above the rolled-back generation 2 and with a new trainer id.
  auto again = Of(all, Kind::kPrepare);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].prepare.generation, 3);
  EXPECT_NE(again[0].prepare.joiners.at(0).trainer_id, joiner);
  s2->TrainerReady(again[0].prepare.joiners.at(0).trainer_id, 3);
  EXPECT_EQ(s2->current().generation, 3);
  EXPECT_EQ(s2->current().world_size(), 4);
}

TEST_F(SchedulerRestoreTest, NoChangeUntilTheMembersNodesReturnOrAreLost) {
  auto s1 = Make(4);
  ASSERT_OK(s1->AddNode("a", "127.0.0.1", false, {0, 1}, {}, std::string(64, 'a')));
  ASSERT_OK(s1->AddNode("b", "127.0.0.1", false, {0, 1}, {}, std::string(64, 'b')));
  ASSERT_EQ(s1->current().world_size(), 4);
  JobState saved;
  s1->Snapshot(&saved);
  auto s2 = Make();
  s2->Restore(saved);
  std::vector<std::string> on_a;
  for (const auto& m : s2->current().members) {
    if (m.node == "a") on_a.push_back(m.trainer_id);
  }
  ASSERT_OK(s2->AddNode("a", "127.0.0.1", false, {0, 1}, on_a, std::string(64, 'a')));
  // b is away: its slots are not counted, but the job is not shrunk while it may come back.
  clock_.Advance(6'000'000);
  s2->Heartbeat("a");
  s2->Tick();
  EXPECT_TRUE(Of(s2->TakeActions(), Kind::kCommit).empty());
  EXPECT_TRUE(s2->recovering());
  // Past the grace (one heartbeat timeout) plus the timeout, b is lost: a failure generation.
  clock_.Advance(5'000'000);
  s2->Heartbeat("a");
  s2->Tick();
  auto commits = Of(s2->TakeActions(), Kind::kCommit);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_TRUE(commits[0].next.failure);
  EXPECT_EQ(commits[0].next.generation, 2);
  EXPECT_EQ(commits[0].next.world_size(), 2);
  EXPECT_FALSE(s2->recovering());
}

TEST_F(SchedulerRestoreTest, AFloorFromTheCheckpointStoreNumbersTheFirstGenerationAboveIt) {
  auto s = Make();
  s->RaiseGenerationFloor(5);
  ASSERT_OK(s->AddNode("a", "127.0.0.1", false, {0}, {}));
  EXPECT_EQ(s->current().generation, 6);
  EXPECT_EQ(s->max_generation(), 6);
}

}  // namespace
}  // namespace edl::jobserver
