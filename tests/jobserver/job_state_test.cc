// The server's durable state (jobserver/state/STATE.md): value encodings (round trip, version
// mismatch, truncation, hostile fields), the one layout through real RocksDB (round trip across
// reopen, a damaged value or directory refused, the old one-job layout read once and rewritten, a
// newer layout refused), and a one-job server resuming from a snapshot (numbers above every issued
// one, survivors adopted without a new generation, a rolled-back joiner killed).
#include "jobserver/state/job_state.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <nlohmann/json.hpp>

#include "jobserver/state/cluster_state.h"
#include "tests/jobserver/one_job_cluster.h"
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
  EXPECT_NE(st.message().find("format version " + std::to_string(kStateFormatVersion + 1)),
            std::string::npos);
  EXPECT_NE(st.message().find("reads version " + std::to_string(kStateFormatVersion)),
            std::string::npos);
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
  EXPECT_TRUE(DecodeGeneration("k", gen([](json* j) { (*j)["finished"] = {"nobody"}; }), &d)
                  .IsCorruption());
  EXPECT_TRUE(
      DecodeGeneration("k", gen([](json* j) { (*j)["members"][1] = (*j)["members"][0]; }), &d)
          .IsCorruption());
  EXPECT_TRUE(
      DecodeGeneration("k", gen([](json* j) { (*j)["generation"] = "6"; }), &d).IsCorruption());
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

// Sample()'s job as a one-job server keeps it: the job holds every slot of the cluster's nodes.
ClusterState OneJobSample() {
  const JobState j = Sample();
  ClusterState c;
  c.one_job = "job";
  c.trainer_seq = j.next_trainer_seq;
  ClusterJobState& js = c.jobs["job"];
  js.spec.job.name = "job";
  js.running = true;
  js.sched = j;
  js.sched.nodes.clear();
  for (const auto& [name, n] : j.nodes) {
    c.nodes[name].node = n;
    js.slots[name] = n.slots;
  }
  return c;
}

void ExpectSameState(const ClusterState& a, const ClusterState& b) {
  EXPECT_EQ(a.one_job, b.one_job);
  EXPECT_EQ(a.trainer_seq, b.trainer_seq);
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  JobState na, nb;  // the nodes compared as a job's
  for (const auto& [name, n] : a.nodes) na.nodes[name] = n.node;
  for (const auto& [name, n] : b.nodes) nb.nodes[name] = n.node;
  ExpectSame(na, nb);
  ASSERT_EQ(a.jobs.size(), b.jobs.size());
  for (const auto& [name, j] : a.jobs) {
    const ClusterJobState& k = b.jobs.at(name);
    EXPECT_EQ(j.slots, k.slots);
    EXPECT_EQ(j.running, k.running);
    ExpectSame(j.sched, k.sched);
  }
  EXPECT_EQ(a.services.desired, b.services.desired);
  EXPECT_EQ(a.services.teachers.size(), b.services.teachers.size());
}

// Opens the store in `path` and loads the state of a server whose one job is `one_job`.
Status LoadState(const std::string& path, const std::string& one_job, ClusterState* s, bool* found,
                 bool* migrated = nullptr) {
  StateStore store;
  bool created = false;
  EDL_RETURN_IF_ERROR(store.Open(path, &created));
  ClusterStateWriter w(&store);
  bool m = false;
  EDL_RETURN_IF_ERROR(w.Load(one_job, s, found, &m));
  if (migrated != nullptr) *migrated = m;
  return Status::OK();
}

// Writes `s` to the store in `path` (created when missing), as a server saves it.
void SaveState(const std::string& path, const ClusterState& s) {
  StateStore store;
  bool created = false;
  ASSERT_OK(store.Open(path, &created));
  ClusterStateWriter w(&store);
  ASSERT_OK(w.Save(s));
}

// Every key and value in the store in `path`.
std::map<std::string, std::string> RawKeys(const std::string& path) {
  StateStore store;
  bool created = false;
  EXPECT_OK(store.Open(path, &created));
  std::map<std::string, std::string> kv;
  EXPECT_OK(store.Scan("", &kv));
  return kv;
}

TEST(StateStoreTest, SavesAndLoadsAcrossReopenAndDropsForgottenNodes) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  ClusterState s = OneJobSample();
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    EXPECT_TRUE(created);
    ClusterStateWriter w(&store);
    ClusterState none;
    bool found = true, migrated = true;
    ASSERT_OK(w.Load("job", &none, &found, &migrated));
    EXPECT_FALSE(found);
    EXPECT_FALSE(migrated);
    ASSERT_OK(w.Save(s));
    s.nodes.erase("b");
    s.jobs["job"].slots.erase("b");
    s.jobs["job"].sched.max_generation = 8;
    ASSERT_OK(w.Save(s));
  }
  ClusterState d;
  bool found = false, migrated = true;
  ASSERT_OK(LoadState(path, "job", &d, &found, &migrated));
  ASSERT_TRUE(found);
  EXPECT_FALSE(migrated);
  ExpectSameState(s, d);
  const auto kv = RawKeys(path);
  EXPECT_EQ(kv.count("cluster/nodes/b"), 0u) << "a forgotten node's key is deleted";
  EXPECT_EQ(kv.count("job/job/spec"), 0u) << "the one job's flags are the server's";
  EXPECT_EQ(kv.count("job/job/placement"), 1u);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_all,
            std::filesystem::perms::none);
}

TEST(StateStoreTest, ADamagedValueOrDirectoryIsRefusedNamingTheFix) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  SaveState(path, OneJobSample());
  {  // Another program writes a truncated value.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, path, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string v = EncodeGeneration(Sample());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), JobKeyPrefix("job") + "generation",
                        v.substr(0, v.size() / 2))
                    .ok());
  }
  {
    ClusterState d;
    bool found = false;
    const Status st = LoadState(path, "job", &d, &found);
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

// A state directory of the old one-job layout (job/<job>/meta, generation, services;
// cluster/nodes/<name>; no cluster/meta) is read once as the one layout and the next save rewrites
// it: the old-only key goes, the layout's keys come, and a later load reads it without migrating.
// A cluster server, or a one-job server of another job, refuses it naming the cause and the fix.
TEST(StateStoreTest, TheOldOneJobLayoutIsReadOnceAndRewrittenInTheOneLayout) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  JobState old = Sample();
  old.services.desired = {{"kd", 2}};
  old.services.next_seq = 4;
  old.services.teachers = {{"a-t3", "kd", "a"}};
  {
    StateStore store;  // what an edl server before the one layout wrote
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    std::map<std::string, std::string> puts = {{"job/job/meta", EncodeJobMeta(old)},
                                               {"job/job/generation", EncodeGeneration(old)},
                                               {"job/job/services", EncodeServices(old.services)}};
    for (const auto& [name, n] : old.nodes) puts["cluster/nodes/" + name] = EncodeNode(n);
    ASSERT_OK(store.Write(puts, {}));
  }
  ClusterState cluster_view;
  bool found = false;
  Status st = LoadState(path, "", &cluster_view, &found);
  EXPECT_TRUE(st.IsCorruption()) << st.ToString();
  EXPECT_NE(st.message().find("single-job server's job"), std::string::npos) << st.ToString();
  st = LoadState(path, "other", &cluster_view, &found);
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("--job_id job"), std::string::npos) << st.ToString();

  ClusterState expect = OneJobSample();
  expect.services = old.services;
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    ClusterStateWriter w(&store);
    ClusterState d;
    bool migrated = false;
    ASSERT_OK(w.Load("job", &d, &found, &migrated));
    ASSERT_TRUE(found);
    EXPECT_TRUE(migrated);
    ExpectSameState(expect, d);
    ASSERT_OK(w.Save(d));
  }
  const auto kv = RawKeys(path);
  EXPECT_EQ(kv.count("job/job/services"), 0u);
  for (const char* key : {"cluster/meta", "cluster/services", "job/job/meta", "job/job/generation",
                          "job/job/placement", "cluster/nodes/a", "cluster/nodes/b"}) {
    EXPECT_EQ(kv.count(key), 1u) << key;
  }
  EXPECT_EQ(json::parse(kv.at("cluster/meta"))["v"], kClusterLayoutVersion);
  ClusterState again;
  bool migrated = true;
  ASSERT_OK(LoadState(path, "job", &again, &found, &migrated));
  ASSERT_TRUE(found);
  EXPECT_FALSE(migrated);
  ExpectSameState(expect, again);
}

// A state written by a newer edl (a layout version above this one's) is refused naming both
// versions and the fix; nothing is written.
TEST(StateStoreTest, ANewerLayoutIsRefusedNamingBothVersions) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  SaveState(path, OneJobSample());
  {
    StateStore store;
    bool created = false;
    ASSERT_OK(store.Open(path, &created));
    json meta = json::parse(EncodeClusterState(OneJobSample()).at("cluster/meta"));
    meta["v"] = kClusterLayoutVersion + 1;
    ASSERT_OK(store.Write({{"cluster/meta", meta.dump()}}, {}));
  }
  const auto before = RawKeys(path);
  ClusterState d;
  bool found = false;
  const Status st = LoadState(path, "job", &d, &found);
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("format version " + std::to_string(kClusterLayoutVersion + 1)),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("1.." + std::to_string(kClusterLayoutVersion)), std::string::npos)
      << st.ToString();
  EXPECT_EQ(RawKeys(path), before);
}

// The teacher services (`cluster/services`): kept beside the jobs through real RocksDB, absent in
// an older state (no desired counts), and a damaged value is refused naming its key.
TEST(StateStoreTest, ServicesAreKeptBesideTheJobAndADamagedValueIsRefused) {
  test::ScratchDir dir("edl-state");
  const std::string path = dir.Join("state");
  const std::string key = "cluster/services";
  ClusterState s = OneJobSample();
  s.services.desired = {{"kd", 2}, {"kd2", 0}};
  s.services.restarts = {{"kd", 3}};
  s.services.next_seq = 9;
  s.services.teachers = {{"a-t7", "kd", "a"}, {"b-t8", "kd", "b"}};
  // Another program (or an older server) changes the key directly; empty `value`: deletes it.
  auto raw = [&](const std::string& value) {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &db).ok());
    std::unique_ptr<rocksdb::DB> owned(db);
    ASSERT_TRUE((value.empty() ? db->Delete(rocksdb::WriteOptions(), key)
                               : db->Put(rocksdb::WriteOptions(), key, value))
                    .ok());
  };
  SaveState(path, s);
  ClusterState d;
  bool found = false;
  ASSERT_OK(LoadState(path, "job", &d, &found));
  ASSERT_TRUE(found);
  EXPECT_EQ(d.services.desired, s.services.desired);
  EXPECT_EQ(d.services.restarts, s.services.restarts);
  EXPECT_EQ(d.services.next_seq, 9u);
  ASSERT_EQ(d.services.teachers.size(), 2u);
  EXPECT_EQ(d.services.teachers[1].name, "b-t8");
  EXPECT_EQ(d.services.teachers[1].node, "b");
  raw("");  // a state written before services were kept
  ClusterState older;
  ASSERT_OK(LoadState(path, "job", &older, &found));
  EXPECT_TRUE(found);
  EXPECT_TRUE(older.services.empty());
  raw(R"({"v":1,"desired":{"kd":99999},"restarts":{},"next_seq":1,"teachers":[]})");
  const Status st = LoadState(path, "job", &older, &found);
  EXPECT_TRUE(st.IsCorruption()) << st.ToString();
  EXPECT_NE(st.message().find("cluster/services"), std::string::npos) << st.ToString();
}

// ---- a one-job server resumes

class OneJobRestoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<test::OneJobCluster> Make(int initial_trainers = 0) {
    MembershipOptions o;
    o.job_id = "job";
    o.initial_trainers = initial_trainers;
    o.join_timeout_us = 10'000'000;
    return std::make_unique<test::OneJobCluster>(o, &clock_);
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

TEST_F(OneJobRestoreTest, SurvivorsAreAdoptedAndNumbersGoOnAboveEveryIssuedOne) {
  auto s1 = Make(3);
  ASSERT_OK(s1->AddNode("a", "127.0.0.1", false, {0, 1}));
  ASSERT_OK(s1->AddNode("b", "127.0.0.1", false, {0, 1}));
  const std::string tok_a = s1->SessionOf("a"), tok_b = s1->SessionOf("b");
  ASSERT_EQ(s1->current().world_size(), 3);
  s1->SetDesired(4, "ctl");  // a grow in flight: generation 2 prepared, not committed
  ASSERT_TRUE(s1->has_pending());
  auto prepares = Of(s1->TakeActions(), Kind::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  const std::string joiner = prepares[0].prepare.joiners.at(0).trainer_id;
  ClusterState saved;
  s1->Snapshot(&saved);
  EXPECT_EQ(saved.jobs.at("job").sched.max_generation, 2);
  const proto::GenerationInfo before = s1->current();

  // The server dies; a new one resumes.
  auto s2 = Make();
  ASSERT_OK(s2->Restore(saved));
  EXPECT_TRUE(s2->recovering());
  EXPECT_EQ(s2->current().DebugString(), before.DebugString());
  std::vector<std::string> on_a, on_b;
  for (const auto& m : before.members) (m.node == "a" ? on_a : on_b).push_back(m.trainer_id);
  // A node without its token may not take the name.
  EXPECT_TRUE(s2->CheckAdmission("a", "").code() == Status::Code::kUnavailable);
  ASSERT_OK(s2->CheckAdmission("a", tok_a));
  ASSERT_OK(
      s2->AddNode("a", "127.0.0.1", false, {0, 1}, on_a, std::vector<int64_t>(on_a.size(), 1)));
  std::vector<std::string> b_running = on_b;
  b_running.push_back(joiner);
  std::vector<int64_t> b_gens(on_b.size(), 1);
  b_gens.push_back(2);
  ASSERT_OK(s2->CheckAdmission("b", tok_b));
  ASSERT_OK(s2->AddNode("b", "127.0.0.1", false, {0, 1}, b_running, b_gens));
  EXPECT_FALSE(s2->recovering());
  auto all = s2->TakeActions();
  EXPECT_TRUE(Of(all, Kind::kCommit).empty())
      << "the survivors were adopted without a new generation";
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

TEST_F(OneJobRestoreTest, NoChangeUntilTheMembersNodesReturnOrAreLost) {
  auto s1 = Make(4);
  ASSERT_OK(s1->AddNode("a", "127.0.0.1", false, {0, 1}));
  ASSERT_OK(s1->AddNode("b", "127.0.0.1", false, {0, 1}));
  ASSERT_EQ(s1->current().world_size(), 4);
  ClusterState saved;
  s1->Snapshot(&saved);
  auto s2 = Make();
  ASSERT_OK(s2->Restore(saved));
  std::vector<std::string> on_a;
  for (const auto& m : s2->current().members) {
    if (m.node == "a") on_a.push_back(m.trainer_id);
  }
  ASSERT_OK(s2->AddNode("a", "127.0.0.1", false, {0, 1}, on_a));
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

TEST_F(OneJobRestoreTest, AFloorFromTheCheckpointStoreNumbersTheFirstGenerationAboveIt) {
  auto s = Make();
  s->RaiseGenerationFloor(5);
  ASSERT_OK(s->AddNode("a", "127.0.0.1", false, {0}));
  EXPECT_EQ(s->current().generation, 6);
  EXPECT_EQ(s->max_generation(), 6);
}

}  // namespace
}  // namespace edl::jobserver
