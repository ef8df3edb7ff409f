// edl.torch.Elastic, the own-loop API over the C++ runtime (Debian's python3-torch, CPU, Gloo), as
// real processes without a server: examples/pytorch/resnet20_elastic.py against its plain original
// (the lines a script changes) and against plain DDP (the same parameters from the same seed and
// data order), the transformer example, and tests/pytorch/own_loop_cases.py's jobs: what the API
// carries (several models and optimizers, dict batches, DataLoader workers, accumulation, a
// scaler, schedulers), and the mistakes it names. pytorch_own_loop_job_test runs it under a server.
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/pytorch/inplace_fixture.h"

namespace edl {
namespace {

using itest::Slurp;
using nlohmann::json;
using pytorch_test::Example;
using pytorch_test::Python;
using pytorch_test::PyTorchInPlaceTest;

std::string Cases() { return test::SourceDir() + "/tests/pytorch/own_loop_cases.py"; }

// The "RESULT {json}" lines of `out`, in order.
std::vector<json> Results(const std::string& out) {
  std::vector<json> r;
  size_t at = 0;
  while ((at = out.find("RESULT {", at)) != std::string::npos) {
    const size_t end = out.find('\n', at);
    r.push_back(json::parse(out.substr(at + 7, end - at - 7)));
    at = end;
  }
  return r;
}

using PyTorchOwnLoopTest = PyTorchInPlaceTest;

TEST_F(PyTorchOwnLoopTest, TheElasticScriptChangesAtMostTenLinesOfThePlainOne) {
  std::string out;
  ASSERT_EQ(Run({Python(), test::SourceDir() + "/tests/pytorch/changed_lines.py",
                 Example("resnet20_plain.py"), Example("resnet20_elastic.py")},
                "diff", &out),
            0)
      << out;
  std::cout << out;
  const size_t at = out.find("changed lines of code: ");
  ASSERT_NE(at, std::string::npos) << out;
  const int changed = std::stoi(out.substr(at + 23));
  EXPECT_GT(changed, 0);
  EXPECT_LE(changed, 10) << out;
}

TEST_F(PyTorchOwnLoopTest, RunsAloneAtWorldSizeOneAndSaysSo) {
  std::string out;
  ASSERT_EQ(Run({Python(), Example("resnet20_elastic.py"), "--train_samples", "128", "--batch_size",
                 "16", "--epochs", "0.5", "--threads", "1", "--workers", "1"},
                "alone", &out),
            0)
      << out;
  EXPECT_NE(out.find("standalone mode: no launcher, so world size 1"), std::string::npos) << out;
  EXPECT_NE(out.find("finished at step 4, generation 1, world 1"), std::string::npos) << out;
}

// The parity check: the same seed, model, data order (train_ddp.py trains the global batches the
// own-loop run's sample log lists) and hyper-parameters, 2 ranks each under `edl launch`: the
// parameters and BatchNorm statistics after 12 steps agree within 1e-4 relative.
TEST_F(PyTorchOwnLoopTest, MatchesPlainDdpFromTheSameSeed) {
  const std::vector<std::string> common = {"--train_samples", "512",      "--lr",      "0.05",
                                           "--lr_decay",      "constant", "--threads", "1",
                                           "--seed",          "7"};
  std::vector<std::string> own = {test::EdlBinary(),
                                  "launch",
                                  "-n",
                                  "2",
                                  "--log_dir",
                                  dir_.Join("own-logs"),
                                  "--",
                                  Python(),
                                  Example("resnet20_elastic.py"),
                                  "--batch_size",
                                  "16",
                                  "--epochs",
                                  "0.75",  // 12 steps of 2 x 16 out of 512
                                  "--save_model",
                                  dir_.Join("own.pt")};
  own.insert(own.end(), common.begin(), common.end());
  std::string out;
  {
    itest::Proc p(own, dir_.Join("own.log"),
                  {{"PYTHONPATH", test::BuildDir() + "/python"},
                   {"PYTHONUNBUFFERED", "1"},
                   {"EDL_SAMPLE_LOG", dir_.Join("samples.jsonl")}});
    const int rc = p.Wait(pytorch_test::kPhase);
    if (rc < 0) p.Stop();
    ASSERT_EQ(rc, 0) << Slurp(dir_.Join("own.log")) << Slurp(dir_.Join("own-logs/trainer-0.log"));
  }
  EXPECT_NE(Slurp(dir_.Join("own-logs/trainer-0.log")).find("finished at step 12"),
            std::string::npos);
  std::vector<std::string> ddp = {test::EdlBinary(),
                                  "launch",
                                  "-n",
                                  "2",
                                  "--log_dir",
                                  dir_.Join("ddp-logs"),
                                  "--",
                                  Python(),
                                  Example("train_ddp.py"),
                                  "--batch_size",
                                  "32",
                                  "--steps",
                                  "12",
                                  "--test_samples",
                                  "0",
                                  "--sample_order",
                                  dir_.Join("samples.jsonl"),
                                  "--checkpoint_dir",
                                  dir_.Join("ddp")};
  ddp.insert(ddp.end(), common.begin(), common.end());
  ASSERT_EQ(Run(ddp, "ddp", &out), 0) << out << Slurp(dir_.Join("ddp-logs/trainer-0.log"), 4000);
  const std::string compare = R"(
import sys, torch
a = torch.load(sys.argv[1]); b = torch.load(sys.argv[2])["model"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
worst = max(((x.double() - b[k].double()).abs().max().item(), k) for k, x in a.items())
print("max abs difference %.3g (%s) over %d tensors" % (worst[0], worst[1], len(a)))
sys.path.insert(0, sys.argv[3]); import resnet20_fashion as r; torch.manual_seed(7)
init = r.ResNet20().state_dict()
moved = max((x.double() - init[k].double()).abs().max().item()
            for k, x in a.items() if x.is_floating_point())
print("max abs change by training %.3g" % moved)
ok = all(torch.allclose(x.double(), b[k].double(), rtol=1e-4, atol=1e-5) for k, x in a.items())
sys.exit(0 if ok and moved > 1e-3 else 1)
)";
  const int rc = Run({Python(), "-c", compare, dir_.Join("own.pt"), dir_.Join("ddp/checkpoint.pt"),
                      test::SourceDir() + "/examples/pytorch"},
                     "compare", &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << out;
}

// Two trainers, each with an encoder and a head, an SGD over two parameter groups and an Adam,
// dict batches from a DataLoader with 2 workers and a collate_fn, 2 micro-batches per step,
// clipping, a StepLR and a loss scaler registered as state, an overflow in one step: both end
// with the same parameters and state hash after the planned steps, the scaler skipped the
// overflowing step on both, and the scheduler stepped once per step.
TEST_F(PyTorchOwnLoopTest, SeveralModelsOptimizersDictBatchesWorkersAndAScalerStayIdentical) {
  std::string out;
  ASSERT_EQ(Run({test::EdlBinary(), "launch", "-n", "2", "--log_dir", dir_.Join("logs"), "--",
                 Python(), Cases(), "features"},
                "features", &out),
            0)
      << out << Slurp(dir_.Join("logs/trainer-0.log"), 4000);
  const std::string logs =
      Slurp(dir_.Join("logs/trainer-0.log")) + "\n" + Slurp(dir_.Join("logs/trainer-1.log"));
  const std::vector<json> r = Results(logs);
  ASSERT_EQ(r.size(), 2u) << logs;
  std::cout << r[0].dump() << "\n" << r[1].dump() << std::endl;
  EXPECT_NE(r[0]["rank"], r[1]["rank"]);
  for (const json& x : r) {
    EXPECT_EQ(x["world"], 2);
    EXPECT_EQ(x["steps"], 18) << "96 samples, 2 x 8 per step, 3 epochs";
    EXPECT_EQ(x["updates"], 18);
    EXPECT_EQ(x["skipped"], 1) << "the overflowing step";
    EXPECT_DOUBLE_EQ(x["enc_lr"].get<double>(), 0.05 * 0.5 * 0.5 * 0.5) << "StepLR, 18 steps";
    EXPECT_DOUBLE_EQ(x["epochs_done"].get<double>(), 3.0);
  }
  EXPECT_EQ(r[0]["params"], r[1]["params"]);
  EXPECT_EQ(r[0]["state_hash"], r[1]["state_hash"]);
  EXPECT_EQ(r[0]["scale"], r[1]["scale"]);
}

TEST_F(PyTorchOwnLoopTest, AccumulatingMicroBatchesMatchesTheWholeBatch) {
  std::string out;
  ASSERT_EQ(Run({Python(), Cases(), "accumulation"}, "accumulation", &out), 0) << out;
  const std::vector<json> r = Results(out);
  ASSERT_EQ(r.size(), 1u) << out;
  EXPECT_LT(r[0]["max_difference"].get<double>(), 1e-6) << out;
  EXPECT_GT(r[0]["moved"].get<double>(), 1e-3) << out;
}

// lr_mode: "user" leaves the optimizer's rate alone (lr_scale is the linear-scaling factor,
// 8 / 32); "scaled" multiplies it by that factor while the optimizer steps only; "runtime" sets
// it from the runtime's schedule (cosine from 0.1 x 8 / 32).
TEST_F(PyTorchOwnLoopTest, TheLearningRateIsTheUsersScaledOrTheRuntimes) {
  std::string out;
  ASSERT_EQ(Run({Python(), Cases(), "lr_modes"}, "lr_modes", &out), 0) << out;
  const std::vector<json> r = Results(out);
  ASSERT_EQ(r.size(), 1u) << out;
  const json& m = r[0];
  for (const json& v : m["user"]["seen"]) EXPECT_DOUBLE_EQ(v.get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(m["user"]["scale"].get<double>(), 0.25);
  for (const json& v : m["scaled"]["seen"]) EXPECT_DOUBLE_EQ(v.get<double>(), 0.025);
  EXPECT_DOUBLE_EQ(m["scaled"]["after"].get<double>(), 0.1);
  const json& seen = m["runtime"]["seen"];
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_DOUBLE_EQ(seen[0].get<double>(), 0.025);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LT(seen[i], seen[i - 1]);
}

// The transformer language model (AdamW, bfloat16 autocast, clipping, accumulation, dict batches,
// DataLoader workers, its own schedule, the runtime's evaluation) at world 2: it trains, and its
// loss falls.
TEST_F(PyTorchOwnLoopTest, TheTransformerExampleTrainsAtWorldTwo) {
  std::string out;
  ASSERT_EQ(Run({test::EdlBinary(), "launch", "-n", "2", "--log_dir", dir_.Join("logs"), "--",
                 Python(), Example("lm_elastic.py"), "--sentences", "800", "--epochs", "2",
                 "--threads", "1", "--workers", "1", "--log_every", "5"},
                "lm", &out),
            0)
      << out << Slurp(dir_.Join("logs/trainer-0.log"), 4000);
  const std::string log = Slurp(dir_.Join("logs/trainer-0.log"));
  // Rank 0's progress lines: "edl.torch: step N epoch E loss L ...".
  std::vector<double> losses;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const size_t loss = line.find(" loss ");
    if (line.rfind("edl.torch: step ", 0) == 0 && loss != std::string::npos) {
      losses.push_back(std::stod(line.substr(loss + 6)));
    }
  }
  ASSERT_GE(losses.size(), 3u) << log;
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << log;
  EXPECT_NE(log.find("finished at step"), std::string::npos) << log;
  EXPECT_NE(log.find("held-out loss"), std::string::npos) << "the runtime's evaluation" << log;
}

// Each mistake ends the trainer (exit status 1) with one error naming where (rank, step), the
// cause and the fix.
TEST_F(PyTorchOwnLoopTest, MistakesEndTheTrainerWithAnErrorNamingTheFix) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"no_grad",
       {"rank 0 of 1", "model/unused.weight, model/unused.bias have no gradient at job.step()",
        "requires_grad_(False)", "allow_unused=True"}},
      {"model_changed",
       {"rank 0 of 1", "Sequential changed after edl.torch.Elastic registered it",
        "Build the model completely before creating the job"}},
      {"iterable",
       {"TypeError: edl.torch.Elastic needs a map-style dataset", "Index your records"}},
      {"no_step", {"rank 0 of 1", "job.step() was not called after the last batch of this step"}},
      {"sampler_replaced",
       {"rank 0 of 1", "this DataLoader draws its own batches",
        "batch_sampler=job.batch_sampler()"}},
      {"loader_direct", {"the loop iterates the DataLoader itself", "job.batches(loader)"}},
      {"hook_raises",
       {"rank 0 of 1", "step 5: a before_update hook raised ValueError during job.step(): a hook",
        "ValueError: a hook that fails"}},
      {"nan",
       {"rank 0 of 1", "step 4: a non-finite gradient on this trainer's samples",
        "this trainer leaves the job", "GradScaler"}},
      {"short_batch",
       {"rank 0 of 1", "the batch has 7 samples, but the runtime gave this trainer 8 indices",
        "Make collate_fn return one sample per index"}},
  };
  for (const auto& [name, wants] : cases) {
    std::string out;
    EXPECT_EQ(Run({Python(), Cases(), name}, name, &out), 1) << name << "\n" << out;
    EXPECT_EQ(out.find("no error"), std::string::npos) << name << "\n" << out;
    for (const std::string& w : wants) {
      EXPECT_NE(out.find(w), std::string::npos) << name << ": " << w << "\n" << out;
    }
  }
}

}  // namespace
}  // namespace edl
