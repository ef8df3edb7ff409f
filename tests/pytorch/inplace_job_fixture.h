// The fixture of the tests that run an edl.torch script under a real `edl server` and two in-place
// `edl client`s (2 CPU slots each; Debian's python3-torch, Gloo): pytorch_inplace_job_test
// (ElasticTrainer, examples/pytorch/train_inplace.py) and pytorch_own_loop_job_test (the own-loop
// API, examples/pytorch/resnet20_elastic.py). Assertions read the server's events log
// (generations; the trainers' sync events with their state hash and pid; stall, cold_start), the
// runtime's sample log and the checkpoint store. Every change is made once the previous one has
// been seen (a formed generation, N more committed steps), so nothing depends on the machine's
// speed. Needs EDL_HAVE_PYTHON_MODULE (0 or 1) defined.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "edl/ckpt/checkpoint_store.h"
#include "resnet50/data/dataset.h"
#include "tests/edl/runtime/sample_log_check.h"
#include "tests/edl/runtime/stall_check.h"
#include "tests/integration/process_util.h"
#include "tests/pytorch/inplace_fixture.h"
#include "tests/testutil.h"

namespace edl::pytorch_test {

using itest::Proc;
using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr int64_t kSamples = 256;
// Steps the shrink-grow-kill job trains before it is stopped, so that its loss check sees the
// same amount of training on any machine.
constexpr int64_t kLossSteps = 150;

class PyTorchInPlaceJobTest : public PyTorchInPlaceTest {
 protected:
  void StartServer(int trainers) {
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "pytorch-inplace-secret-0123456789");
    server_ = std::make_unique<Proc>(
        std::vector<std::string>{test::EdlBinary(),  "server",
                                 "--server_port",    "0",
                                 "--bind",           "127.0.0.1",
                                 "--port_file",      dir_.Join("port"),
                                 "--secret_file",    secret_,
                                 "--job_id",         "pyjob",
                                 "--min_trainers",   "1",
                                 "--trainers",       std::to_string(trainers),
                                 "--events_dir",     dir_.Join("events"),
                                 "--join_timeout_s", "120",
                                 "--backoff_min_s",  "1",
                                 "--backoff_max_s",  "1"},
        dir_.Join("server.log"));
    port_ = itest::WaitForPortFile(dir_.Join("port"), server_.get());
    ASSERT_FALSE(port_.empty()) << Slurp(dir_.Join("server.log"));
  }

  // Two clients of 2 CPU slots whose trainers run `trainer` (a Python command line) followed by
  // `flags`, with `env` added to the Python environment. `spares`: the clients' --spares (warm
  // spares run the script's model building ahead, with the spare's identity: a test that arms a
  // fault for "the next trainer to build its model" has none).
  void StartClients(const std::vector<std::string>& trainer, const std::vector<std::string>& flags,
                    int spares = 1, const std::map<std::string, std::string>& env = {}) {
    std::map<std::string, std::string> penv = PythonEnv();
    penv.insert(env.begin(), env.end());
    for (const char* node : {"n1", "n2"}) {
      std::vector<std::string> argv = {test::EdlBinary(),
                                       "client",
                                       "--server",
                                       "127.0.0.1:" + port_,
                                       "--secret_file",
                                       secret_,
                                       "--node_name",
                                       node,
                                       "--slots",
                                       "2",
                                       "--mode",
                                       "inplace",
                                       "--socket_path",
                                       dir_.Join(std::string(node) + ".sock"),
                                       "--log_dir",
                                       dir_.Join("logs"),
                                       "--leave_grace_s",
                                       "60",
                                       "--stop_grace_s",
                                       "5",
                                       "--trainer_timeout_s",
                                       "60",
                                       "--exit_when_done",
                                       "--spares",
                                       std::to_string(spares),
                                       "--"};
      argv.insert(argv.end(), trainer.begin(), trainer.end());
      argv.insert(argv.end(), flags.begin(), flags.end());
      clients_.push_back(std::make_unique<Proc>(argv, dir_.Join(std::string(node) + ".log"), penv));
    }
  }

  std::vector<json> Events() { return ReadLines(dir_.Join("events/pyjob.events.jsonl")); }
  std::vector<json> EventsOfType(const std::string& type) {
    std::vector<json> out;
    for (const json& e : Events()) {
      if (e.value("type", "") == type) out.push_back(e);
    }
    return out;
  }
  std::vector<json> TrainerEvents(const std::string& name) {
    std::vector<json> out;
    for (const json& e : EventsOfType("trainer_event")) {
      if (e.value("event", "") == name) out.push_back(e);
    }
    return out;
  }
  // The job ended: trained to its end, or stopped by `edl ctl stop`.
  bool Finished() {
    return !EventsOfType("finished").empty() || !EventsOfType("stop_complete").empty();
  }

  int64_t MaxStep() {
    int64_t max = 0;
    for (const json& l : ReadLines(dir_.Join("samples.jsonl")))
      max = std::max(max, l.value("step", int64_t{0}));
    return max;
  }
  bool WaitForMoreSteps(int64_t n) {
    const int64_t from = MaxStep();
    return WaitFor([&] { return MaxStep() >= from + n; }, kPhase);
  }
  // A generation of `world` newer than `after` in which every member synced; its number (0: none
  // within the bound).
  int64_t WaitForFormedGeneration(int world, int64_t after) {
    int64_t formed = 0;
    WaitFor(
        [&] {
          const std::vector<json> syncs = TrainerEvents("sync");
          for (const json& g : EventsOfType("generation")) {
            const int64_t n = g["generation"].get<int64_t>();
            if (n <= after || g["world_size_after"] != world) continue;
            int synced = 0;
            for (const json& e : syncs) synced += e["generation"] == n;
            if (synced >= world) formed = n;
          }
          return formed > 0;
        },
        kPhase);
    return formed;
  }
  // The members of generation n that synced: trainer id -> {rank, pid}.
  std::map<std::string, std::pair<int, pid_t>> MembersOf(int64_t n) {
    std::map<std::string, std::pair<int, pid_t>> out;
    for (const json& e : TrainerEvents("sync")) {
      if (e["generation"] == n) {
        out[e["trainer"].get<std::string>()] = {e["rank"].get<int>(),
                                                static_cast<pid_t>(e["pid"].get<int64_t>())};
      }
    }
    return out;
  }
  // Waits for `trainer` to exit (a trainer_exit or joiner_exit record); its "how" ("" on timeout).
  std::string WaitForExit(const std::string& trainer) {
    std::string how;
    WaitFor(
        [&] {
          for (const json& e : Events()) {
            const std::string type = e.value("type", "");
            if ((type == "trainer_exit" || type == "joiner_exit") && e["trainer_id"] == trainer) {
              how = e.value("how", "?");
            }
          }
          return !how.empty();
        },
        kPhase);
    return how;
  }
  int Ctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {test::EdlBinary(),    "ctl",           "--server",
                                     "127.0.0.1:" + port_, "--secret_file", secret_};
    argv.insert(argv.end(), args.begin(), args.end());
    return itest::RunCommand(argv, dir_.Join("ctl.log"), milliseconds(60000));
  }
  // `edl ctl stop`, then the server and the clients exit by themselves.
  void StopJob() {
    ASSERT_EQ(Ctl({"stop"}), 0) << Slurp(dir_.Join("ctl.log"));
    ASSERT_TRUE(WaitFor([&] { return Finished(); }, kPhase)) << Diagnostics();
    EXPECT_EQ(server_->Wait(kPhase), 0) << Diagnostics();
    for (auto& c : clients_) EXPECT_EQ(c->Wait(kPhase), 0) << Diagnostics();
  }
  std::vector<ckpt::CheckpointMeta> Checkpoints() {
    ckpt::RocksDbStoreOptions so;
    so.dir = dir_.Join("ckpt");
    std::vector<ckpt::CheckpointMeta> all;
    const Status s = ckpt::OpenRocksDbStore(so)->List(&all);
    EXPECT_TRUE(s.ok() || s.IsNotFound()) << s.ToString();  // none yet: polled until one is
    return all;
  }

  // Every generation's members synced one state hash.
  void ExpectIdenticalStateAfterEveryReform() {
    std::map<int64_t, std::set<std::string>> hashes;
    for (const json& e : TrainerEvents("sync")) {
      hashes[e["generation"].get<int64_t>()].insert(e["state_hash"].get<std::string>());
    }
    ASSERT_FALSE(hashes.empty());
    for (const auto& [gen, h] : hashes)
      EXPECT_EQ(h.size(), 1u) << "generation " << gen << " differs";
  }
  // Samples: every complete epoch exactly once, every rank fed its planned samples' labels.
  std::map<int64_t, test::LoggedStep> ExpectExactlyOnce(int64_t max_unconfirmed) {
    std::map<int64_t, test::LoggedStep> steps;
    EXPECT_EQ(test::ReadSampleLogs({dir_.Join("samples.jsonl")}, &steps), "");
    if (steps.empty()) {
      ADD_FAILURE() << "no steps logged";
      return steps;
    }
    const int64_t complete = steps.rbegin()->second.epoch;  // the last one may be partial
    EXPECT_GE(complete, 3);
    EXPECT_EQ(test::CheckExactlyOnce(steps, kSamples, complete), "") << Diagnostics();
    std::vector<uint8_t> labels;
    EXPECT_OK(
        resnet50::ReadIdxLabels(std::string(kFashionDir) + "/train-labels-idx1-ubyte.gz", &labels));
    int64_t unconfirmed = 0;
    EXPECT_EQ(
        test::CheckFedBatches(
            steps, [&](int64_t i) { return static_cast<int32_t>(labels.at(i)); }, &unconfirmed),
        "");
    EXPECT_LE(unconfirmed, max_unconfirmed) << "of " << steps.size() << " steps";
    return steps;
  }

  // A job of 4 trainers running `trainer` `flags` (env added) through a shrink to 2, a grow to 3,
  // a SIGKILL of its last rank (the survivors re-form, then it grows back) and a SIGKILL of every
  // trainer (the restart cold-starts from the checkpoint store), then trained to kLossSteps and
  // stopped: no survivor's pid changes, every generation's members sync one state hash, every
  // complete epoch's samples are consumed exactly once and each rank fed the labels of its
  // planned samples, the survivors report a stall of each kind, the loss falls, and the final
  // checkpoint is the last committed step.
  void ShrinkGrowKillAndColdStart(const std::vector<std::string>& trainer,
                                  const std::vector<std::string>& flags,
                                  const std::map<std::string, std::string>& env = {}) {
    StartServer(4);
    StartClients(trainer, flags, /*spares=*/1, env);
    const int64_t g4 = WaitForFormedGeneration(4, 0);
    ASSERT_GT(g4, 0) << Diagnostics();
    ASSERT_TRUE(WaitForMoreSteps(10)) << Diagnostics();
    ASSERT_EQ(Ctl({"scale", "2"}), 0) << Slurp(dir_.Join("ctl.log"));
    const int64_t g2 = WaitForFormedGeneration(2, g4);
    ASSERT_GT(g2, 0) << Diagnostics();
    ASSERT_TRUE(WaitForMoreSteps(10)) << Diagnostics();
    ASSERT_EQ(Ctl({"scale", "3"}), 0) << Slurp(dir_.Join("ctl.log"));
    const int64_t g3 = WaitForFormedGeneration(3, g2);
    ASSERT_GT(g3, 0) << Diagnostics();
    ASSERT_TRUE(WaitForMoreSteps(10)) << Diagnostics();
    // SIGKILL the last rank; the survivors re-form in place, then the job grows back to 3.
    std::map<std::string, std::pair<int, pid_t>> members = MembersOf(g3);
    ASSERT_EQ(members.size(), 3u);
    pid_t victim = 0;
    for (const auto& [id, m] : members) {
      if (m.first == 2) victim = m.second;
    }
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    const int64_t back = WaitForFormedGeneration(3, g3);
    ASSERT_GT(back, 0) << Diagnostics();
    ASSERT_TRUE(WaitForMoreSteps(10)) << Diagnostics();

    // Kill every trainer at once: nobody holds state, so the next generation's rank 0 loads the
    // newest checkpoint from the store and broadcasts it (once there is one).
    ASSERT_TRUE(WaitFor([&] { return !Checkpoints().empty(); }, kPhase)) << Diagnostics();
    const int64_t saved_before = [&] {
      int64_t s = 0;
      for (const auto& m : Checkpoints()) s = std::max(s, m.step);
      return s;
    }();
    ASSERT_GT(saved_before, 0) << "no checkpoint before the kill" << Diagnostics();
    for (const auto& [id, m] : MembersOf(back)) ::kill(m.second, SIGKILL);
    ASSERT_TRUE(WaitFor([&] { return !TrainerEvents("cold_start").empty(); }, kPhase))
        << Diagnostics();
    const int64_t cold_gen = WaitForFormedGeneration(3, back);
    ASSERT_GT(cold_gen, 0) << Diagnostics();
    ASSERT_TRUE(WaitForMoreSteps(5)) << Diagnostics();
    // The loss check below compares the first and last 10 steps: it needs the same number of steps
    // whatever the machine's speed made of the phases above (78 to 96 steps on 2 busy cores).
    ASSERT_TRUE(WaitFor([&] { return MaxStep() >= kLossSteps; }, kPhase)) << Diagnostics();
    StopJob();
    if (HasFatalFailure()) return;

    const std::vector<json> cold = TrainerEvents("cold_start");
    ASSERT_EQ(cold.size(), 1u) << "only the start after the kill finds a checkpoint"
                               << Diagnostics();
    // The newest checkpoint when the trainers were killed (they may have saved once more after
    // saved_before was read).
    EXPECT_GE(cold[0]["step"].get<int64_t>(), saved_before);
    for (const json& e : TrainerEvents("sync")) {
      if (e["generation"] == cold[0]["generation"]) {
        EXPECT_EQ(e["step"], cold[0]["step"]);
      }
    }

    // In place: each trainer id wrote every event from one pid (none was restarted).
    std::map<std::string, std::set<int64_t>> pids;
    for (const json& e : EventsOfType("trainer_event"))
      pids[e["trainer"]].insert(e["pid"].get<int64_t>());
    for (const auto& [id, p] : pids) EXPECT_EQ(p.size(), 1u) << id << " changed pid";
    EXPECT_GE(pids.size(), 8u) << "4 + a joiner + the grow-back + 3 after the kill";
    ExpectIdenticalStateAfterEveryReform();

    // Survivors reported a stall for the shrink, the grow and the failure, each well-formed.
    std::set<std::string> kinds;
    for (const json& e : TrainerEvents("stall")) {
      EXPECT_EQ(test::CheckStallBreakdown(e), "");
      kinds.insert(e["failure"].get<bool>()               ? "failure"
                   : e["world_after"] < e["world_before"] ? "shrink"
                                                          : "grow");
    }
    EXPECT_EQ(kinds.size(), 3u) << Diagnostics();

    // Exactly-once over the steps as committed (a step re-done after the kill replaces the lost
    // one); unconfirmed: the SIGKILLed trainers' last steps.
    const std::map<int64_t, test::LoggedStep> steps = ExpectExactlyOnce(4);
    std::vector<double> losses;
    for (const auto& [step, s] : steps) {
      if (s.has_loss) losses.push_back(s.loss);
    }
    ASSERT_GT(losses.size(), 30u);
    double first = 0, last = 0;
    for (int i = 0; i < 10; ++i) {
      first += losses[i] / 10;
      last += losses[losses.size() - 1 - i] / 10;
    }
    std::cout << "loss: first 10 steps " << first << ", last 10 " << last << "; " << steps.size()
              << " steps, cold start at step " << cold[0]["step"] << std::endl;
    EXPECT_LT(last, 0.7 * first) << "the loss did not fall";
    // The stop's final checkpoint is the last committed step.
    int64_t newest = 0;
    for (const auto& m : Checkpoints()) newest = std::max(newest, m.step);
    EXPECT_EQ(newest, steps.rbegin()->first);
  }

  std::string Diagnostics() {
    std::string logs;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir_.Join("logs"), ec)) {
      logs += "\n--- " + f.path().filename().string() + "\n" + Slurp(f.path().string(), 3000);
    }
    return "\n--- events\n" + Slurp(dir_.Join("events/pyjob.events.jsonl"), 20000) +
           "\n--- server\n" + Slurp(dir_.Join("server.log"), 4000) + logs;
  }

  void TearDown() override {
    for (auto& c : clients_) c->Stop();
    if (server_) server_->Stop();
  }

  std::string secret_, port_;
  std::unique_ptr<Proc> server_;
  std::vector<std::unique_ptr<Proc>> clients_;
};

}  // namespace edl::pytorch_test
