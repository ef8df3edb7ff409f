// examples/pytorch/train_ddp.py, a plain PyTorch DDP trainer (Gloo, CPU, Debian's python3-torch),
// under the real launchers: a real `edl server` + two `edl client`s in restart mode through a
// shrink, a grow and a SIGKILL of a trainer, and `edl launch` / torchrun as a local job. The
// trainer's metrics file (JSON lines: a "start" per rank and start, rank 0's "step" lines, a final
// "done") is what the assertions read; every change is made only once the previous one has been
// seen training (`edl ctl scale`, a SIGKILL by pid), so nothing depends on the machine's speed.
// Skipped, with the reason printed, where python3-torch or the data set is missing.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/process_util.h"
#include "tests/pytorch/pytorch_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;
using nlohmann::json;
using std::chrono::milliseconds;

using pytorch_test::kFashionDir;
using pytorch_test::Python;
// Long enough that the three changes land well before the end even where steps run several times
// faster than a change takes to reach the trainers (a change is made once a step of the previous
// world size is seen; each restart resumes from the last checkpoint, every 4 steps).
constexpr int kSteps = 60;
constexpr int kCheckpointEvery = 4;
// Generous bounds: every restart imports torch in each trainer, on 2 shared cores.
constexpr milliseconds kPhase{240000};

std::string Script() { return std::string(EDL_SOURCE_DIR) + "/examples/pytorch/train_ddp.py"; }

// Why this machine cannot run the test ("" when it can).
std::string SkipReason(const std::string& scratch) {
  return pytorch_test::SkipReason(scratch,
                                  "import torch.distributed as d; assert d.is_gloo_available()");
}

class PyTorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = SkipReason(dir_.path());
    if (!why.empty()) {
      std::cout << "SKIPPED: " << why << std::endl;
      GTEST_SKIP() << why;
    }
  }

  // The trainer command: ResNet-20 on a 1024-sample slice, global batch 32, kSteps steps.
  std::vector<std::string> Trainer() {
    return {Python(),
            Script(),
            "--train_samples",
            "1024",
            "--batch_size",
            "32",
            "--steps",
            std::to_string(kSteps),
            "--lr",
            "0.05",
            "--threads",
            "1",
            "--log_every",
            "1",
            "--checkpoint_dir",
            dir_.Join("ckpt"),
            "--checkpoint_every",
            std::to_string(kCheckpointEvery),
            "--metrics_file",
            dir_.Join("metrics.jsonl"),
            "--test_samples",
            "500",
            "--timeout_s",
            "120",
            "--peer_failure_wait_s",
            "120"};
  }

  std::vector<json> Metrics(const std::string& event) {
    std::vector<json> out;
    for (const json& l : ReadLines(dir_.Join("metrics.jsonl"))) {
      if (l.value("event", "") == event) out.push_back(l);
    }
    return out;
  }

  // The loss each step ended with (a step done again after a restart: its last record).
  std::map<int, double> LossByStep() {
    std::map<int, double> loss;
    for (const json& s : Metrics("step")) loss[s["step"].get<int>()] = s["loss"].get<double>();
    return loss;
  }

  // The job ran to its end: one "done" at kSteps, every step logged, the loss falling.
  void ExpectFinishedWithFallingLoss() {
    const std::vector<json> done = Metrics("done");
    ASSERT_FALSE(done.empty()) << "no 'done' record";
    EXPECT_EQ(done.back()["step"], kSteps);
    const std::map<int, double> loss = LossByStep();
    ASSERT_EQ(loss.size(), static_cast<size_t>(kSteps)) << "steps missing from the metrics";
    EXPECT_EQ(loss.begin()->first, 1);
    EXPECT_EQ(loss.rbegin()->first, kSteps);
    double first = 0, last = 0;
    for (int s = 1; s <= 5; ++s) first += loss.at(s) / 5;
    for (int s = kSteps - 4; s <= kSteps; ++s) last += loss.at(s) / 5;
    std::cout << "loss: steps 1-5 " << first << ", steps " << kSteps - 4 << "-" << kSteps << " "
              << last << "; test accuracy " << done.back()["test_accuracy"] << std::endl;
    EXPECT_LT(last, 0.8 * first) << "the loss did not fall";
    EXPECT_GT(done.back()["test_accuracy"].get<double>(), 0.3);  // 10 classes: chance is 0.1
  }

  edl::test::ScratchDir dir_{"pytorch"};
};

class PyTorchRestartModeTest : public PyTorchTest {
 protected:
  void SetUp() override {
    PyTorchTest::SetUp();
    if (IsSkipped()) return;
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "pytorch-integration-secret-0123456789");
    server_ =
        std::make_unique<Proc>(std::vector<std::string>{test::EdlBinary(), "server",
                                                        "--server_port",   "0",
                                                        "--bind",          "127.0.0.1",
                                                        "--port_file",     dir_.Join("port"),
                                                        "--secret_file",   secret_,
                                                        "--job_id",        "ptjob",
                                                        "--min_trainers",  "1",
                                                        "--trainers",      "4",
                                                        "--events_dir",    dir_.Join("events"),
                                                        "--backoff_min_s", "1",
                                                        "--backoff_max_s", "1",
                                                        "--exit_when_done"},
                               dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
    for (const char* node : {"n1", "n2"}) {
      std::vector<std::string> argv = {test::EdlBinary(),  "client",
                                       "--server",         "127.0.0.1:" + port_,
                                       "--secret_file",    secret_,
                                       "--node_name",      node,
                                       "--slots",          "2",
                                       "--mode",           "restart",
                                       "--socket_path",    dir_.Join(std::string(node) + ".sock"),
                                       "--log_dir",        dir_.Join("logs"),
                                       "--stop_grace_s",   "5",
                                       "--exit_when_done", "--"};
      for (const std::string& a : Trainer()) argv.push_back(a);
      clients_.push_back(std::make_unique<Proc>(argv, dir_.Join(std::string(node) + ".log")));
    }
  }

  std::vector<json> Generations() {
    std::vector<json> out;
    for (const json& e : ReadLines(dir_.Join("events/ptjob.events.jsonl"))) {
      if (e.value("type", "") == "generation") out.push_back(e);
    }
    return out;
  }

  // Waits until a start of `world` trainers newer than restart count `after` has trained past a
  // checkpoint of its own (rank 0 logs a step after the first multiple of kCheckpointEvery above
  // the step it resumed at), so the next start must resume from it; returns that start's
  // TORCHELASTIC_RESTART_COUNT (-1 on timeout or when the job is done).
  int WaitCheckpointedAt(int world, int after) {
    int seen = -1;
    WaitFor(
        [&] {
          std::map<int, int> resumed;  // restart count -> step rank 0 resumed at
          for (const json& s : Metrics("start")) {
            if (s["rank"] == 0) resumed[s["restart_count"].get<int>()] = s["step"].get<int>();
          }
          for (const json& s : Metrics("step")) {
            const int rc = s["restart_count"].get<int>();
            if (s["world_size"] != world || rc <= after || !resumed.count(rc)) continue;
            const int checkpoint = (resumed[rc] / kCheckpointEvery + 1) * kCheckpointEvery;
            if (s["step"].get<int>() > checkpoint) seen = rc;
          }
          return seen >= 0 || !Metrics("done").empty();
        },
        kPhase);
    return seen;
  }

  int Ctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {test::EdlBinary(),    "ctl",           "--server",
                                     "127.0.0.1:" + port_, "--secret_file", secret_};
    argv.insert(argv.end(), args.begin(), args.end());
    return itest::RunCommand(argv, dir_.Join("ctl.log"), milliseconds(60000));
  }

  std::string Diagnostics() {
    std::string logs;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir_.Join("logs"), ec)) {
      logs += "\n--- " + f.path().filename().string() + "\n" + Slurp(f.path().string(), 2000);
    }
    return "\n--- metrics\n" + Slurp(dir_.Join("metrics.jsonl"), 6000) + "\n--- events\n" +
           Slurp(dir_.Join("events/ptjob.events.jsonl"), 6000) + "\n--- server\n" +
           Slurp(dir_.Join("server.log"), 3000) + logs;
  }

  std::string secret_, port_;
  std::unique_ptr<Proc> server_;
  std::vector<std::unique_ptr<Proc>> clients_;
};

TEST_F(PyTorchRestartModeTest, ShrinkGrowAndSigkillFinishWithTheExpectedStepsAndFallingLoss) {
  // 4 trainers train; shrink to 2; grow to 3; SIGKILL one of the 3.
  const int at4 = WaitCheckpointedAt(4, -1);
  ASSERT_GE(at4, 0) << "never trained with 4 trainers" << Diagnostics();
  ASSERT_EQ(Ctl({"scale", "2"}), 0) << Slurp(dir_.Join("ctl.log"));
  const int at2 = WaitCheckpointedAt(2, at4);
  ASSERT_GE(at2, 0) << "never trained with 2 trainers after the shrink" << Diagnostics();
  ASSERT_EQ(Ctl({"scale", "3"}), 0) << Slurp(dir_.Join("ctl.log"));
  const int at3 = WaitCheckpointedAt(3, at2);
  ASSERT_GE(at3, 0) << "never trained with 3 trainers after the grow" << Diagnostics();

  // SIGKILL rank 1 of that start (a live train_ddp.py process: checked before the kill).
  pid_t victim = 0;
  for (const json& s : Metrics("start")) {
    if (s["restart_count"] == at3 && s["rank"] == 1) victim = s["pid"].get<pid_t>();
  }
  ASSERT_GT(victim, 0) << Diagnostics();
  ASSERT_NE(Slurp("/proc/" + std::to_string(victim) + "/cmdline").find("train_ddp.py"),
            std::string::npos)
      << "pid " << victim << " is not a trainer any more (finished already?)" << Diagnostics();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  // The job finishes by itself: the server and both clients exit 0 (--exit_when_done).
  ASSERT_EQ(server_->Wait(kPhase), 0) << Diagnostics();
  for (auto& c : clients_) EXPECT_EQ(c->Wait(milliseconds(60000)), 0) << Diagnostics();
  ExpectFinishedWithFallingLoss();

  // The server saw the shrink, the grow and the failure (then the grow-back).
  int failures = 0;
  std::set<int> worlds;
  for (const json& g : Generations()) {
    failures += g.value("failure", false);
    worlds.insert(g.value("world_size_after", 0));
  }
  EXPECT_GE(failures, 1) << Diagnostics();
  std::cout << "generations (world size, reason):";
  for (const json& g : Generations()) {
    std::cout << " g" << g["generation"] << " " << g["world_size_after"] << " " << g["reason"];
  }
  std::cout << "\nstarts (restart count: world size, resumed at step):";
  for (const json& s : Metrics("start")) {
    if (s["rank"] == 0)
      std::cout << " " << s["restart_count"] << ": " << s["world_size"] << ", " << s["step"] << ";";
  }
  std::cout << std::endl;
  for (int w : {4, 2, 3}) EXPECT_EQ(worlds.count(w), 1u) << "world " << w;

  // Every start saw torchrun's variables consistent with its generation.
  std::map<int, std::set<int>> ranks;  // restart count -> ranks started
  for (const json& s : Metrics("start")) {
    EXPECT_EQ(s["run_id"], "ptjob");
    EXPECT_LT(s["rank"].get<int>(), s["world_size"].get<int>());
    ranks[s["restart_count"].get<int>()].insert(s["rank"].get<int>());
  }
  EXPECT_GE(ranks.size(), 4u) << "starts: 4, 2, 3, after the kill";
  // Each change came after a checkpoint of the start before it: every later start resumed from
  // a later step (the trainer's own checkpoint, broadcast by rank 0), none from scratch.
  std::map<int, int> resumed;  // restart count -> step
  for (const json& s : Metrics("start")) {
    if (s["rank"] == 0) resumed[s["restart_count"].get<int>()] = s["step"].get<int>();
  }
  ASSERT_TRUE(resumed.count(0) && resumed.count(at2) && resumed.count(at3)) << Diagnostics();
  EXPECT_EQ(resumed[0], 0);
  EXPECT_GT(resumed[at2], resumed[0]) << "the shrink's start did not resume from a checkpoint";
  EXPECT_GT(resumed[at3], resumed[at2]) << "the grow's start did not resume from a checkpoint";
  int last = 0;
  for (const auto& [rc, step] : resumed) {
    EXPECT_GE(step, last) << "restart " << rc << " went back before an earlier start's step";
    if (rc > at3) {
      EXPECT_GT(step, resumed[at3]) << "restart " << rc << " after the SIGKILL";
    }
    last = std::max(last, step);
  }
  EXPECT_EQ(ranks.begin()->first, 0) << "the first start is restart 0";
}

// The same script as a local job under `edl launch`, with torchrun's flags, and under torchrun.
TEST_F(PyTorchTest, RunsUnderEdlLaunchAndTorchrun) {
  std::vector<std::string> argv = {test::EdlBinary(),
                                   "launch",
                                   "--nnodes",
                                   "1:1",
                                   "--nproc_per_node",
                                   "2",
                                   "--rdzv_id",
                                   "launched",
                                   "--max_restarts",
                                   "1",
                                   "--log_dir",
                                   dir_.Join("launch-logs"),
                                   "--"};
  for (const std::string& a : Trainer()) argv.push_back(a);
  Proc launch(argv, dir_.Join("launch.log"));
  ASSERT_EQ(launch.Wait(kPhase), 0)
      << Slurp(dir_.Join("launch.log")) << Slurp(dir_.Join("launch-logs/trainer-0.log"), 3000);
  ExpectFinishedWithFallingLoss();
  for (const json& s : Metrics("start")) {
    EXPECT_EQ(s["run_id"], "launched");
    EXPECT_EQ(s["world_size"], 2);
  }

  // torchrun itself (Debian's /usr/bin/torchrun) resumes the finished run: it reads the checkpoint
  // at the last step, trains nothing and writes "done" again.
  if (!std::filesystem::exists("/usr/bin/torchrun")) {
    std::cout << "no /usr/bin/torchrun: the torchrun half is not run" << std::endl;
    return;
  }
  std::filesystem::remove(dir_.Join("metrics.jsonl"));
  const std::vector<std::string> trainer = Trainer();
  // --redirects/--tee 1: Debian's torchrun 1.13 under Python 3.11 cannot parse their default "0"
  // (Std.from_str iterates an IntFlag, which no longer yields the zero member) and fails at start.
  std::vector<std::string> tr = {"/usr/bin/torchrun",
                                 "--standalone",
                                 "--nproc_per_node",
                                 "2",
                                 "--redirects",
                                 "1",
                                 "--tee",
                                 "1",
                                 "--log_dir",
                                 dir_.Join("torchrun-logs")};
  tr.insert(tr.end(), trainer.begin() + 1, trainer.end());  // the script and its flags
  ASSERT_EQ(itest::RunCommand(tr, dir_.Join("torchrun.log"), kPhase), 0)
      << Slurp(dir_.Join("torchrun.log"), 4000);
  const std::vector<json> done = Metrics("done");
  ASSERT_EQ(done.size(), 1u) << Slurp(dir_.Join("torchrun.log"), 4000);
  EXPECT_EQ(done[0]["step"], kSteps);
  for (const json& s : Metrics("start")) EXPECT_EQ(s["step"], kSteps) << "resumed at the end";
}

}  // namespace
}  // namespace edl
