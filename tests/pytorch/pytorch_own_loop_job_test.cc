// examples/pytorch/resnet20_elastic.py (edl.torch.Elastic: the script's own loop over the C++
// runtime; Debian's python3-torch, CPU, Gloo, a DataLoader with a worker process) under a real
// `edl server` and two in-place `edl client`s (tests/pytorch/inplace_job_fixture.h): through a
// shrink, a grow, a SIGKILL and a kill of every trainer with every epoch exactly once and one
// state per generation; and trainers whose step goes wrong on one rank
// (tests/pytorch/own_loop_faults.py: a NaN loss, a hook that raises, a batch of another size),
// each ending alone with an error naming its rank, cause and fix while the job goes on. Skipped,
// with the reason printed, where python3-torch, the data set or the edl Python module is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/pytorch/inplace_job_fixture.h"

namespace edl {
namespace {

using itest::Slurp;
using itest::WaitFor;
using pytorch_test::Example;
using pytorch_test::kPhase;
using pytorch_test::Python;

using PyTorchOwnLoopJobTest = pytorch_test::PyTorchInPlaceJobTest;

// resnet20_elastic.py's flags for these jobs: 256 samples, 8 per trainer and step, one
// DataLoader worker, no end of its own; the sample log through the environment.
std::vector<std::string> OwnLoopFlags(const test::ScratchDir& dir) {
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
          "--workers",
          "1",
          "--checkpoint_dir",
          dir.Join("ckpt")};
}
std::map<std::string, std::string> OwnLoopEnv(const test::ScratchDir& dir) {
  return {{"EDL_SAMPLE_LOG", dir.Join("samples.jsonl")}};
}

TEST_F(PyTorchOwnLoopJobTest, ShrinkGrowKillAndColdStartKeepStateAndData) {
  ShrinkGrowKillAndColdStart({Python(), Example("resnet20_elastic.py")}, OwnLoopFlags(dir_),
                             OwnLoopEnv(dir_));
}

TEST_F(PyTorchOwnLoopJobTest, ABadStepOnOneRankEndsThatTrainerAloneAndTheJobGoesOn) {
  const std::string faults = dir_.Join("faults");
  std::filesystem::create_directories(faults);
  StartServer(3);
  StartClients({Python(), test::SourceDir() + "/tests/pytorch/own_loop_faults.py", faults},
               OwnLoopFlags(dir_), /*spares=*/0, OwnLoopEnv(dir_));
  int64_t formed = WaitForFormedGeneration(3, 0);
  ASSERT_GT(formed, 0) << Diagnostics();
  ASSERT_TRUE(WaitForMoreSteps(5)) << Diagnostics();
  const std::vector<std::pair<std::string, std::vector<std::string>>> faults_and_errors = {
      {"nan_loss",
       {"a loss of nan on this trainer's samples (before the all-reduce",
        "this trainer leaves the job, which goes on without it", "GradScaler"}},
      {"hook_raises",
       {"a before_update hook raised ValueError during job.step(): injected fault",
        "ValueError: injected fault in a before_update hook"}},
      {"short_batch",
       {"samples, but the runtime gave this trainer",
        "Make collate_fn return one sample per index"}},
  };
  for (const auto& [fault, errors] : faults_and_errors) {
    // Rank 1 of the generation trains on: it takes the fault at its next step.
    std::string victim;
    int rank = -1;
    for (const auto& [id, m] : MembersOf(formed)) {
      if (m.first == 1) {
        victim = id;
        rank = m.first;
      }
    }
    ASSERT_FALSE(victim.empty()) << Diagnostics();
    std::ofstream(faults + "/" + fault) << victim;
    EXPECT_EQ(WaitForExit(victim), "exit 1") << fault << Diagnostics();
    const std::string log = Slurp(dir_.Join("logs/" + victim + ".log"));
    const std::string where = "edl.TrainingError: rank " + std::to_string(rank) +
                              " of 3 (trainer " + victim + ", generation " +
                              std::to_string(formed) + "), step ";
    EXPECT_NE(log.find(where), std::string::npos) << where << "\n" << log;
    for (const std::string& e : errors)
      EXPECT_NE(log.find(e), std::string::npos) << fault << ": " << e << "\n" << log;
    if (fault == "short_batch") {
      // One sample short of its indices: 8 in a full step, fewer in an epoch's last step.
      std::smatch m;
      ASSERT_TRUE(std::regex_search(log, m,
                                    std::regex("the batch has ([0-9]+) samples, but the runtime "
                                               "gave this trainer ([0-9]+) indices")))
          << log;
      EXPECT_EQ(std::stoi(m[1]) + 1, std::stoi(m[2])) << m[0];
    }
    // The job re-forms without it, a new trainer takes its place, and training goes on.
    formed = WaitForFormedGeneration(3, formed);
    ASSERT_GT(formed, 0) << Diagnostics();
    ASSERT_EQ(MembersOf(formed).count(victim), 0u);
    ASSERT_TRUE(WaitForMoreSteps(3)) << Diagnostics();
  }
  StopJob();
  if (HasFatalFailure()) return;
  ExpectIdenticalStateAfterEveryReform();
  ExpectExactlyOnce(3);  // unconfirmed: the failing trainers' last steps
  EXPECT_EQ(itest::RunCommand(
                {test::EdlBinary(), "ckpt", "verify", "--checkpoint_dir", dir_.Join("ckpt")},
                dir_.Join("verify.log"), kPhase),
            0)
      << Slurp(dir_.Join("verify.log"));
}

}  // namespace
}  // namespace edl
