// A cluster server survives its own death (jobserver/state/STATE.md, "A cluster server"): a real
// `edl server --cluster --state_dir` with two submitted jobs on two real `edl client`s (stand-in
// trainers) is SIGKILLed and started again on the same --state_dir and port. Both jobs are listed
// again, their trainers keep their pids, no generation is made by the restart, and the next change
// is numbered above every earlier one. Cancelling a job stops it in one generation (its trainers
// exit 0, no failure), and it stays ended across a restart.
#include <signal.h>

#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;

class ClusterRestartTest : public itest::ControlPlaneHarness {
 protected:
  void StartServerOn(const std::string& port) {
    std::remove(dir_.Join("port").c_str());
    std::vector<std::string> argv = {test::EdlBinary(),
                                     "server",
                                     "--cluster",
                                     "--server_port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--port_file",
                                     dir_.Join("port"),
                                     "--secret_file",
                                     secret_,
                                     "--job_id",
                                     "itest",
                                     "--events_dir",
                                     dir_.Join("events"),
                                     "--heartbeat_timeout_ms",
                                     "3000",
                                     "--join_timeout_s",
                                     "30",
                                     "--state_dir",
                                     dir_.Join("state")};
    server_ = std::make_unique<Proc>(argv, dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
    if (port != "0") ASSERT_EQ(port_, port);
  }
  void KillServer() {
    ASSERT_EQ(::kill(server_->pid(), SIGKILL), 0);
    ASSERT_EQ(server_->Wait(milliseconds(10000)), 128 + SIGKILL);
  }
  std::unique_ptr<Proc> Client(const std::string& node) {
    return StartClient(node, "inplace", "",
                       {{"job_type", std::string("standin = ") + STAND_IN_TRAINER}});
  }
  // A server and clients of nodes n1 and n2 (2 slots each), both registered.
  void StartServerAndTwoNodes(std::unique_ptr<Proc>* c1, std::unique_ptr<Proc>* c2) {
    StartServerOn("0");
    if (HasFatalFailure()) return;
    *c1 = Client("n1");
    *c2 = Client("n2");
    ASSERT_TRUE(WaitFor(
        [&] {
          return Slurp(dir_.Join("server.log")).find("node n2 registered") != std::string::npos;
        },
        milliseconds(30000)))
        << Diag();
  }
  void Submit(const std::string& name, int max = 2) {
    const std::string path = dir_.Join(name + ".ini");
    std::ofstream(path) << "name = " << name << "\ntype = standin\nmin = 1\nmax = " << max << "\n";
    std::string out;
    ASSERT_EQ(Ctl({"submit", path}, &out), 0) << out;
  }
  std::string Diag() {
    return "\n--- server\n" + Slurp(dir_.Join("server.log")).substr(0, 30000) + "\n--- a\n" +
           Slurp(dir_.Join("events/a.events.jsonl")) + "\n--- b\n" +
           Slurp(dir_.Join("events/b.events.jsonl"));
  }
};

TEST_F(ClusterRestartTest, SigkilledServerResumesEveryJobWithItsTrainers) {
  std::unique_ptr<Proc> c1, c2;
  StartServerAndTwoNodes(&c1, &c2);
  if (HasFatalFailure()) return;
  Submit("a");
  Submit("b");
  if (HasFatalFailure()) return;
  // Each job runs at 2 (4 slots, max 2 each) and its trainers did their KV round.
  std::map<std::string, int64_t> gen;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string job : {"a", "b"}) {
          gen[job] = LastGeneration(job);
          if (gen[job] == 0 || KvDone(job, gen[job]).size() < 2) return false;
        }
        return true;
      },
      milliseconds(60000)))
      << Diag();
  const json before = Jobs();
  ASSERT_EQ(before["jobs"].size(), 2u) << before.dump();
  std::set<std::string> members;
  for (const std::string job : {"a", "b"}) {
    for (const std::string& id : KvDone(job, gen[job])) members.insert(id);
  }
  ASSERT_EQ(members.size(), 4u) << Diag();
  const auto pids_before = Pids();

  KillServer();
  if (HasFatalFailure()) return;
  const size_t a_events = JobEvents("a").size(), b_events = JobEvents("b").size();
  StartServerOn(port_);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(WaitFor(
      [&] {
        return CountJobEvents("a", "recovered") == 1 && CountJobEvents("b", "recovered") == 1;
      },
      milliseconds(60000)))
      << Diag();
  EXPECT_NE(Slurp(dir_.Join("server.log")).find("resuming the cluster"), std::string::npos);
  const json after = Jobs();
  ASSERT_EQ(after["jobs"].size(), 2u) << after.dump();
  for (const json& j : after["jobs"]) {
    const std::string name = j["name"];
    EXPECT_EQ(j["state"], "running") << j.dump();
    EXPECT_EQ(j["generation"], gen[name]) << j.dump();
    EXPECT_EQ(j["trainers"], 2) << j.dump();
  }
  for (const auto& [job, seen] : std::map<std::string, size_t>{{"a", a_events}, {"b", b_events}}) {
    const std::vector<json> ev = JobEvents(job);
    for (size_t i = seen; i < ev.size(); ++i) {
      EXPECT_NE(ev[i]["type"], "generation") << "the restart made a generation: " << ev[i].dump();
      EXPECT_NE(ev[i]["type"], "stale_trainers") << ev[i].dump();
    }
  }

  // The next change is numbered above; the trainers kept their processes throughout.
  std::string out;
  ASSERT_EQ(Ctl({"scale", "--job", "a", "1"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return LastGeneration("a") > gen["a"]; }, milliseconds(60000)))
      << Diag();
  const auto pids_after = Pids();
  for (const std::string& id : members) {
    EXPECT_EQ(pids_after.at(id), pids_before.at(id)) << id << " was restarted";
    EXPECT_EQ(pids_after.at(id).size(), 1u) << id;
  }

  // Cancelling b is one stop decision: its stop generation (no members, reason stop, not a
  // failure); its trainers leave it and exit 0, nobody is killed.
  std::set<std::string> b_members = KvDone("b", gen["b"]);
  ASSERT_EQ(Ctl({"cancel", "b"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::set<std::string> left;
        for (const json& r : ReadLines(records_)) {
          if (r["event"] == "leave" && r.value("job_id", "") == "b")
            left.insert(r["trainer_id"].get<std::string>());
        }
        return left == b_members;
      },
      milliseconds(60000)))
      << Diag();
  std::vector<json> b_gens;
  for (const json& e : JobEvents("b")) {
    if (e.value("type", "") == "generation") b_gens.push_back(e);
  }
  ASSERT_FALSE(b_gens.empty());
  EXPECT_EQ(b_gens.back()["reason"], "stop") << b_gens.back().dump();
  EXPECT_EQ(b_gens.back()["world_size_after"], 0) << b_gens.back().dump();
  for (const json& g : b_gens) EXPECT_FALSE(g["failure"].get<bool>()) << g.dump();
  for (const json& e : JobEvents("b")) EXPECT_NE(e.value("type", ""), "kill") << e.dump();
  for (const std::string& node : {"n1", "n2"}) {
    const std::string log = Slurp(dir_.Join(node + ".log"));
    EXPECT_EQ(log.find("SIGKILL"), std::string::npos) << log;
  }

  // A cancelled job stays ended across a restart, and is not run again.
  KillServer();
  if (HasFatalFailure()) return;
  StartServerOn(port_);
  if (HasFatalFailure()) return;
  // a's remaining trainer was adopted again.
  ASSERT_TRUE(WaitFor([&] { return CountJobEvents("a", "recovered") == 2; }, milliseconds(60000)))
      << Diag();
  ASSERT_TRUE(WaitFor(
      [&] {  // both nodes registered with this server (ctl stop then reaches their clients)
        const std::string log = Slurp(dir_.Join("server.log"));
        const size_t resumed = log.rfind("resuming the cluster");
        for (const char* n : {"node n1 registered", "node n2 registered"}) {
          const size_t at = log.rfind(n);
          if (at == std::string::npos || at < resumed) return false;
        }
        return true;
      },
      milliseconds(60000)))
      << Diag();
  const json last = Jobs();
  ASSERT_EQ(last["jobs"].size(), 1u) << last.dump();
  EXPECT_EQ(last["jobs"][0]["name"], "a");
  ASSERT_EQ(last["ended"].size(), 1u) << last.dump();
  EXPECT_EQ(last["ended"][0]["name"], "b");
  EXPECT_EQ(last["ended"][0]["state"], "cancelled");

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);

  // A single-job server refuses the cluster's state directory (it would take the cluster's nodes).
  Proc single({test::EdlBinary(), "server", "--server_port", "0", "--bind", "127.0.0.1",
               "--secret_file", secret_, "--job_id", "itest", "--events_dir", dir_.Join("events"),
               "--state_dir", dir_.Join("state")},
              dir_.Join("single.log"));
  EXPECT_EQ(single.Wait(milliseconds(20000)), 1);
  EXPECT_NE(Slurp(dir_.Join("single.log")).find("holds a cluster server's state"),
            std::string::npos)
      << Slurp(dir_.Join("single.log"));
}

// A node's client stopped (SIGSTOP) past the heartbeat timeout: the cluster loses the node and
// every job on it re-forms without its trainers (a failure generation; the other node's trainers
// keep their pids). After SIGCONT the client re-attaches: the node is new to the cluster, so the
// trainers it still runs are in no live generation and are killed (`stale_trainers`), and the job
// grows back onto the node with new trainers (jobserver/state/STATE.md, "Resuming").
TEST_F(ClusterRestartTest, ANodeLostAndReattachedHasItsStaleTrainersKilledAndIsUsedAgain) {
  std::unique_ptr<Proc> c1, c2;
  StartServerAndTwoNodes(&c1, &c2);
  if (HasFatalFailure()) return;
  Submit("a", 4);
  if (HasFatalFailure()) return;
  std::string out;
  int64_t g0 = 0;
  ASSERT_TRUE(WaitFor([&] { return (g0 = LastGeneration("a")) > 0 && KvDone("a", g0).size() == 4; },
                      milliseconds(60000)))
      << Diag();
  const std::set<std::string> first = KvDone("a", g0);
  std::set<std::string> on_n1, on_n2;
  for (const std::string& id : first) (id.rfind("n1-", 0) == 0 ? on_n1 : on_n2).insert(id);
  ASSERT_EQ(on_n1.size(), 2u);
  ASSERT_EQ(on_n2.size(), 2u);
  const auto pids_before = Pids();

  ASSERT_EQ(::kill(c2->pid(), SIGSTOP), 0);
  json lost;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& e : JobEvents("a")) {
          if (e.value("type", "") == "generation" && e["generation"] > g0 && e["failure"] == true)
            lost = e;
        }
        return !lost.is_null();
      },
      milliseconds(60000)))
      << Diag();
  EXPECT_EQ(lost["world_size_after"], 2) << lost.dump();
  // n1's trainers re-formed without n2's.
  ASSERT_TRUE(WaitFor([&] { return KvDone("a", lost["generation"].get<int64_t>()) == on_n1; },
                      milliseconds(60000)))
      << Diag();
  ASSERT_EQ(::kill(c2->pid(), SIGCONT), 0);

  // Re-attached: n2's old trainers are killed as stale, and a grows back to 4 with new ones there.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& e : ReadLines(dir_.Join("events/itest.events.jsonl"))) {
          if (e.value("type", "") != "stale_trainers") continue;
          std::set<std::string> ids;
          for (const json& id : e["trainer_ids"]) ids.insert(id.get<std::string>());
          return ids == on_n2;
        }
        return false;
      },
      milliseconds(60000)))
      << Diag();
  int64_t grown = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        grown = LastGeneration("a");
        return grown > lost["generation"].get<int64_t>() && KvDone("a", grown).size() == 4;
      },
      milliseconds(60000)))
      << Diag();
  const std::set<std::string> now = KvDone("a", grown);
  const auto pids_after = Pids();
  for (const std::string& id : on_n1) {
    EXPECT_TRUE(now.count(id)) << id << " is no longer a member";
    EXPECT_EQ(pids_after.at(id), pids_before.at(id)) << id << " was restarted";
  }
  for (const std::string& id : on_n2)
    EXPECT_FALSE(now.count(id)) << id << " was adopted after its node was lost";
  int fresh_on_n2 = 0;
  for (const std::string& id : now) fresh_on_n2 += id.rfind("n2-", 0) == 0 && !first.count(id);
  EXPECT_EQ(fresh_on_n2, 2) << Diag();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

}  // namespace
}  // namespace edl
