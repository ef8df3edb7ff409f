// Control-plane operations end to end on loopback: `edl ctl watch`, `--exit_when_done` on server
// and client, and the client's kill of a trainer that is stopped (SIGSTOP) and silent on its
// channel.
#include <signal.h>

#include <cerrno>
#include <set>
#include <sstream>

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

using ControlPlaneOpsTest = itest::ControlPlaneHarness;

TEST_F(ControlPlaneOpsTest, WatchPrintsALinePerChangeAndEveryEventRecord) {
  StartServer("0 set 2\n3 set 1\n", 2);
  const std::string out = dir_.Join("watch.out");
  Proc watch(CtlArgv({"watch"}), out);
  ASSERT_TRUE(WaitFor([&] { return Slurp(out).rfind("status ", 0) == 0; }, milliseconds(10000)))
      << "the watch never printed its first status line: " << Slurp(out);
  auto c1 = StartClient("n1", "inplace");
  ASSERT_TRUE(
      WaitForGeneration([](const json& g) { return g["generation"] == 2; }, milliseconds(30000)))
      << Diagnostics();
  // Every events-log record (but progress) from the first one the watch printed on reaches it as
  // one `event` line (records before the watch connected cannot), generation records included.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string w = Slurp(out);
        bool started = false;
        int generations = 0;
        for (const json& e : Events()) {
          // Progress records are the status lines' content, written to the log once a second;
          // watchers get them as `status` lines, not as `event` lines.
          if (e["type"] == "progress") continue;
          const bool printed = w.find("event " + e.dump() + "\n") != std::string::npos;
          if (!started && !printed) continue;
          started = true;
          if (!printed) return false;
          generations += e["type"] == "generation" ? 1 : 0;
        }
        return generations == 2;
      },
      milliseconds(10000)))
      << "--- watch\n"
      << Slurp(out) << Diagnostics();
  // Status lines: the initial one, then one per change (world 0 -> 2 -> 1), never two equal in a
  // row.
  ASSERT_TRUE(WaitFor([&] { return Slurp(out).find("status generation=2") != std::string::npos; },
                      milliseconds(10000)))
      << Slurp(out);
  std::vector<std::string> status;
  std::istringstream lines(Slurp(out));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("status ", 0) == 0) status.push_back(line);
  }
  ASSERT_GE(status.size(), 3u) << Slurp(out);
  for (size_t i = 1; i < status.size(); ++i) EXPECT_NE(status[i], status[i - 1]) << Slurp(out);
  // `edl ctl stop` ends the job; the watcher notices and exits 0.
  std::string ctl;
  ASSERT_EQ(Ctl({"stop"}, &ctl), 0) << ctl;
  EXPECT_EQ(watch.Wait(milliseconds(15000)), 0) << Slurp(out);
  EXPECT_NE(Slurp(out).find("server closed the connection"), std::string::npos) << Slurp(out);
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
}

TEST_F(ControlPlaneOpsTest, ExitWhenDoneStopsServerAndClientsOnceEveryTrainerExitedZero) {
  StartServer("", 4, {"--exit_when_done"});
  auto c1 = StartClient("n1", "inplace", "", {{"exit_when_done", ""}},
                        {{"STANDIN_EXIT_AFTER_MS", "4000"}});
  auto c2 = StartClient("n2", "inplace", "", {{"exit_when_done", ""}},
                        {{"STANDIN_EXIT_AFTER_MS", "4000"}});
  EXPECT_EQ(server_->Wait(milliseconds(60000)), 0) << Diagnostics();
  EXPECT_EQ(c1->Wait(milliseconds(20000)), 0) << Slurp(dir_.Join("n1.log"));
  EXPECT_EQ(c2->Wait(milliseconds(20000)), 0) << Slurp(dir_.Join("n2.log"));
  int finished_trainers = 0, exits = 0, finished_records = 0;
  for (const json& r : ReadLines(records_)) finished_trainers += r["event"] == "finished" ? 1 : 0;
  for (const json& e : Events()) {
    if (e["type"] == "trainer_exit") {
      ++exits;
      EXPECT_TRUE(e["success"].get<bool>()) << e.dump();
    }
    finished_records += e["type"] == "finished" ? 1 : 0;
  }
  EXPECT_EQ(finished_trainers, 4) << Diagnostics();
  EXPECT_EQ(exits, 4) << Diagnostics();
  EXPECT_EQ(finished_records, 1) << Diagnostics();
  EXPECT_EQ(Generations().size(), 1u) << "nobody is replaced once trainers finish" << Diagnostics();
}

TEST_F(ControlPlaneOpsTest, StoppedTrainerIsKilledWithoutWaitingOutTheChannelTimeout) {
  StartServer("", 2);
  auto c1 = StartClient("n1", "inplace", "", {{"trainer_timeout_s", "3600"}});
  ASSERT_TRUE(
      WaitForGeneration([](const json& g) { return g["generation"] == 1; }, milliseconds(30000)))
      << Diagnostics();
  // Freeze one stand-in once it has seen generation 1 (so its channel is up and heartbeating).
  int victim = 0;
  std::string victim_id;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& r : ReadLines(records_)) {
          if (r["event"] == "kv" && r["generation"] == 1) {
            victim = r["pid"];
            victim_id = r["trainer_id"];
            return true;
          }
        }
        return false;
      },
      milliseconds(20000)))
      << Diagnostics();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  // The client SIGKILLs it (stopped and silent; --trainer_timeout_s is an hour) and reports a
  // failure; the server commits a generation without it.
  ASSERT_TRUE(WaitForGeneration(
      [](const json& g) {
        return g["reason"] == "failure" && g["failure"] == true && g["world_size_after"] == 1;
      },
      milliseconds(30000)))
      << Diagnostics();
  EXPECT_TRUE(
      WaitFor([&] { return ::kill(victim, 0) != 0 && errno == ESRCH; }, milliseconds(10000)))
      << "pid " << victim << " still exists";
  bool reported = false;
  for (const json& e : Events()) {
    if (e["type"] == "trainer_exit" && e["trainer_id"] == victim_id) {
      reported = true;
      EXPECT_FALSE(e["success"].get<bool>()) << e.dump();
      EXPECT_EQ(e["how"], "signal 9") << e.dump();
    }
  }
  EXPECT_TRUE(reported) << Diagnostics();
  // A stopped trainer is killed once it is 2 s silent, not after --trainer_timeout_s.
  EXPECT_NE(Slurp(dir_.Join("n1.log")).find("is stopped (state T"), std::string::npos)
      << Slurp(dir_.Join("n1.log"));
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  json st = json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(st.is_discarded()) << out;
  for (const json& m : st["members"]) EXPECT_NE(m["trainer_id"], victim_id) << out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
}

}  // namespace
}  // namespace edl
