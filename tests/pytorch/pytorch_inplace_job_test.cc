// examples/pytorch/train_inplace.py (edl.torch's ElasticTrainer over the C++ runtime; Debian's
// python3-torch, CPU, Gloo) under a real `edl server` and two in-place `edl client`s
// (tests/pytorch/inplace_job_fixture.h): through a shrink, a grow, a SIGKILL and a kill of every
// trainer, and with trainers that fail on bad input (tests/pytorch/inplace_faults.py). Skipped,
// with the reason printed, where python3-torch, the data set or the edl Python module is missing.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/pytorch/inplace_job_fixture.h"

namespace edl {
namespace {

using itest::ReadLines;
using itest::Slurp;
using itest::WaitFor;
using nlohmann::json;
using pytorch_test::Example;
using pytorch_test::kLossSteps;
using pytorch_test::kPhase;
using pytorch_test::kSamples;
using pytorch_test::Python;
using pytorch_test::PyTorchInPlaceJobTest;

// train_inplace.py's flags for these jobs: 256 samples, 8 per trainer and step, checkpoints every
// 5 steps, no end of its own.
std::vector<std::string> InPlaceFlags(const test::ScratchDir& dir) {
  return {"--train_samples",
          "256",
          "--batch_size",
          "8",
          "--epochs",
          "1000",
          "--lr",
          "0.05",
          "--lr_decay",
          "constant",
          "--threads",
          "1",
          "--test_samples",
          "0",
          "--log_every",
          "10",
          "--checkpoint_steps",
          "5",
          "--checkpoint_dir",
          dir.Join("ckpt"),
          "--sample_log",
          dir.Join("samples.jsonl")};
}

TEST_F(PyTorchInPlaceJobTest, ShrinkGrowKillAndColdStartKeepStateAndData) {
  ShrinkGrowKillAndColdStart({Python(), Example("train_inplace.py")}, InPlaceFlags(dir_));
}

// A Python exception inside forward, a model of another shape, an optimizer whose state does not
// fit: each trainer fails alone with one clear error naming the cause and a non-zero exit, the job
// re-forms without it and goes on, and the store holds no step the failing trainer left unfinished.
TEST_F(PyTorchInPlaceJobTest, BadTrainersFailAloneAndTheJobGoesOn) {
  const std::string faults = dir_.Join("faults");
  std::filesystem::create_directories(faults);
  StartServer(3);
  StartClients({Python(), test::SourceDir() + "/tests/pytorch/inplace_faults.py", faults},
               InPlaceFlags(dir_), /*spares=*/0);
  const int64_t g1 = WaitForFormedGeneration(3, 0);
  ASSERT_GT(g1, 0) << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(8)) << Diagnostics();

  // 1. Rank 0 (the checkpoint writer) raises in forward, after its BatchNorm statistics moved.
  std::string rank0;
  for (const auto& [id, m] : MembersOf(g1)) {
    if (m.first == 0) rank0 = id;
  }
  std::ofstream(faults + "/raise_in_forward") << rank0;
  EXPECT_EQ(WaitForExit(rank0), "exit 1") << "an uncaught Python exception" << Diagnostics();
  const int64_t after_raise = WaitForFormedGeneration(3, g1);
  ASSERT_GT(after_raise, 0) << Diagnostics();
  std::string log = Slurp(dir_.Join("logs/" + rank0 + ".log"));
  EXPECT_NE(log.find("ValueError: injected fault in forward"), std::string::npos) << log;
  EXPECT_NE(log.find("edl.TrainingError: Aborted: forward_backward() raised ValueError: injected"),
            std::string::npos)
      << log;
  // Nothing of the step it left unfinished reached the store: its generation's checkpoints are of
  // steps that generation committed.
  int64_t committed_in_g1 = 0;
  for (const json& l : ReadLines(dir_.Join("samples.jsonl"))) {
    if (l["generation"] == g1)
      committed_in_g1 = std::max(committed_in_g1, l["step"].get<int64_t>());
  }
  for (const auto& m : Checkpoints()) {
    if (m.generation == g1) {
      EXPECT_LE(m.step, committed_in_g1) << "checkpoint " << m.id;
    }
  }
  ASSERT_TRUE(WaitForMoreSteps(5)) << Diagnostics();

  // 2. and 3.: a joiner with another model, then one with another optimizer.
  int64_t formed = after_raise;
  for (const std::string fault : {"other_model", "adam"}) {
    std::ofstream(faults + "/" + fault).flush();
    ASSERT_EQ(Ctl({"scale", "4"}), 0) << Slurp(dir_.Join("ctl.log"));
    std::string bad;
    ASSERT_TRUE(WaitFor(
        [&] {
          for (const auto& f : std::filesystem::directory_iterator(faults)) {
            const std::string name = f.path().filename().string();
            if (name.rfind(fault + ".taken.", 0) == 0) bad = name.substr(fault.size() + 7);
          }
          return !bad.empty();
        },
        kPhase))
        << Diagnostics();
    EXPECT_EQ(WaitForExit(bad), "exit 1") << Diagnostics();
    log = Slurp(dir_.Join("logs/" + bad + ".log"));
    EXPECT_NE(log.find("edl.TrainingError: FailedPrecondition: this trainer's model or optimizer "
                       "differs from the job's"),
              std::string::npos)
        << log;
    // Both fingerprints, which show what differs: the fc layer's 11 classes (65 values more), or
    // Adam's state against SGD's.
    const std::vector<std::string> named =
        fault == "adam"
            ? std::vector<
                  std::string>{"this trainer has 'model FaultyResNet20 [128 tensors, 273775 values",
                               "optimizer Adam [state exp_avg,exp_avg_sq,step, 195 tensors",
                               "the job has 'model FaultyResNet20 [128 tensors, 273775 values",
                               "optimizer SGD [state momentum_buffer, 65 tensors"}
            : std::vector<std::string>{
                  "this trainer has 'model FaultyResNet20 [128 tensors, 273840 values",
                  "the job has 'model FaultyResNet20 [128 tensors, 273775 values"};
    for (const std::string& n : named)
      EXPECT_NE(log.find(n), std::string::npos) << n << "\n" << log;
    // The job re-forms without it, then grows back to 4 with a good joiner, and shrinks to 3.
    formed = WaitForFormedGeneration(4, formed);
    ASSERT_GT(formed, 0) << Diagnostics();
    ASSERT_EQ(MembersOf(formed).count(bad), 0u);
    ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
    ASSERT_EQ(Ctl({"scale", "3"}), 0) << Slurp(dir_.Join("ctl.log"));
    formed = WaitForFormedGeneration(3, formed);
    ASSERT_GT(formed, 0) << Diagnostics();
  }
  ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
  StopJob();
  if (HasFatalFailure()) return;
  ExpectIdenticalStateAfterEveryReform();
  ExpectExactlyOnce(3);  // unconfirmed: the raising trainer's step
  std::string out;
  EXPECT_EQ(itest::RunCommand(
                {test::EdlBinary(), "ckpt", "verify", "--checkpoint_dir", dir_.Join("ckpt")},
                dir_.Join("verify.log"), kPhase),
            0)
      << Slurp(dir_.Join("verify.log"));
}

}  // namespace
}  // namespace edl
