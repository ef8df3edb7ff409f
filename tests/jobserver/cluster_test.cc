// Cluster: the policy's decisions carried out by one JobMembership per job, with a ManualClock and
// no processes (the integration test runs the same scenario with real trainers).
#include "jobserver/cluster.h"
#include "jobserver/state/cluster_state.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

constexpr int64_t kSec = 1'000'000;

class ClusterTest : public ::testing::Test {
 protected:
  void Make(ClusterOptions o = {}) {
    o.heartbeat_timeout_us = 5 * kSec;
    o.checkpoint_root = "/ckpt";
    cluster_ = std::make_unique<Cluster>(o, &clock_);
  }
  static ClusterNode Node(const std::string& name, int slots,
                          std::set<std::string> flags = {"epochs"}) {
    ClusterNode n;
    n.name = name;
    n.host = "127.0.0.1";
    for (int i = 0; i < slots; ++i) n.slots.push_back(i);
    n.types.push_back({"t", flags});
    return n;
  }
  // As the server registers a client's node.
  Status Attach(const ClusterNode& n, const std::vector<std::string>& running,
                const std::vector<int64_t>& generations = {}) {
    std::string session;
    bool known = false;
    return cluster_->AddNode(n, running, generations, &session, &known);
  }
  void AddNode(const std::string& name, int slots, std::set<std::string> flags = {"epochs"}) {
    ASSERT_OK(Attach(Node(name, slots, flags), {}));
    Drain();
  }
  static JobSpec Job(const std::string& name, int min, int max, int priority = 1) {
    JobSpec s;
    s.job.name = name;
    s.job.type = "t";
    s.job.min_trainers = min;
    s.job.max_trainers = max;
    s.job.priority = priority;
    return s;
  }
  // Takes the cluster's actions and keeps what a client would see: each job's newest generation
  // and the joiners prepared for it.
  void Drain() {
    for (JobAction& ja : cluster_->TakeActions()) {
      const Action& a = ja.action;
      if (a.kind == Action::Kind::kCommit) {
        gens_[ja.job].push_back(a.next);
        for (const proto::MemberInfo& m : a.next.members) joiners_[ja.job].erase(m.trainer_id);
      } else if (a.kind == Action::Kind::kPrepare) {
        for (const proto::MemberInfo& m : a.prepare.joiners) {
          joiners_[ja.job][m.trainer_id] = {m.node, a.prepare.generation};
        }
      } else if (a.kind == Action::Kind::kKill) {
        for (const std::string& id : a.trainer_ids) killed_.insert(id);
      } else if (a.kind == Action::Kind::kEvent && ja.job.empty()) {
        cluster_events_.push_back(a.event);
      }
    }
    CheckSlotsExclusive();
  }
  // Every prepared joiner reports ready.
  void AllReady() {
    auto joiners = joiners_;
    for (auto& [job, js] : joiners) {
      for (auto& [id, where] : js) cluster_->TrainerReady(id, where.first, where.second);
    }
    Drain();
  }
  int World(const std::string& job) {
    auto it = gens_.find(job);
    return it == gens_.end() ? 0 : it->second.back().world_size();
  }
  std::set<std::string> Ids(const std::string& job) {
    std::set<std::string> out;
    for (const proto::MemberInfo& m : gens_[job].back().members) out.insert(m.trainer_id);
    return out;
  }
  // No slot holds members of two jobs' current generations.
  void CheckSlotsExclusive() {
    std::map<std::pair<std::string, int>, std::string> owner;
    for (auto& [job, gens] : gens_) {
      if (cluster_->FindJob(job) == nullptr) continue;
      for (const proto::MemberInfo& m : gens.back().members) {
        auto [it, fresh] = owner.emplace(std::make_pair(m.node, m.slot), job);
        EXPECT_TRUE(fresh) << m.node << " slot " << m.slot << " holds members of " << it->second
                           << " and " << job;
      }
    }
  }

  ManualClock clock_;
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, std::vector<proto::GenerationInfo>> gens_;
  std::map<std::string, std::map<std::string, std::pair<std::string, int64_t>>> joiners_;
  std::set<std::string> killed_;
  std::vector<nlohmann::json> cluster_events_;
};

// The tutorial's scenario: A alone at its max; B arrives and A shrinks in place; C of higher
// priority arrives at a full cluster and the others shrink toward their min; C finishes and the
// others grow back. Every shrink keeps only trainers that were members before (in place).
TEST_F(ClusterTest, SharesNodesAmongJobsByPriority) {
  Make();
  AddNode("n1", 2);
  AddNode("n2", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 4)));
  Drain();
  ASSERT_EQ(World("A"), 4);
  auto subset = [](const std::set<std::string>& part, const std::set<std::string>& whole) {
    for (const std::string& id : part) {
      if (!whole.count(id)) return false;
    }
    return true;
  };
  const std::set<std::string> a4 = Ids("A");

  ASSERT_OK(cluster_->Submit(Job("B", 1, 4)));
  Drain();
  EXPECT_EQ(World("A"), 2);
  EXPECT_EQ(World("B"), 2);
  EXPECT_EQ(gens_["A"].back().reason, "shrink");
  EXPECT_FALSE(gens_["A"].back().failure);  // in place: survivors re-form
  EXPECT_TRUE(subset(Ids("A"), a4));
  const std::set<std::string> a2 = Ids("A"), b_ids = Ids("B");

  ASSERT_OK(cluster_->Submit(Job("C", 2, 2, /*priority=*/5)));
  Drain();
  EXPECT_EQ(World("A"), 1);
  EXPECT_EQ(World("B"), 1);
  EXPECT_EQ(World("C"), 2);
  EXPECT_TRUE(subset(Ids("A"), a2));
  EXPECT_TRUE(subset(Ids("B"), b_ids));
  const std::set<std::string> a1 = Ids("A");
  EXPECT_TRUE(killed_.empty());  // nobody was killed: shrinking is leaving in place

  for (const std::string& id : Ids("C")) {
    cluster_->TrainerExited(id, gens_["C"].back().Find(id)->node, /*success=*/true, "exit 0");
  }
  Drain();
  EXPECT_EQ(cluster_->FindJob("C"), nullptr);
  AllReady();  // A and B grow back through a prepare phase
  EXPECT_EQ(World("A"), 2);
  EXPECT_EQ(World("B"), 2);
  EXPECT_TRUE(subset(a1, Ids("A")));  // growing keeps the survivor
  const nlohmann::json jobs = cluster_->JobsJson();
  ASSERT_EQ(jobs["ended"].size(), 1u);
  EXPECT_EQ(jobs["ended"][0]["state"], "finished");
}

TEST_F(ClusterTest, RefusedSubmissionsChangeNothing) {
  Make();
  AddNode("n1", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 2)));
  Drain();
  const nlohmann::json before = cluster_->JobsJson();
  JobSpec s = Job("B", 3, 2);
  EXPECT_NE(cluster_->Submit(s).message().find("min 3 > max 2"), std::string::npos);
  s = Job("B", 1, 2);
  s.job.type = "nope";
  EXPECT_NE(cluster_->Submit(s).message().find("no node offers job type 'nope'"),
            std::string::npos);
  s = Job("B", 1, 2);
  s.flags["lr"] = "1";
  EXPECT_NE(cluster_->Submit(s).message().find("does not declare flag 'lr'"), std::string::npos);
  EXPECT_NE(cluster_->Submit(Job("A", 1, 2)).message().find("already submitted"),
            std::string::npos);
  EXPECT_TRUE(cluster_->TakeActions().empty());
  EXPECT_EQ(cluster_->JobsJson(), before);
  EXPECT_EQ(cluster_->submitted_jobs(), 1);
}

// What a job measures of itself reaches `edl ctl status` (Cluster::MeasuredJson): rank 0's noise
// estimate, and the members' mean compute and all-reduce times of the current generation, with
// its world size and node count; nothing before a report says it.
TEST_F(ClusterTest, StatusShowsWhatAJobMeasuresOfItself) {
  Make();
  AddNode("n1", 1);
  AddNode("n2", 1);
  ASSERT_OK(cluster_->Submit(Job("A", 2, 2)));
  Drain();
  ASSERT_EQ(World("A"), 2);
  const auto measured = [&] {
    return cluster_->StatusJson()["jobs"][0].value("measured", nlohmann::json());
  };
  EXPECT_TRUE(measured().is_null());
  const proto::GenerationInfo g = gens_["A"].back();
  for (const proto::MemberInfo& m : g.members) {
    proto::ProgressReport r;
    r.generation = g.generation;
    r.step = 5;
    r.world_size = 2;
    r.noise_steps = 5;
    r.grad_sqr = m.rank == 0 ? 2.0 : 99.0;  // only rank 0's is taken (all ranks hold the same)
    r.grad_var = m.rank == 0 ? 50.0 : 99.0;
    r.noise_scale = m.rank == 0 ? 25.0 : 1.0;
    r.compute_s_per_sample = m.rank == 0 ? 0.002 : 0.004;
    r.sync_s = m.rank == 0 ? 0.01 : 0.03;
    cluster_->Progress("A", m.trainer_id, r);
  }
  const nlohmann::json j = measured();
  EXPECT_EQ(j.value("noise_scale", 0.0), 25.0) << j.dump();
  EXPECT_EQ(j.value("grad_sqr", 0.0), 2.0) << j.dump();
  EXPECT_EQ(j.value("noise_steps", 0), 5) << j.dump();
  EXPECT_DOUBLE_EQ(j.value("compute_s_per_sample", 0.0), 0.003) << j.dump();
  EXPECT_DOUBLE_EQ(j.value("sync_s", 0.0), 0.02) << j.dump();
  EXPECT_EQ(j.value("sync_world", 0), 2) << j.dump();
  EXPECT_EQ(j.value("sync_nodes", 0), 2) << j.dump();
  // A member still reporting an older generation measured another world's all-reduce.
  proto::ProgressReport old;
  old.generation = g.generation - 1;
  old.sync_s = 5.0;
  old.compute_s_per_sample = 5.0;
  cluster_->Progress("A", g.members[1].trainer_id, old);
  EXPECT_DOUBLE_EQ(measured().value("sync_s", 0.0), 0.01) << measured().dump();
}

// Under --policy goodput the trainers' own reports size the jobs (GoodputFeed into
// ClusterPolicy::ReportGoodput): of two jobs at their fair share of one 4-slot node, the one whose
// all-reduce costs more than a second trainer saves gives its slot to the one that scales; the
// status says which jobs have a model and what the others still lack.
TEST_F(ClusterTest, TheTrainersReportsGiveTheirJobItsGoodputModel) {
  ClusterOptions o;
  o.policy.kind = PolicyKind::kGoodput;
  o.policy.goodput.probe_trainers = 0;  // as `edl server` sets it
  Make(o);
  AddNode("n1", 4);
  ASSERT_OK(cluster_->Submit(Job("slow", 1, 4)));
  ASSERT_OK(cluster_->Submit(Job("fast", 1, 4)));
  Drain();
  AllReady();
  ASSERT_EQ(World("slow"), 2);
  ASSERT_EQ(World("fast"), 2);
  const auto note = [&](const std::string& job) {
    const nlohmann::json jobs = cluster_->JobsJson();
    for (const nlohmann::json& j : jobs["jobs"]) {
      if (j.value("name", "") == job) return j.value("goodput", std::string());
    }
    return std::string("(no such job)");
  };
  EXPECT_NE(note("slow").find("no trainer has reported its batch yet"), std::string::npos)
      << note("slow");
  // Both run a fixed global batch of 64 at 10 ms a sample; slow's all-reduce takes 0.5 s.
  const auto report = [&](const std::string& job, double sync_s) {
    const proto::GenerationInfo g = gens_[job].back();
    for (const proto::MemberInfo& m : g.members) {
      proto::ProgressReport r;
      r.generation = g.generation;
      r.step = 10;
      r.world_size = g.world_size();
      r.compute_s_per_sample = 0.01;
      r.sync_s = g.world_size() > 1 ? sync_s : -1;
      r.batch = 64;
      r.batch_policy = BatchPolicy::kFixedGlobal;
      cluster_->Progress(job, m.trainer_id, r);
    }
  };
  report("slow", 0.5);
  Drain();
  // One model in: the pass that ran with it shrinks slow (0.82 s a step at two, 0.64 s at one).
  EXPECT_EQ(World("slow"), 1);
  EXPECT_NE(note("slow").find("goodput model, measured at up to 2 trainers"), std::string::npos)
      << note("slow");
  EXPECT_NE(note("fast").find("no goodput model yet"), std::string::npos) << note("fast");
  report("fast", 0.001);
  Drain();
  AllReady();
  EXPECT_EQ(World("fast"), 3);
  EXPECT_EQ(World("slow"), 1);
  // A fixed-local job's batch grows with it: without a noise scale its model waits.
  ASSERT_OK(cluster_->Cancel("fast"));
  Drain();
  const proto::GenerationInfo g = gens_["slow"].back();
  proto::ProgressReport r;
  r.generation = g.generation;
  r.step = 20;
  r.world_size = 1;
  r.compute_s_per_sample = 0.01;
  r.batch = 32;
  r.batch_policy = BatchPolicy::kFixedLocal;
  cluster_->Progress("slow", g.members[0].trainer_id, r);
  Drain();
  EXPECT_NE(note("slow").find("no gradient noise scale yet"), std::string::npos) << note("slow");
}

TEST_F(ClusterTest, AJobWhoseTypeNoNodeOffersStaysPending) {
  ClusterOptions o;
  o.policy.known_types = {"bert"};
  Make(o);
  AddNode("n1", 2);
  JobSpec s = Job("X", 1, 1);
  s.job.type = "bert";
  ASSERT_OK(cluster_->Submit(s));
  Drain();
  const nlohmann::json j = cluster_->JobsJson()["jobs"][0];
  EXPECT_EQ(j["state"], "pending");
  EXPECT_NE(j.value("pending_reason", "").find("bert"), std::string::npos) << j.dump();
  EXPECT_EQ(World("X"), 0);
}

TEST_F(ClusterTest, NodeLossShrinksEveryJobOnItAndTheyRepair) {
  Make();
  AddNode("n1", 2);
  AddNode("n2", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 2)));
  ASSERT_OK(cluster_->Submit(Job("B", 1, 2)));
  Drain();
  ASSERT_EQ(World("A") + World("B"), 4);
  std::set<std::string> on_n2;
  for (const char* job : {"A", "B"}) {
    for (const proto::MemberInfo& m : gens_[job].back().members) {
      if (m.node == "n2") on_n2.insert(job);
    }
  }
  for (int i = 0; i < 10; ++i) {  // n1 keeps talking, n2 went silent
    clock_.Advance(kSec);
    cluster_->Heartbeat("n1");
    cluster_->Tick();
    Drain();
  }
  AllReady();
  EXPECT_FALSE(cluster_->registry().Has("n2"));
  for (const std::string& job : on_n2) {
    bool failed = false;
    for (const proto::GenerationInfo& g : gens_[job]) failed |= g.failure;
    EXPECT_TRUE(failed) << job << " lost trainers on n2 without a failure generation";
  }
  for (const char* job : {"A", "B"}) {
    for (const proto::MemberInfo& m : gens_[job].back().members) EXPECT_NE(m.node, "n2") << job;
    EXPECT_GE(World(job), 1) << job;
  }
}

TEST_F(ClusterTest, CancelStopsTheJobInOneGenerationAndOthersGrowIntoItsSlots) {
  Make();
  AddNode("n1", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 2)));
  ASSERT_OK(cluster_->Submit(Job("B", 1, 2)));
  Drain();
  ASSERT_EQ(World("A"), 1);
  ASSERT_EQ(World("B"), 1);
  const std::set<std::string> b_ids = Ids("B");
  const int64_t b_gen = gens_["B"].back().generation;
  ASSERT_OK(cluster_->Cancel("B"));
  Drain();
  // One stop generation: no trainer left, not a failure, nobody killed.
  ASSERT_EQ(gens_["B"].size(), 2u);
  EXPECT_EQ(gens_["B"].back().generation, b_gen + 1);
  EXPECT_EQ(gens_["B"].back().world_size(), 0);
  EXPECT_EQ(gens_["B"].back().reason, "stop");
  EXPECT_FALSE(gens_["B"].back().failure);
  for (const std::string& id : b_ids) EXPECT_FALSE(killed_.count(id)) << id;
  AllReady();
  EXPECT_EQ(World("A"), 2);
  EXPECT_TRUE(cluster_->Cancel("B").IsNotFound());
  EXPECT_EQ(cluster_->JobsJson()["ended"][0]["state"], "cancelled");
}

TEST_F(ClusterTest, ScaleCapsAJobWithinItsBounds) {
  Make();
  AddNode("n1", 4);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 4)));
  Drain();
  ASSERT_EQ(World("A"), 4);
  ASSERT_OK(cluster_->Scale("A", 2));
  Drain();
  EXPECT_EQ(World("A"), 2);
  EXPECT_FALSE(cluster_->Scale("A", 9).ok());
  EXPECT_TRUE(cluster_->Scale("Z", 1).IsNotFound());
}

// A restarted cluster server (jobserver/state/STATE.md, "A cluster server"): the whole cluster
// saved through a real RocksDB StateStore, restored into a new Cluster; as the nodes re-attach with
// their trainers every job goes on without a new generation, and the next change is numbered above.
TEST_F(ClusterTest, SavedClusterResumesEveryJobAsItsNodesReattach) {
  Make();
  AddNode("n1", 2);
  AddNode("n2", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 4)));
  Drain();
  ASSERT_OK(cluster_->Submit(Job("B", 1, 4)));
  Drain();
  ASSERT_OK(cluster_->Submit(Job("C", 1, 1)));
  Drain();
  ASSERT_OK(cluster_->Cancel("C"));
  Drain();
  AllReady();
  ASSERT_GE(World("A"), 1);
  ASSERT_GE(World("B"), 1);
  std::map<std::string, int64_t> gen;
  std::map<std::string, std::vector<std::string>> running;  // node -> the trainers its client runs
  uint64_t max_seq = 0;
  for (const std::string job : {"A", "B"}) {
    gen[job] = cluster_->FindJob(job)->current().generation;
    for (const proto::MemberInfo& m : cluster_->FindJob(job)->current().members) {
      running[m.node].push_back(m.trainer_id);
      max_seq = std::max<uint64_t>(max_seq,
                                   std::stoull(m.trainer_id.substr(m.trainer_id.rfind('-') + 1)));
    }
  }
  running["n1"].push_back("n1-s1-99999");  // a joiner of a change the old server never committed
  test::ScratchDir dir("edl-cluster-state");
  ClusterState saved;
  {
    StateStore store;
    bool created = false, found = true;
    ASSERT_OK(store.Open(dir.Join("state"), &created));
    ClusterStateWriter w(&store);
    ClusterState none;
    bool migrated = true;
    ASSERT_OK(w.Load("", &none, &found, &migrated));
    EXPECT_FALSE(migrated);
    EXPECT_FALSE(found);
    cluster_->Snapshot(&saved);
    ASSERT_OK(w.Save(saved));
  }
  StateStore store;
  bool created = true, found = false;
  ASSERT_OK(store.Open(dir.Join("state"), &created));
  EXPECT_FALSE(created);
  ClusterStateWriter w(&store);
  ClusterState st;
  bool migrated = true;
  ASSERT_OK(w.Load("", &st, &found, &migrated));
  ASSERT_TRUE(found);
  EXPECT_EQ(EncodeClusterState(st), EncodeClusterState(saved));

  gens_.clear();
  killed_.clear();
  cluster_events_.clear();
  Make();
  ASSERT_OK(cluster_->Restore(st));
  Drain();
  EXPECT_EQ(cluster_->JobNames(), (std::vector<std::string>{"A", "B"}));
  const nlohmann::json jobs = cluster_->JobsJson();
  ASSERT_EQ(jobs["ended"].size(), 1u);
  EXPECT_EQ(jobs["ended"][0]["name"], "C");
  EXPECT_EQ(jobs["ended"][0]["state"], "cancelled");
  for (const std::string node : {"n1", "n2"}) {
    ASSERT_OK(Attach(Node(node, 2), running[node]));
    Drain();
  }
  EXPECT_TRUE(gens_.empty()) << "a restart between changes made a generation";
  EXPECT_EQ(killed_, (std::set<std::string>{"n1-s1-99999"}));
  for (const std::string job : {"A", "B"}) {
    EXPECT_EQ(cluster_->FindJob(job)->current().generation, gen[job]) << job;
    EXPECT_FALSE(cluster_->FindJob(job)->recovering()) << job;
  }
  // The next change: above the old numbers, with trainer ids above the old ones.
  ASSERT_OK(cluster_->Scale("A", 1));
  Drain();
  AllReady();
  ASSERT_FALSE(gens_["A"].empty());
  EXPECT_GT(gens_["A"].back().generation, gen["A"]);
  ASSERT_FALSE(gens_["B"].empty()) << "B grows into the slots A gave up";
  EXPECT_GT(gens_["B"].back().generation, gen["B"]);
  for (const proto::MemberInfo& m : gens_["B"].back().members) {
    const uint64_t seq = std::stoull(m.trainer_id.substr(m.trainer_id.rfind('-') + 1));
    const auto& old = running[m.node];
    if (std::find(old.begin(), old.end(), m.trainer_id) == old.end()) {
      EXPECT_GT(seq, max_seq) << m.trainer_id;
    }
  }
}

// A restored job's member that its node reports in a generation above the stored one: the stored
// state is older than what the trainers saw (e.g. a directory restored from a backup), so that
// member counts as failed; the others are adopted.
TEST_F(ClusterTest, AMemberAheadOfTheRestoredGenerationCountsAsFailed) {
  Make();
  AddNode("n1", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 2)));
  Drain();
  ASSERT_EQ(World("A"), 2);
  const proto::GenerationInfo g = gens_["A"].back();
  ClusterState st;
  cluster_->Snapshot(&st);
  gens_.clear();
  Make();
  ASSERT_OK(cluster_->Restore(st));
  Drain();
  ASSERT_OK(Attach(Node("n1", 2), {g.members[0].trainer_id, g.members[1].trainer_id},
                   {g.generation, g.generation + 5}));
  Drain();
  ASSERT_EQ(gens_["A"].size(), 1u);
  EXPECT_TRUE(gens_["A"][0].failure);
  ASSERT_EQ(gens_["A"][0].world_size(), 1);
  EXPECT_EQ(gens_["A"][0].members[0].trainer_id, g.members[0].trainer_id);
  EXPECT_GT(gens_["A"][0].generation, g.generation);
}

// Issue 32, item 9: pending jobs are bounded (--max_pending_jobs); a submission beyond the bound
// is refused naming the flag and changes nothing, and is taken again once a pending job started
// or was cancelled.
TEST_F(ClusterTest, PendingJobsAreBounded) {
  ClusterOptions o;
  o.max_pending_jobs = 2;
  Make(o);
  AddNode("n1", 1);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 1)));  // runs: the node's one slot
  ASSERT_OK(cluster_->Submit(Job("B", 1, 1)));  // pending
  ASSERT_OK(cluster_->Submit(Job("C", 1, 1)));  // pending
  const nlohmann::json before = cluster_->JobsJson();
  const Status s = cluster_->Submit(Job("D", 1, 1));
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("--max_pending_jobs"), std::string::npos) << s.ToString();
  EXPECT_EQ(cluster_->JobsJson(), before);
  ASSERT_OK(cluster_->Cancel("C"));
  EXPECT_OK(cluster_->Submit(Job("D", 1, 1)));
}

// Damaged or foreign state is refused with the key and the fix; nothing is restored from it.
TEST_F(ClusterTest, DamagedClusterStateIsRefusedNamingTheKey) {
  Make();
  AddNode("n1", 2);
  ASSERT_OK(cluster_->Submit(Job("A", 1, 2)));
  Drain();
  ClusterState st;
  cluster_->Snapshot(&st);
  const std::map<std::string, std::string> good = EncodeClusterState(st);
  ASSERT_TRUE(good.count("job/A/generation"));
  ClusterState out;
  bool found = false;
  ASSERT_OK(DecodeClusterState(good, &out, &found));
  EXPECT_TRUE(found);

  auto refused = [&](std::map<std::string, std::string> kv, const std::string& expect) {
    ClusterState o;
    bool f = false;
    const Status s = DecodeClusterState(kv, &o, &f);
    EXPECT_TRUE(s.IsCorruption()) << expect << ": " << s.ToString();
    EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  };
  auto kv = good;
  kv.erase("job/A/generation");
  refused(kv, "job/A/generation");
  kv = good;
  kv["job/A/placement"] = kv["job/A/placement"].substr(0, 10);
  refused(kv, "job/A/placement");
  kv = good;
  kv["job/A/placement"] = R"({"v":1,"running":true,"cap":2,"slots":{"n9":[0]},)"
                          R"("deadline_left_us":0,"deadline_reported":false})";
  refused(kv, "does not hold");
  kv = good;
  kv.erase("cluster/meta");
  refused(kv, "single-job server");
  kv = good;
  kv["job/A/spec"] = nlohmann::json{
      {"v", 1},
      {"spec", EncodeJobSpec(Job("A", 1, 2))},
      {"seq", 1},
      {"port_index", 20}}.dump();
  refused(kv, "port_index");
  kv = good;
  kv["cluster/node_types/n1"] = R"({"v":1,"name":"n1","types":[{"name":"../x","settable":[]}]})";
  refused(kv, "cluster/node_types/n1");

  // Slots the node does not offer: the restore refuses them.
  st.jobs["A"].slots["n1"] = {0, 7};
  Make();
  const Status s = cluster_->Restore(st);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("slot 7"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace edl::jobserver
