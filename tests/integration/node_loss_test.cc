// Node loss with real processes: a real `edl server`, two `edl client`s with stand-in trainers.
//  - SIGKILL of a client: its trainers die with it (PR_SET_PDEATHSIG), the server loses the node
//    (closed connection, then the heartbeat bound) and the survivors re-form in place; with a
//    survivor's report that its collective failed, at once;
//  - SIGSTOP of a client past --heartbeat_timeout_ms: the node is dropped and the others re-form;
//    after SIGCONT the client reconnects and its welcome says it was dropped: the client logs why,
//    stops its stale trainers itself (the server kills them too: they are in no generation any
//    more) and the node joins afresh with new trainers.
#include <signal.h>

#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::ReadLines;
using itest::WaitFor;

// A process that has not exited (a zombie counts as gone).
bool Alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

class NodeLossTest : public itest::ControlPlaneHarness {
 protected:
  // Start records by trainer id.
  std::map<std::string, json> Starts() {
    std::map<std::string, json> out;
    for (const json& r : ReadLines(records_)) {
      if (r["event"] == "start") out[r["trainer_id"].get<std::string>()] = r;
    }
    return out;
  }
  void StartFour() {
    StartServer("", 4);
    if (HasFatalFailure()) return;
    c1_ = StartClient("n1", "inplace");
    c2_ = StartClient("n2", "inplace");
    ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 4; }, milliseconds(60000))) << Diagnostics();
  }
  // SIGKILLs client `c` and waits until its trainers (`pids`) died with it.
  void KillClientAndItsTrainers(itest::Proc* c, const std::set<int>& pids) {
    ASSERT_EQ(::kill(c->pid(), SIGKILL), 0);
    EXPECT_EQ(c->Wait(milliseconds(10000)), 128 + SIGKILL);
    ASSERT_TRUE(WaitFor(
        [&] {
          for (int pid : pids) {
            if (Alive(pid)) return false;
          }
          return true;
        },
        milliseconds(20000)))
        << "the killed client's trainers outlived it";
  }
  std::unique_ptr<itest::Proc> c1_, c2_;
};

TEST_F(NodeLossTest, ClientSigkillTakesItsTrainersAndTheOthersReformInPlace) {
  StartFour();
  if (HasFatalFailure()) return;
  std::set<int> n1_pids, n2_pids;
  for (const auto& [id, r] : Starts())
    (id.rfind("n1-", 0) == 0 ? n1_pids : n2_pids).insert(r["pid"].get<int>());
  ASSERT_EQ(n2_pids.size(), 2u);
  KillClientAndItsTrainers(c2_.get(), n2_pids);
  if (HasFatalFailure()) return;
  int64_t lost = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        lost = FirstGeneration(
            [](const json& g) { return g["failure"] == true && g["world_size_after"] == 2; });
        return lost > 0;
      },
      milliseconds(30000)))
      << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return KvRounds(lost) == 2; }, milliseconds(30000))) << Diagnostics();
  // The survivors re-formed in place: the same two processes, nobody started anew.
  std::set<int> formed;
  for (const json& r : ReadLines(records_)) {
    if (r["event"] == "kv" && r["generation"] == lost) formed.insert(r["pid"].get<int>());
  }
  EXPECT_EQ(formed, n1_pids);
  EXPECT_EQ(Starts().size(), 4u);
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1_->Wait(milliseconds(15000)), 0);
}

// The same kill, and a survivor whose collective failed reports it (SIGUSR1 makes the stand-in
// send the runtime's comm_failed event): the closed connection and that report are proof enough,
// so the server drops the node's members at once. Its heartbeat timeout here is an hour, and the
// killed client never comes back: without the rule the job would wait that hour.
TEST_F(NodeLossTest, ASurvivorsFailedCollectiveDropsAKilledClientsTrainersAtOnce) {
  StartServer("", 4, {"--heartbeat_timeout_ms", "3600000"});
  if (HasFatalFailure()) return;
  c1_ = StartClient("n1", "inplace");
  c2_ = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 4; }, milliseconds(60000))) << Diagnostics();
  std::set<int> n2_pids;
  json survivor;
  for (const auto& [id, r] : Starts()) {
    if (id.rfind("n1-", 0) == 0) {
      survivor = r;
    } else {
      n2_pids.insert(r["pid"].get<int>());
    }
  }
  ASSERT_EQ(n2_pids.size(), 2u);
  ASSERT_TRUE(survivor.is_object());
  KillClientAndItsTrainers(c2_.get(), n2_pids);
  if (HasFatalFailure()) return;
  ASSERT_EQ(::kill(survivor["pid"].get<int>(), SIGUSR1), 0);
  int64_t lost = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        lost = FirstGeneration(
            [](const json& g) { return g["failure"] == true && g["world_size_after"] == 2; });
        return lost > 0;
      },
      milliseconds(60000)))
      << Diagnostics();
  int records = 0;
  for (const json& e : Events()) {
    if (e.value("type", "") != "members_lost_with_node") continue;
    ++records;
    EXPECT_EQ(e["node"], "n2") << e.dump();
    EXPECT_EQ(e["reporter"], survivor["trainer_id"]) << e.dump();
    EXPECT_EQ(e["trainer_ids"].size(), 2u) << e.dump();
  }
  EXPECT_EQ(records, 1) << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return KvRounds(lost) == 2; }, milliseconds(30000))) << Diagnostics();
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1_->Wait(milliseconds(15000)), 0);
}

TEST_F(NodeLossTest, StoppedClientIsDroppedThenRejoinsCleanlyAfterSigcont) {
  StartFour();
  if (HasFatalFailure()) return;
  std::set<std::string> old_n2;
  for (const auto& [id, r] : Starts()) {
    if (id.rfind("n2-", 0) == 0) old_n2.insert(id);
  }
  ASSERT_EQ(::kill(c2_->pid(), SIGSTOP), 0);
  bool reformed = false;
  const int64_t dropped = WaitForFailureAndReform(2, &reformed);
  ASSERT_EQ(::kill(c2_->pid(), SIGCONT), 0);
  ASSERT_GT(dropped, 0) << Diagnostics();
  ASSERT_TRUE(reformed) << Diagnostics();
  // Resumed: its stale trainers are stopped and the node joins afresh; the job grows back to 4
  // with new trainers on it, and every member finishes a KV round there.
  int64_t grown = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        grown = FirstGeneration([&](const json& g) {
          return g["generation"].get<int64_t>() > dropped && g["world_size_after"] == 4;
        });
        return grown > 0 && KvRounds(grown) == 4;
      },
      milliseconds(60000)))
      << Diagnostics();
  // Told so: the welcome of its reconnection says the server had dropped the node; the client says
  // why and what it does (stops its stale trainers itself) and the server records the rejoin.
  int rejoins = 0;
  for (const json& e : Events())
    rejoins += e["type"] == "node_dropped_rejoins" && e["node"] == "n2";
  EXPECT_EQ(rejoins, 1) << Diagnostics();
  const std::string client_log = itest::Slurp(dir_.Join("n2.log"));
  EXPECT_NE(client_log.find("the server dropped this node"), std::string::npos) << client_log;
  EXPECT_NE(client_log.find("stale trainer(s)"), std::string::npos) << client_log;
  EXPECT_EQ(itest::Slurp(dir_.Join("n1.log")).find("the server dropped this node"),
            std::string::npos)
      << "only the stopped node was dropped";
  json st;
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  st = json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_TRUE(st.is_object()) << out;
  for (const json& m : st["members"]) {
    EXPECT_EQ(old_n2.count(m["trainer_id"].get<std::string>()), 0u) << m.dump();
  }
  for (const std::string& id : old_n2) {
    EXPECT_TRUE(
        WaitFor([&] { return !Alive(Starts()[id]["pid"].get<int>()); }, milliseconds(20000)))
        << id;
  }
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1_->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2_->Wait(milliseconds(15000)), 0);
}

}  // namespace
}  // namespace edl
