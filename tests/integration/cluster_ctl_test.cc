// `edl server --cluster` with a real `edl client` (stand-in trainers) and `edl ctl`: bad
// submissions are refused with a message naming the fix and change nothing; and the single-job
// server's EDL demo policy with the original's meaning of its flags.
#include <fstream>

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

class ClusterCtlTest : public itest::ControlPlaneHarness {
 protected:
  void StartServerWith(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {test::EdlBinary(),
                                     "server",
                                     "--server_port",
                                     "0",
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
                                     "20"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<Proc>(argv, dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  }
  std::string Job(const std::string& name, const std::string& body) {
    const std::string path = dir_.Join(name + ".ini");
    std::ofstream(path) << body;
    return path;
  }
};

TEST_F(ClusterCtlTest, BadSubmissionsAreRefusedWithTheFixAndChangeNothing) {
  StartServerWith({"--cluster", "--job_checkpoint_root", "/ckpt"});
  auto client = StartClient("n1", "inplace", "",
                            {{"job_type", std::string("standin = ") + STAND_IN_TRAINER},
                             {"job_flags", "standin = epochs,checkpoint_dir"},
                             {"checkpoint_root", "/ckpt"}});
  ASSERT_TRUE(WaitFor(
      [&] {
        return Slurp(dir_.Join("server.log")).find("node n1 registered") != std::string::npos;
      },
      milliseconds(30000)))
      << Slurp(dir_.Join("server.log"));
  std::string out;
  ASSERT_EQ(
      Ctl({"submit", Job("a", "name = a\ntype = standin\nmin = 1\nmax = 1\n[flags]\nepochs = 2\n")},
          &out),
      0)
      << out;
  // Its trainer runs: the job's own generation, in the job's own events log.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& e : ReadLines(dir_.Join("events/a.events.jsonl"))) {
          if (e.value("type", "") == "generation" && e.value("world_size_after", 0) == 1)
            return true;
        }
        return false;
      },
      milliseconds(30000)))
      << Slurp(dir_.Join("server.log"));
  const json before = Jobs();
  ASSERT_EQ(before["jobs"].size(), 1u) << before.dump();

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"name = b\ntype = standin\nmin = 3\nmax = 2\n", "min 3 > max 2"},
      {"name = b\ntype = bert\nmin = 1\nmax = 1\n", "no node offers job type 'bert'"},
      {"name = b\ntype = standin\nmin = 1\nmax = 1\n[flags]\nlr = 0.1\n",
       "does not declare flag 'lr' settable"},
      {"name = a\ntype = standin\nmin = 1\nmax = 1\n", "already submitted"},
      {"name = b\ntype = standin\nmin = 1\nmax = 1\n[flags]\ncheckpoint_dir = /etc/b\n",
       "outside the checkpoint root"},
  };
  for (const auto& [ini, expect] : bad) {
    EXPECT_EQ(Ctl({"submit", Job("bad", ini)}, &out), 1) << ini << out;
    EXPECT_NE(out.find(expect), std::string::npos) << ini << " -> " << out;
  }
  // A typo never leaves ctl.
  EXPECT_EQ(
      Ctl({"submit", Job("typo", "name = b\ntype = standin\nmin = 1\nmax = 1\nmaxx = 2\n")}, &out),
      2)
      << out;
  EXPECT_NE(out.find("maxx"), std::string::npos) << out;
  const json after = Jobs();
  EXPECT_EQ(after["jobs"].size(), 1u) << after.dump();
  EXPECT_EQ(after["jobs"][0]["name"], "a");
  EXPECT_EQ(after["jobs"][0]["generation"], before["jobs"][0]["generation"]);
  ASSERT_EQ(Ctl({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("SUBMITTED-JOBS"), std::string::npos) << out;
  EXPECT_NE(out.find("a:1"), std::string::npos) << out;
  // Jobs need a cluster server; a cluster server refuses a node that offers no job type.
  ASSERT_EQ(Ctl({"cancel", "a"}, &out), 0) << out;
  EXPECT_EQ(Jobs()["jobs"].size(), 0u);
  client->Stop();
}

TEST_F(ClusterCtlTest, SingleJobServerRefusesJobCommands) {
  StartServerWith({"--trainers", "1"});
  std::string out;
  EXPECT_EQ(Ctl({"submit", Job("a", "name = a\ntype = t\nmin = 1\nmax = 1\n")}, &out), 1) << out;
  EXPECT_NE(out.find("--cluster"), std::string::npos) << out;
}

// What is wrong with `scale`'s N is named, before anything is sent: -1 is not an unknown flag, 0
// is not "not a number", a word is not a number, and a bare NAME says what it might be.
TEST_F(ClusterCtlTest, ScaleNamesWhatIsWrongWithItsArguments) {
  StartServerWith({"--trainers", "1", "--max_trainers", "2"});
  std::string out;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"scale", "-1"}, "a job runs at least 1 trainer; to end a job use `edl ctl stop`"},
      {{"scale", "0"}, "a job runs at least 1 trainer"},
      {{"scale", "x"}, "'x' is not a number"},
      {{"scale", "kd", "2"},
       "`edl ctl scale --job kd 2` (a cluster's job) or `edl ctl scale --service kd 2`"},
      {{"scale", "--job", "a", "--service", "b", "2"}, "give --job or --service, not both"}};
  for (const auto& [args, says] : cases) {
    EXPECT_EQ(Ctl(args, &out), 2) << out;
    EXPECT_NE(out.find(says), std::string::npos) << args[1] << ": " << out;
  }
  // Past the job's bounds: the server refuses it with the bounds and the flag, and nothing changes.
  EXPECT_EQ(Ctl({"scale", "3"}, &out), 1) << out;
  EXPECT_NE(out.find("takes 1..2 trainers (the server's --min_trainers / --max_trainers), not 3"),
            std::string::npos)
      << out;
  EXPECT_EQ(Ctl({"scale", "2"}, &out), 0) << out;
}

// The EDL demo policy as the original's job server meant its flags: 2 GPUs per node in 2 pods is
// one trainer per pod, so the job starts at 2 and a step removes (then adds back) one pod.
TEST_F(ClusterCtlTest, DemoPolicyStepsWholePodsOfTheNodesGpus) {
  StartServerWith({"--node_ips", "127.0.0.1", "--gpu_num_of_node", "4", "--pod_num_of_node", "2",
                   "--time_interval_to_change", "2"});
  auto client = StartClient("n1", "inplace", "", {{"slots", "4"}});
  auto world_seq = [&] {
    std::vector<int> out;
    for (const json& g : Generations()) out.push_back(g["world_size_after"]);
    return out;
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::vector<int> w = world_seq();
        return w.size() >= 3;
      },
      milliseconds(60000)))
      << Diagnostics();
  const std::vector<int> w = world_seq();
  EXPECT_EQ(w[0], 4);  // 4 GPUs on the one node: 2 pods of 2 trainers
  EXPECT_EQ(w[1], 2);  // one pod removed
  EXPECT_EQ(w[2], 4);  // and added back
  client->Stop();
}

}  // namespace
}  // namespace edl
