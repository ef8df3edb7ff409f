// The job survives its server (jobserver/state/STATE.md): real `edl server` processes SIGKILLed and
// started again on the same --state_dir and port, real `edl client`s with stand-in trainers.
//  - between changes: the trainers keep their pids, the stored generation is adopted without a
//    new one, and the next change is numbered above every earlier one with a fresh trainer id;
//  - in the middle of a grow (a joiner held before its ready report): the change is rolled back,
//    its joiner killed, and a new grow with new numbers completes;
//  - a new state directory next to an old checkpoint store (--checkpoint_dir) numbers generations
//    above the store's newest, so the store's fence accepts the new rank 0's saves;
//  - a damaged state directory is refused with an error naming it and the fix; an empty one starts
//    a new job and says so;
//  - a standby on the same --state_dir (--standby) takes over the moment the leader is SIGKILLed;
//  - a finished job stays finished: no running trainer in `ctl status`, and neither a restarted
//    client nor a restarted server runs it again.
#include <signal.h>

#include <filesystem>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "edl/ckpt/checkpoint_store.h"
#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;

class ServerRestartTest : public itest::ControlPlaneHarness {
 protected:
  std::vector<std::string> ServerArgv(const std::string& port) {
    return {test::EdlBinary(),
            "server",
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
            "--min_trainers",
            "1",
            "--trainers",
            "4",
            "--events_dir",
            dir_.Join("events"),
            "--heartbeat_timeout_ms",
            "3000",
            "--join_timeout_s",
            "60",
            "--backoff_min_s",
            "0",
            "--backoff_max_s",
            "0",
            "--state_dir",
            dir_.Join("state")};
  }
  void Start(const std::string& port) {
    std::remove(dir_.Join("port").c_str());
    server_ = std::make_unique<Proc>(ServerArgv(port), dir_.Join("server.log"));
    const std::string got = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(got.empty()) << Slurp(dir_.Join("server.log"));
    if (port != "0") {
      ASSERT_EQ(got, port);
    }
    port_ = got;
  }
  void KillServer() {
    ASSERT_EQ(::kill(server_->pid(), SIGKILL), 0);
    ASSERT_EQ(server_->Wait(milliseconds(10000)), 128 + SIGKILL);
  }
  bool HasEvent(const std::string& type) {
    for (const json& e : Events()) {
      if (e["type"] == type) return true;
    }
    return false;
  }
  // Records of the stand-ins: start records by trainer id, and every pid each id wrote with.
  void Starts(std::map<std::string, json>* start_of,
              std::map<std::string, std::set<int>>* pids_of) {
    for (const json& r : ReadLines(records_)) {
      const std::string id = r["trainer_id"];
      (*pids_of)[id].insert(r["pid"].get<int>());
      if (r["event"] == "start") (*start_of)[id] = r;
    }
  }
  static uint64_t SeqOf(const std::string& id) {  // "<node>-s<slot>-<seq>"
    return std::stoull(id.substr(id.rfind('-') + 1));
  }
  json Status() {
    std::string out;
    EXPECT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
    const size_t brace = out.find('{');
    return brace == std::string::npos ? json() : json::parse(out.substr(brace), nullptr, false);
  }
};

TEST_F(ServerRestartTest, SigkillBetweenChangesKeepsTrainersAndNumbersGoOnAbove) {
  Start("0");
  if (HasFatalFailure()) return;
  auto c1 = StartClient("n1", "inplace");
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["world_size_after"] == 4; },
                                milliseconds(60000)))
      << Diagnostics();
  std::string out;
  ASSERT_EQ(Ctl({"scale", "3"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return KvRounds(2) == 3; }, milliseconds(60000))) << Diagnostics();
  std::map<std::string, json> before;
  std::map<std::string, std::set<int>> pids_before;
  Starts(&before, &pids_before);
  ASSERT_EQ(before.size(), 4u) << Diagnostics();
  uint64_t max_seq = 0;
  for (const auto& [id, r] : before) max_seq = std::max(max_seq, SeqOf(id));

  KillServer();
  if (HasFatalFailure()) return;
  const std::string port = port_;
  const size_t events_before = Events().size();
  Start(port);
  if (HasFatalFailure()) return;
  // The restarted server resumes generation 2 and adopts the three survivors as they re-attach.
  ASSERT_TRUE(WaitFor([&] { return HasEvent("recovered"); }, milliseconds(60000))) << Diagnostics();
  EXPECT_NE(Slurp(dir_.Join("server.log")).find("resuming job itest"), std::string::npos);
  std::vector<json> events = Events();
  for (size_t i = events_before; i < events.size(); ++i) {
    EXPECT_NE(events[i]["type"], "generation")
        << "a restart between changes made a generation: " << events[i].dump() << Diagnostics();
  }
  json st = Status();
  ASSERT_TRUE(st.is_object()) << Diagnostics();
  EXPECT_EQ(st["generation"], 2);
  EXPECT_EQ(st["world_size"], 3);

  // The next change: numbered above every earlier generation, a trainer id above every earlier one,
  // and forwarded to the old trainers, which re-form with the joiner.
  ASSERT_EQ(Ctl({"scale", "4"}, &out), 0) << out;
  ASSERT_TRUE(WaitForGeneration(
      [](const json& g) { return g["generation"] == 3 && g["world_size_after"] == 4; },
      milliseconds(60000)))
      << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return KvRounds(3) == 4; }, milliseconds(60000))) << Diagnostics();
  std::map<std::string, json> after;
  std::map<std::string, std::set<int>> pids_after;
  Starts(&after, &pids_after);
  ASSERT_EQ(after.size(), 5u) << Diagnostics();
  for (const auto& [id, r] : after) {
    EXPECT_EQ(pids_after[id].size(), 1u) << id << " was restarted";
    if (before.count(id)) {
      EXPECT_EQ(pids_after[id], pids_before[id]) << id;
    } else {
      EXPECT_GT(SeqOf(id), max_seq) << "a trainer id was reused after the restart: " << id;
      EXPECT_EQ(r["generation"], 3) << r.dump();
      EXPECT_TRUE(r["joining"].get<bool>());
    }
  }
  for (const json& g : Generations())
    EXPECT_FALSE(g["failure"].get<bool>()) << g.dump() << Diagnostics();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

TEST_F(ServerRestartTest, SigkillDuringAGrowRollsItBackAndTheNextGrowUsesNewNumbers) {
  Start("0");
  if (HasFatalFailure()) return;
  const std::string hold = dir_.Join("hold-ready");
  std::ofstream(hold) << "x";
  const std::map<std::string, std::string> env = {{"STANDIN_HOLD_READY_FILE", hold}};
  auto c1 = StartClient("n1", "inplace", "", {}, env);
  auto c2 = StartClient("n2", "inplace", "", {}, env);
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["world_size_after"] == 4; },
                                milliseconds(60000)))
      << Diagnostics();
  std::string out;
  ASSERT_EQ(Ctl({"scale", "2"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return KvRounds(2) == 2; }, milliseconds(60000))) << Diagnostics();
  // Grow 2 -> 4: the joiners start and hold their ready reports: the change is in flight.
  ASSERT_EQ(Ctl({"scale", "4"}, &out), 0) << out;
  std::set<std::string> held;
  ASSERT_TRUE(WaitFor(
      [&] {
        held.clear();
        for (const json& r : ReadLines(records_)) {
          if (r["event"] == "holding") held.insert(r["trainer_id"].get<std::string>());
        }
        return held.size() == 2;
      },
      milliseconds(60000)))
      << Diagnostics();
  KillServer();
  if (HasFatalFailure()) return;
  std::remove(hold.c_str());  // joiners of the next grow report ready at once
  const std::string port = port_;
  Start(port);
  if (HasFatalFailure()) return;

  // Rolled back: the held joiners are killed (never members), and the grow is made again, with a
  // generation number above the one the dead server had prepared (3).
  ASSERT_TRUE(WaitForGeneration(
      [](const json& g) { return g["world_size_after"] == 4 && g["generation"] >= 4; },
      milliseconds(60000)))
      << Diagnostics();
  int64_t grown = 0;
  for (const json& g : Generations()) {
    EXPECT_NE(g["generation"], 3) << "the number of the rolled-back change was reused"
                                  << Diagnostics();
    for (const std::string& id : held) EXPECT_EQ(g.dump().find(id), std::string::npos);
    if (g["world_size_after"] == 4) grown = g["generation"].get<int64_t>();
  }
  ASSERT_TRUE(WaitFor([&] { return KvRounds(grown) == 4; }, milliseconds(60000))) << Diagnostics();
  bool killed = false;
  for (const json& e : Events()) {
    if (e["type"] == "stale_trainers") killed = true;
  }
  EXPECT_TRUE(killed) << Diagnostics();
  json st = Status();
  ASSERT_TRUE(st.is_object());
  for (const json& m : st["members"]) {
    EXPECT_EQ(held.count(m["trainer_id"].get<std::string>()), 0u) << m.dump();
  }
  // The two survivors of generation 2 kept their processes.
  std::map<std::string, json> starts;
  std::map<std::string, std::set<int>> pids;
  Starts(&starts, &pids);
  int original = 0;
  for (const json& m : st["members"]) {
    const std::string id = m["trainer_id"];
    EXPECT_EQ(pids[id].size(), 1u) << id;
    original += starts[id]["generation"] == 1;
  }
  EXPECT_EQ(original, 2) << Diagnostics();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

TEST_F(ServerRestartTest, ANewStateDirNextToAnOldCheckpointStoreNumbersAboveTheStore) {
  // The store holds a checkpoint of generation 5 from an earlier run whose state is gone.
  ckpt::RocksDbStoreOptions so;
  so.dir = dir_.Join("ckpt");
  auto store = ckpt::OpenRocksDbStore(so);
  ckpt::CheckpointMeta meta;
  meta.step = 60;
  meta.generation = 5;
  meta.world_size = 2;
  const float w[4] = {1, 2, 3, 4};
  ckpt::TensorView v;
  v.name = "w";
  v.shape = {4};
  v.data = w;
  v.bytes = sizeof(w);
  ASSERT_OK(store->Save(meta, {v}, nullptr));
  std::vector<std::string> argv = ServerArgv("0");
  argv.insert(argv.end(), {"--checkpoint_dir", dir_.Join("ckpt")});
  server_ = std::make_unique<Proc>(argv, dir_.Join("server.log"));
  port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
  ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  auto c1 = StartClient("n1", "inplace");
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["world_size_after"] == 4; },
                                milliseconds(60000)))
      << Diagnostics();
  const std::vector<json> gens = Generations();
  EXPECT_EQ(gens.front()["generation"], 6) << Diagnostics();
  // Its rank 0 may save: the fence compares 6 with the stored 5.
  meta.step = 70;
  meta.generation = gens.front()["generation"].get<int64_t>();
  EXPECT_OK(store->Save(meta, {v}, nullptr));
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(10000)), 0);
}

TEST_F(ServerRestartTest, DamagedStateDirIsRefusedAndAnEmptyOneStartsANewJob) {
  // An empty (missing) state dir: a new job, said so.
  Start("0");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(WaitFor([&] { return HasEvent("new_job"); }, milliseconds(20000))) << Diagnostics();
  EXPECT_NE(Slurp(dir_.Join("server.log")).find("starting a new job"), std::string::npos);
  KillServer();
  if (HasFatalFailure()) return;
  namespace fs = std::filesystem;
  const fs::path state = dir_.Join("state");
  ASSERT_TRUE(fs::exists(state / "CURRENT"));

  // CURRENT names a manifest that is not there.
  std::ofstream(state / "CURRENT", std::ios::trunc) << "MANIFEST-999999\n";
  {
    Proc p(ServerArgv("0"), dir_.Join("damaged.log"));
    EXPECT_EQ(p.Wait(milliseconds(30000)), 1);
  }
  std::string log = Slurp(dir_.Join("damaged.log"));
  EXPECT_NE(log.find("--state_dir " + state.string()), std::string::npos) << log;
  EXPECT_NE(log.find("move it aside"), std::string::npos) << log;

  // A directory with files but no database.
  fs::remove_all(state);
  fs::create_directories(state);
  std::ofstream(state / "notes.txt") << "not a database";
  {
    Proc p(ServerArgv("0"), dir_.Join("foreign.log"));
    EXPECT_EQ(p.Wait(milliseconds(30000)), 1);
  }
  log = Slurp(dir_.Join("foreign.log"));
  EXPECT_NE(log.find("holds no state database"), std::string::npos) << log;
  EXPECT_NE(log.find("move it aside"), std::string::npos) << log;
}

// A standby on the same --state_dir (STATE.md "Standbys on one state directory"): --standby needs
// --state_dir; a second server on a held directory fails without --standby; with it, it waits
// without listening and takes over the moment the leader is SIGKILLed, on the same port, adopting
// the running trainers; a standby ends cleanly on SIGTERM.
TEST_F(ServerRestartTest, AStandbyOnTheStateDirTakesOverTheMomentTheLeaderIsKilled) {
  Start("0");
  if (HasFatalFailure()) return;
  const std::string port = port_;
  // argv of a second server on the same port and directory, with its own port file and log.
  auto second = [&](const std::string& name, bool standby) {
    std::vector<std::string> argv = ServerArgv(port);
    *std::find(argv.begin(), argv.end(), dir_.Join("port")) = dir_.Join(name + ".port");
    if (standby) argv.push_back("--standby");
    return std::make_unique<Proc>(argv, dir_.Join(name + ".log"));
  };
  {
    Proc no_dir({test::EdlBinary(), "server", "--secret_file", secret_, "--standby"},
                dir_.Join("no_dir.log"));
    EXPECT_EQ(no_dir.Wait(milliseconds(30000)), 2);
    EXPECT_NE(Slurp(dir_.Join("no_dir.log")).find("--standby needs --state_dir"), std::string::npos)
        << Slurp(dir_.Join("no_dir.log"));
    auto refused = second("refused", /*standby=*/false);
    EXPECT_EQ(refused->Wait(milliseconds(30000)), 1);
    EXPECT_NE(Slurp(dir_.Join("refused.log")).find("Another edl server uses this state directory"),
              std::string::npos)
        << Slurp(dir_.Join("refused.log"));
  }
  auto b = second("b", /*standby=*/true);
  const std::string waits_for_a =
      "standby for job itest: the leader is pid " + std::to_string(server_->pid());
  ASSERT_TRUE(
      WaitFor([&] { return Slurp(dir_.Join("b.log")).find(waits_for_a) != std::string::npos; },
              milliseconds(30000)))
      << Slurp(dir_.Join("b.log"));
  auto c1 = StartClient("n1", "inplace");
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["world_size_after"] == 4; },
                                milliseconds(60000)))
      << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 4; }, milliseconds(60000))) << Diagnostics();
  const auto pids_before = Pids();  // the clients' warm spares left out
  ASSERT_EQ(pids_before.size(), 4u) << Diagnostics();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("b.port")))
      << "the standby listened while the leader ran";

  KillServer();
  if (HasFatalFailure()) return;
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(itest::WaitForPortFile(dir_.Join("b.port"), b.get()), port)
      << Slurp(dir_.Join("b.log"));
  std::printf("the standby listened %lld ms after the leader's SIGKILL (load %s)\n",
              static_cast<long long>(std::chrono::duration_cast<milliseconds>(
                                         std::chrono::steady_clock::now() - killed)
                                         .count()),
              Slurp("/proc/loadavg").substr(0, 14).c_str());
  const std::string b_log = Slurp(dir_.Join("b.log"));
  EXPECT_NE(b_log.find("takes over --state_dir " + dir_.Join("state")), std::string::npos) << b_log;
  EXPECT_NE(b_log.find("resuming job itest"), std::string::npos) << b_log;
  ASSERT_TRUE(WaitFor([&] { return HasEvent("recovered"); }, milliseconds(60000)))
      << Diagnostics() << b_log;
  json st = Status();
  ASSERT_TRUE(st.is_object()) << Diagnostics();
  EXPECT_EQ(st["generation"], 1);
  EXPECT_EQ(st["world_size"], 4);

  // The next standby waits for b; SIGTERM ends it cleanly before it ever leads.
  auto c = second("c", /*standby=*/true);
  const std::string waits_for_b =
      "standby for job itest: the leader is pid " + std::to_string(b->pid());
  ASSERT_TRUE(
      WaitFor([&] { return Slurp(dir_.Join("c.log")).find(waits_for_b) != std::string::npos; },
              milliseconds(30000)))
      << Slurp(dir_.Join("c.log"));
  ASSERT_EQ(::kill(c->pid(), SIGTERM), 0);
  EXPECT_EQ(c->Wait(milliseconds(10000)), 0) << Slurp(dir_.Join("c.log"));
  EXPECT_NE(Slurp(dir_.Join("c.log")).find("stopped while a standby for job itest"),
            std::string::npos)
      << Slurp(dir_.Join("c.log"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("c.port")));

  // b serves the job: the next change reaches the same trainers.
  std::string out;
  port_ = port;
  ASSERT_EQ(Ctl({"scale", "3"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return KvRounds(2) == 3; }, milliseconds(60000)))
      << Diagnostics() << b_log;
  EXPECT_EQ(Pids(), pids_before) << "a trainer was restarted or added" << Diagnostics();
  for (const json& g : Generations())
    EXPECT_FALSE(g["failure"].get<bool>()) << g.dump() << Diagnostics();

  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(b->Wait(milliseconds(10000)), 0) << Slurp(dir_.Join("b.log"));
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

// Issue 14: a finished job ran again after restarts (the full last generation sent to a client
// that no longer ran its members started them anew). Now `done` alone is sent.
TEST_F(ServerRestartTest, FinishedJobStaysFinishedAcrossClientAndServerRestarts) {
  Start("0");
  if (HasFatalFailure()) return;
  const std::map<std::string, std::string> finish = {{"STANDIN_EXIT_AFTER_MS", "1000"}};
  auto c1 = StartClient("n1", "inplace", "", {}, finish);
  auto c2 = StartClient("n2", "inplace", "", {}, finish);
  ASSERT_TRUE(WaitFor([&] { return HasEvent("finished"); }, milliseconds(60000))) << Diagnostics();
  auto told_done = [&](const std::string& node) {
    const std::string log = Slurp(dir_.Join(node + ".log"));
    int n = 0;
    for (size_t at = log.find("the job finished"); at != std::string::npos;
         at = log.find("the job finished", at + 1))
      ++n;
    return n;
  };
  ASSERT_TRUE(
      WaitFor([&] { return told_done("n1") == 1 && told_done("n2") == 1; }, milliseconds(30000)))
      << Diagnostics();
  std::map<std::string, json> starts;
  std::map<std::string, std::set<int>> pids;
  Starts(&starts, &pids);
  ASSERT_EQ(starts.size(), 4u) << Diagnostics();
  for (const json& e : Events()) {
    EXPECT_FALSE(e["type"] == "trainer_exit" && e["success"] == false) << e.dump();
  }
  json st = Status();
  ASSERT_TRUE(st.is_object()) << Diagnostics();
  EXPECT_TRUE(st["done"].get<bool>());
  EXPECT_EQ(st["running"], 0) << st.dump();
  EXPECT_EQ(st["used_slots"], 0) << st.dump();
  std::string out;
  ASSERT_EQ(Ctl({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("itest:0"), std::string::npos) << "no running trainer after finished:\n"
                                                    << out;
  EXPECT_NE(out.find("finished"), std::string::npos) << out;

  // A restarted client is told the job is done and starts nothing.
  c2->Kill(SIGKILL);
  ASSERT_EQ(c2->Wait(milliseconds(10000)), 128 + SIGKILL);
  c2 = StartClient("n2", "inplace", "", {}, finish);
  ASSERT_TRUE(WaitFor([&] { return told_done("n2") == 2; }, milliseconds(30000))) << Diagnostics();
  // So is every client of a restarted server.
  KillServer();
  if (HasFatalFailure()) return;
  Start(port_);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(
      WaitFor([&] { return told_done("n1") == 2 && told_done("n2") == 3; }, milliseconds(60000)))
      << Diagnostics();
  st = Status();
  ASSERT_TRUE(st.is_object()) << Diagnostics();
  EXPECT_TRUE(st["done"].get<bool>());
  EXPECT_EQ(st["running"], 0) << st.dump();
  starts.clear();
  pids.clear();
  Starts(&starts, &pids);
  EXPECT_EQ(starts.size(), 4u) << Diagnostics();
  for (const auto& [id, p] : pids)
    EXPECT_EQ(p.size(), 1u) << "finished trainer " << id << " was started again";
  int start_records = 0;
  for (const json& r : ReadLines(records_)) start_records += r["event"] == "start";
  EXPECT_EQ(start_records, 4) << Diagnostics();
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(20000)), 0);
}

}  // namespace
}  // namespace edl
