// The original EDL tutorial's scenario on one `edl server --cluster` with real processes on
// loopback: two `edl client`s (2 CPU slots each) offering job type "resnet" (`edl train`, ResNet-20
// on a small Fashion-MNIST slice); jobs submitted with `edl ctl submit`. A (max 4) runs alone at 4;
// B arrives and A shrinks; C of higher priority arrives while nothing is free, the others shrink
// toward their min and C starts; C finishes and the others grow back; every job finishes, each
// with exactly-once data, and no trainer changed its pid (survivors re-form in place).
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/edl/runtime/sample_log_check.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kSamples = 256;

using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;

class ClusterTutorialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashionDir;
    }
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "cluster-tutorial-secret-0123456789");
    server_ = std::make_unique<Proc>(
        std::vector<std::string>{test::EdlBinary(), "server", "--cluster", "--server_port", "0",
                                 "--bind", "127.0.0.1", "--port_file", dir_.Join("port"),
                                 "--secret_file", secret_, "--events_dir", dir_.Join("events"),
                                 "--join_timeout_s", "120"},
        dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
    for (const std::string node : {"n1", "n2"}) {
      clients_.push_back(std::make_unique<Proc>(
          std::vector<std::string>{test::EdlBinary(),
                                   "client",
                                   "--server",
                                   "127.0.0.1:" + port_,
                                   "--secret_file",
                                   secret_,
                                   "--node_name",
                                   node,
                                   "--slots",
                                   "2",
                                   "--socket_path",
                                   dir_.Join(node + ".sock"),
                                   "--log_dir",
                                   dir_.Join("logs"),
                                   "--stop_grace_s",
                                   "2",
                                   "--leave_grace_s",
                                   "60",
                                   "--job_type",
                                   "resnet = " + test::EdlBinary() +
                                       " train --model resnet20 --train_samples " +
                                       std::to_string(kSamples) +
                                       " --batch_size 8 --base_batch 32 --lr 0.05 --lr_decay "
                                       "constant --threads 1 --log_every 10 "
                                       "--eval false --comm_timeout_s 30",
                                   "--job_flags",
                                   "resnet = epochs,sample_log"},
          dir_.Join(node + ".log")));
    }
    // A job is placed only on nodes that offer its type: submit once both have registered theirs
    // (under load the first submit could otherwise find no node, and be refused for it).
    for (const std::string node : {"n1", "n2"}) {
      const std::string line = "node " + node + " registered";
      ASSERT_TRUE(
          WaitFor([&] { return Slurp(dir_.Join("server.log")).find(line) != std::string::npos; },
                  milliseconds(120000)))
          << Diagnostics();
    }
  }

  int Ctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {test::EdlBinary(),    "ctl",           "--server",
                                     "127.0.0.1:" + port_, "--secret_file", secret_};
    argv.insert(argv.end(), args.begin(), args.end());
    return itest::RunCommand(argv, dir_.Join("ctl.log"), milliseconds(60000));
  }

  int Submit(const std::string& name, int min, int max, int priority, int epochs) {
    const std::string ini = dir_.Join(name + ".ini");
    std::ofstream(ini) << "name = " << name << "\ntype = resnet\nmin = " << min << "\nmax = " << max
                       << "\npriority = " << priority << "\n[flags]\nepochs = " << epochs
                       << "\nsample_log = " << dir_.Join(name + ".samples.jsonl") << "\n";
    return Ctl({"submit", ini});
  }

  std::vector<json> Events(const std::string& job) {
    return ReadLines(dir_.Join("events/" + job + ".events.jsonl"));
  }

  // The newest generation of `job` whose members all synced; its world size (0: none yet), and
  // its number in *gen.
  int FormedWorld(const std::string& job, int64_t* gen = nullptr) {
    std::map<int64_t, int> world, synced;
    for (const json& e : Events(job)) {
      if (e.value("type", "") == "generation") world[e["generation"]] = e["world_size_after"];
      if (e.value("type", "") == "trainer_event" && e.value("event", "") == "sync")
        synced[e["generation"]]++;
    }
    for (auto it = world.rbegin(); it != world.rend(); ++it) {
      if (it->second > 0 && synced[it->first] >= it->second) {
        if (gen != nullptr) *gen = it->first;
        return it->second;
      }
    }
    return 0;
  }
  bool WaitFormed(const std::string& job, int world) {
    return WaitFor([&] { return FormedWorld(job) == world || Finished(job); },
                   milliseconds(240000)) &&
           FormedWorld(job) == world;
  }
  bool Finished(const std::string& job) {
    for (const json& e : Events(job)) {
      if (e.value("type", "") == "finished") return true;
    }
    return false;
  }
  // The trainers' pids as their events report them: every id always from one pid.
  void ExpectStablePids(const std::string& job) {
    std::map<std::string, std::set<int64_t>> pids;
    for (const json& e : Events(job)) {
      if (e.value("type", "") == "trainer_event" && e.contains("pid"))
        pids[e["trainer"]].insert(e["pid"].get<int64_t>());
    }
    EXPECT_FALSE(pids.empty()) << job;
    for (auto& [id, p] : pids) EXPECT_EQ(p.size(), 1u) << job << ": " << id << " changed pid";
  }
  void ExpectExactlyOnce(const std::string& job, int epochs) {
    std::map<int64_t, test::LoggedStep> steps;
    ASSERT_EQ(test::ReadSampleLogs({dir_.Join(job + ".samples.jsonl")}, &steps), "") << job;
    ASSERT_FALSE(steps.empty()) << job;
    EXPECT_EQ(steps.rbegin()->second.epoch, epochs - 1) << job;
    EXPECT_EQ(test::CheckExactlyOnce(steps, kSamples, epochs), "") << job;
  }
  std::string Diagnostics() {
    std::string out = "\n--- server\n" + Slurp(dir_.Join("server.log"), 6000) + "\n--- ctl\n" +
                      Slurp(dir_.Join("ctl.log"), 3000);
    for (const std::string job : {"A", "B", "C"}) {
      out +=
          "\n--- " + job + " events\n" + Slurp(dir_.Join("events/" + job + ".events.jsonl"), 6000);
    }
    for (const std::string node : {"n1", "n2"})
      out += "\n--- " + node + "\n" + Slurp(dir_.Join(node + ".log"), 4000);
    return out;
  }

  test::ScratchDir dir_{"edl-cluster"};
  std::string secret_, port_;
  std::unique_ptr<Proc> server_;
  std::vector<std::unique_ptr<Proc>> clients_;
};

TEST_F(ClusterTutorialTest, JobsShrinkForAHigherPriorityJobAndGrowBack) {
  // A and B run long enough to see C through; C is short.
  constexpr int kLongEpochs = 24, kShortEpochs = 3;
  ASSERT_EQ(Submit("A", 1, 4, 1, kLongEpochs), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_TRUE(WaitFormed("A", 4)) << Diagnostics();

  ASSERT_EQ(Submit("B", 1, 4, 1, kLongEpochs), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_TRUE(WaitFormed("A", 2)) << Diagnostics();
  ASSERT_TRUE(WaitFormed("B", 2)) << Diagnostics();

  ASSERT_EQ(Submit("C", 2, 2, 5, kShortEpochs), 0) << Slurp(dir_.Join("ctl.log"));
  ASSERT_TRUE(WaitFormed("A", 1)) << Diagnostics();
  ASSERT_TRUE(WaitFormed("B", 1)) << Diagnostics();
  ASSERT_TRUE(WaitFormed("C", 2)) << Diagnostics();
  ASSERT_EQ(Ctl({"status"}), 0);
  const std::string status = Slurp(dir_.Join("ctl.log"));
  EXPECT_NE(status.find("A:1|B:1|C:2"), std::string::npos) << status;

  ASSERT_TRUE(WaitFor([&] { return Finished("C"); }, milliseconds(240000))) << Diagnostics();
  ASSERT_TRUE(WaitFormed("A", 2)) << Diagnostics();
  ASSERT_TRUE(WaitFormed("B", 2)) << Diagnostics();
  ASSERT_TRUE(WaitFor([&] { return Finished("A") && Finished("B"); }, milliseconds(400000)))
      << Diagnostics();

  ExpectExactlyOnce("A", kLongEpochs);
  ExpectExactlyOnce("B", kLongEpochs);
  ExpectExactlyOnce("C", kShortEpochs);
  for (const std::string job : {"A", "B", "C"}) ExpectStablePids(job);
  for (auto& c : clients_) c->Stop();
}

}  // namespace
}  // namespace edl
