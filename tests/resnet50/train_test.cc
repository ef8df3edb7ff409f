// A short real training run on Fashion-MNIST (the loss must fall well below its start), the
// standalone loop's output, and `edl train` on bad input (exit code 2 and a message naming the
// flag or file).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "edl/runtime/env_contract.h"
#include "edl/runtime/teacher_source.h"
#include "resnet50/data/dataset.h"
#include "resnet50/train_loop.h"
#include "resnet50/trainer.h"
#include "tests/testutil.h"

namespace edl::resnet50 {
namespace {

const char kDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kDir) + "/train-images-idx3-ubyte.gz");
}

TEST(TrainTest, FashionMnistLossFalls) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kDir;
  auto train = LoadFashionMnist(kDir, true);
  auto test = LoadFashionMnist(kDir, false);
  ASSERT_OK(train.status());
  ASSERT_OK(test.status());
  TrainerOptions o;
  o.threads = 2;
  o.model.name = "resnet20";
  auto t = Trainer::Create(o, std::move(train.value()), std::move(test.value()));
  ASSERT_OK(t.status());
  LoopOptions lo;
  lo.elastic.batch = 64;
  lo.elastic.max_steps = 60;
  lo.log_every = 20;
  lo.eval = false;
  lo.elastic.lr.base_lr = 0.1;
  lo.elastic.lr.base_batch = 64;
  lo.elastic.lr.decay = "constant";
  lo.label = "resnet20 fashion-mnist";
  std::ostringstream out;
  LoopResult r;
  ASSERT_OK(RunStandaloneLoop(t.value().get(), lo, out, &r));
  std::cout << out.str();
  EXPECT_EQ(r.steps, 60);
  EXPECT_GT(r.first_loss, 1.8);  // ~ln(10) at the start
  // Mean loss over the last 20 steps: well below the start (typically ~0.7 after 60 steps).
  EXPECT_LT(r.last_window_loss, 0.5 * r.first_loss);
  EXPECT_NE(out.str().find("images/s"), std::string::npos);
  EXPECT_NE(out.str().find("eta"), std::string::npos);
  EXPECT_NE(out.str().find("summary:"), std::string::npos);
  // Eval-mode accuracy on part of the test split is well above chance.
  runtime::StepStats s;
  std::vector<int64_t> idx(500);
  for (int i = 0; i < 500; ++i) idx[i] = i;
  ASSERT_OK(t.value()->Evaluate(idx, &s));
  EXPECT_GT(s.correct, 150);
}

// A teacher that answers nothing (every sample trains on labels) and records which (augmentation
// seed, indices) batches were asked for ahead of the step that needs them.
class RecordingTeacher : public runtime::TeacherSource {
 public:
  void Request(const std::vector<int64_t>& indices, uint64_t aug_seed) override {
    requested_.insert({aug_seed, indices});
  }
  Status Get(const std::vector<int64_t>& indices, uint64_t aug_seed, int classes, float* logits,
             uint8_t* has) override {
    (requested_.count({aug_seed, indices}) ? asked_ahead_ : not_asked_)++;
    std::fill(logits, logits + indices.size() * classes, 0.f);
    std::fill(has, has + indices.size(), uint8_t{0});
    return Status::OK();
  }
  runtime::TeacherCounters counters() const override { return {}; }
  int asked_ahead_ = 0, not_asked_ = 0;

 private:
  std::set<std::pair<uint64_t, std::vector<int64_t>>> requested_;
};

// The student asks its teachers a window of steps ahead; near an epoch's end that window holds
// the next epoch's first steps, whose augmentation seed is the next epoch's. Asked with the
// current epoch's seed, they missed, and every epoch began with a window of fresh requests that
// the student waited for (bench/distill.sh: 0.59 of the images/s of a student alone).
TEST(TrainTest, DistillationAsksEveryStepAheadWithItsOwnEpochsSeed) {
  TrainerOptions o;
  o.threads = 1;
  o.model.name = "resnet20";
  auto t = Trainer::Create(o, MakeSyntheticDataset(96, 1, 16, 10, 7),
                           MakeSyntheticDataset(16, 1, 16, 10, 8));
  ASSERT_OK(t.status());
  RecordingTeacher teacher;
  t.value()->SetTeacher(&teacher, DistillLossParams(), /*window=*/4);
  LoopOptions lo;
  lo.elastic.batch = 16;  // 6 steps an epoch
  lo.elastic.epochs = 3;
  lo.log_every = 0;
  lo.eval = false;
  lo.elastic.lr.decay = "constant";
  lo.label = "lookahead";
  std::ostringstream out;
  LoopResult r;
  ASSERT_OK(RunStandaloneLoop(t.value().get(), lo, out, &r));
  EXPECT_EQ(r.steps, 18);
  // Only the first step cannot have been asked ahead.
  EXPECT_EQ(teacher.not_asked_, 1);
  EXPECT_EQ(teacher.asked_ahead_, 17);
}

// Runs `edl train ARGS` (with `env` added to the environment) with a deadline; returns the exit
// code and the captured stderr (and stdout, when `out` is given).
int RunEdlTrain(const std::vector<std::string>& args, std::string* err, std::string* out = nullptr,
                const std::map<std::string, std::string>& env = {}) {
  test::ScratchDir dir("edltrain");
  // *.log: the scratch directory's sanitizer check reads them (tests/testutil.h).
  const std::string err_path = dir.Join("stderr.log"), out_path = dir.Join("stdout.log");
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(err_path.c_str(), "w", stderr);
    if (out != nullptr) f = std::freopen(out_path.c_str(), "w", stdout);
    (void)f;
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    std::string bin = test::EdlBinary(), sub = "train";
    argv.push_back(bin.data());
    argv.push_back(sub.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream in(err_path);
  *err = std::string((std::istreambuf_iterator<char>(in)), {});
  if (out != nullptr) {
    std::ifstream o(out_path);
    *out = std::string((std::istreambuf_iterator<char>(o)), {});
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

TEST(TrainMainTest, BadInputIsExitCode2WithClearMessage) {
  std::string err;
  EXPECT_EQ(RunEdlTrain({"--batch_size", "0"}, &err), 2);
  EXPECT_NE(err.find("--batch_size"), std::string::npos) << err;
  EXPECT_EQ(RunEdlTrain({"--data_dir", "/nonexistent-dir"}, &err), 2);
  EXPECT_NE(err.find("/nonexistent-dir/train-images-idx3-ubyte"), std::string::npos) << err;
  EXPECT_EQ(RunEdlTrain({"--model", "resnet50", "--data", "synthetic", "--image_size", "28"}, &err),
            2);
  EXPECT_NE(err.find("--image_size"), std::string::npos) << err;
  EXPECT_EQ(RunEdlTrain({"--no_such_flag", "1"}, &err), 2);
  EXPECT_EQ(RunEdlTrain({"--device", "tpu"}, &err), 2);
  // A truncated image file in the data dir is named in the error.
  test::ScratchDir dir("fm");
  std::ofstream(dir.Join("train-images-idx3-ubyte"), std::ios::binary)
      << std::string("\0\0\x08\x03", 4);
  EXPECT_EQ(RunEdlTrain({"--data_dir", dir.path()}, &err), 2);
  EXPECT_NE(err.find("train-images-idx3-ubyte"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  // --help lists every flag with its default and exits 0.
  EXPECT_EQ(RunEdlTrain({"--help"}, &err), 0);
}

// The runtime checks the env contract before any data is loaded, and names the variable at fault.
TEST(TrainMainTest, BadEnvironmentIsExitCode2NamingTheVariable) {
  std::string err;
  EXPECT_EQ(RunEdlTrain({"--data_dir", "/nonexistent-dir"}, &err, nullptr,
                        {{runtime::env::kRank, "3"}, {runtime::env::kWorldSize, "2"}}),
            2);
  EXPECT_NE(err.find("RANK=3"), std::string::npos) << err;
  EXPECT_EQ(err.find("/nonexistent-dir"), std::string::npos)
      << "checked before loading data: " << err;
  EXPECT_EQ(RunEdlTrain({"--data", "synthetic"}, &err, nullptr, {{runtime::env::kJoining, "1"}}),
            2);
  EXPECT_NE(err.find("EDL_CLIENT_SOCKET"), std::string::npos) << err;
  EXPECT_EQ(
      RunEdlTrain({"--data", "synthetic"}, &err, nullptr, {{runtime::env::kGeneration, "two"}}), 2);
  EXPECT_NE(err.find("EDL_GENERATION"), std::string::npos) << err;
}

TEST(TrainMainTest, SyntheticRunPrintsProgressAndSummary) {
  std::string err, out;
  ASSERT_EQ(RunEdlTrain({"--data", "synthetic", "--image_size", "16", "--batch_size", "8",
                         "--max_steps", "3", "--log_every", "1", "--threads", "1"},
                        &err, &out),
            0)
      << err << out;
  SCOPED_TRACE("stdout:\n" + out);
  // The header names the run; one progress line per step (--log_every 1) with loss, rate, lr, the
  // generation and world, and eta; then the final evaluation and the one-line summary.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(^edl train: resnet20 on synthetic .*batch 8)")));
  for (int step = 1; step <= 3; ++step) {
    EXPECT_TRUE(std::regex_search(
        out, std::regex("(^|\n)epoch 1/1 step " + std::to_string(step) +
                        R"( loss [0-9.]+ acc [0-9.]+% images/s [0-9.]+ lr [0-9.]+ gen 1 world 1 )"
                        R"(eta \d+m\d+s)")))
        << "no progress line for step " << step;
  }
  EXPECT_FALSE(std::regex_search(out, std::regex(R"(step 4 )"))) << "ran past --max_steps";
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(\neval epoch 0 step 3: test loss [0-9.]+ acc [0-9.]+%)")));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex(
          R"(\nsummary: resnet20 synthetic steps (\d+) .*final_train_loss ([0-9.]+) .*world 1 )")));
  EXPECT_EQ(m[1], "3");
  EXPECT_GT(std::stod(m[2]), 0.0);
}

}  // namespace
}  // namespace edl::resnet50
