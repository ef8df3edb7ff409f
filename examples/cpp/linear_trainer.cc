// linear_trainer: the smallest in-place elastic trainer (docs/TRAINERS.md, "Bringing your own
// trainer"). A linear model y = w.x + b fitted by SGD to a synthetic data set, as an
// edl::runtime::Trainable handed to edl::runtime::ElasticTrainer. The runtime picks the run mode
// from the environment: in place under `edl client` (re-forms without restarting), static under
// `edl launch`, alone otherwise; it shards the data, all-reduces the gradients, syncs state to
// joiners and, with --checkpoint_dir, checkpoints and resumes.
//
//   linear_trainer [--steps N] [--batch B] [--lr LR] [--checkpoint_dir DIR] [--checkpoint_steps K]
//
// Prints one line every 20 steps on rank 0 and, at the end, "linear_trainer: finished ...".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "edl/runtime/checkpoint_loader.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/run_mode.h"

namespace {

using edl::Status;
using edl::runtime::StateTensor;
using edl::runtime::StepStats;

constexpr int kDim = 8;               // features per sample
constexpr int64_t kTrainSize = 8192;  // samples 0 .. kTrainSize-1
constexpr int64_t kTestSize = 1024;   // samples kTrainSize .. kTrainSize+kTestSize-1

// Feature j of sample i, in [-1, 1]: a hash of (i, j), so every rank computes the same data set.
float Feature(int64_t i, int j) {
  uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL + (j + 1) * 0xC2B2AE3D27D4EB4FULL;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 29;
  return static_cast<float>(h % 2001) / 1000.0f - 1.0f;
}

// The target the model should learn: weights +-0.25 * (j + 1), bias 0.5.
float Target(int64_t i) {
  float y = 0.5f;
  for (int j = 0; j < kDim; ++j) y += (j % 2 ? -0.25f : 0.25f) * (j + 1) * Feature(i, j);
  return y;
}

class LinearModel : public edl::runtime::Trainable {
 public:
  // params_: [kDim weights, 1 bias]; grad_: the same + kInbandSlots words for the runtime.
  LinearModel() : params_(kDim + 1, 0.0f), grad_(kDim + 1 + kInbandSlots, 0.0f) {}

  bool on_device() const override { return false; }
  std::vector<StateTensor> StateTensors() override {
    StateTensor t;
    t.name = "linear.weight_and_bias";
    t.shape = {kDim + 1};
    t.data = params_.data();
    t.bytes = params_.size() * sizeof(float);
    return {t};
  }
  float* GradientBuffer(size_t* count) override {
    *count = kDim + 1;
    return grad_.data();
  }
  Status ScaleGradients(float factor) override {
    for (int k = 0; k <= kDim; ++k) grad_[k] *= factor;
    return Status::OK();
  }
  int64_t train_size() const override { return kTrainSize; }
  int64_t test_size() const override { return kTestSize; }

  // Mean squared error / 2 over `indices`; its gradient goes to grad_[0 .. kDim].
  Status ForwardBackward(const std::vector<int64_t>& indices, StepStats* stats) override {
    std::fill(grad_.begin(), grad_.begin() + kDim + 1, 0.0f);
    const float inv_n = 1.0f / static_cast<float>(indices.size());
    for (int64_t i : indices) {
      const float r = Predict(i) - Target(i);
      for (int j = 0; j < kDim; ++j) grad_[j] += r * Feature(i, j) * inv_n;
      grad_[kDim] += r * inv_n;
      stats->loss_sum += 0.5 * r * r;
    }
    stats->samples += static_cast<int64_t>(indices.size());
    return Status::OK();
  }
  Status ApplyUpdate(double lr) override {
    for (int k = 0; k <= kDim; ++k) params_[k] -= static_cast<float>(lr) * grad_[k];
    return Status::OK();
  }
  Status Evaluate(const std::vector<int64_t>& indices, StepStats* stats) override {
    for (int64_t i : indices) {
      const float r = Predict(kTrainSize + i) - Target(kTrainSize + i);
      stats->loss_sum += 0.5 * r * r;
      stats->correct += std::fabs(r) < 0.1f ? 1 : 0;  // "correct": within 0.1 of the target
    }
    stats->samples += static_cast<int64_t>(indices.size());
    return Status::OK();
  }
  std::string Fingerprint() const override { return "linear_trainer:dim=" + std::to_string(kDim); }
  Status CopyToHost(const StateTensor& t, void* dst) override {
    std::memcpy(dst, t.data, t.bytes);
    return Status::OK();
  }
  Status CopyFromHost(const StateTensor& t, const void* src) override {
    std::memcpy(t.data, src, t.bytes);
    return Status::OK();
  }

 private:
  float Predict(int64_t i) const {
    float y = params_[kDim];
    for (int j = 0; j < kDim; ++j) y += params_[j] * Feature(i, j);
    return y;
  }

  std::vector<float> params_;
  std::vector<float> grad_;
};

// Rank 0's progress lines, and the first loss for the final summary.
class Progress : public edl::runtime::TrainingObserver {
 public:
  void OnStep(const edl::runtime::StepReport& r) override {
    if (first_loss < 0) first_loss = r.loss;
    if (r.rank == 0 && r.step % 20 == 0) {
      std::cout << "step " << r.step << " loss " << r.loss << " world " << r.world_size
                << " generation " << r.generation << std::endl;
    }
  }
  double first_loss = -1;
};

int Fail(const std::string& what) {
  std::cerr << "linear_trainer: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  edl::runtime::ElasticOptions options;
  options.max_steps = 200;
  options.batch = 32;
  options.lr.base_lr = 0.1;
  options.lr.base_batch = 0;  // the same rate whatever the world size
  options.lr.decay = "constant";
  options.evaluate_each_epoch = true;
  edl::ckpt::RocksDbStoreOptions store;
  edl::runtime::CheckpointLoaderOptions checkpoint;
  for (int a = 1; a < argc; ++a) {
    const std::string flag = argv[a];
    if (a + 1 >= argc)
      return Fail("flag " + flag + " needs a value (see the top of linear_trainer.cc)");
    const char* v = argv[++a];
    if (flag == "--steps") {
      options.max_steps = std::atoll(v);
    } else if (flag == "--batch") {
      options.batch = std::atoll(v);
    } else if (flag == "--lr") {
      options.lr.base_lr = std::atof(v);
    } else if (flag == "--checkpoint_dir") {
      store.dir = v;
    } else if (flag == "--checkpoint_steps") {
      checkpoint.save.checkpoint_steps = std::atoll(v);
    } else {
      return Fail("unknown flag " + flag +
                  "; flags: --steps --batch --lr --checkpoint_dir --checkpoint_steps");
    }
  }
  // The environment (edl client, edl launch, or nothing) decides the mode; a malformed one fails
  // here, naming the variable.
  auto plan = edl::runtime::PlanRunFromProcess();
  if (!plan.ok()) return Fail(plan.status().ToString());
  plan.value().ApplyTo(&options);
  auto membership = edl::runtime::Connect(plan.value());
  if (!membership.ok()) return Fail(membership.status().ToString());
  std::unique_ptr<edl::runtime::CheckpointLoader> loader;
  if (!store.dir.empty()) {
    loader = edl::runtime::NewRocksDbCheckpointLoader(store, checkpoint);
    options.loader = loader.get();
  }
  Progress progress;
  options.observer = &progress;
  std::cout << "linear_trainer: " << edl::runtime::RunModeName(plan.value().mode)
            << " mode, trainer " << membership.value()->trainer_id() << std::endl;

  LinearModel model;
  edl::runtime::ElasticTrainer trainer(options, &model, membership.value().get());
  edl::runtime::ElasticResult result;
  const Status s = trainer.Run(&result);
  if (!s.ok()) return Fail(s.ToString());
  std::cout << "linear_trainer: " << (result.left ? "left" : "finished") << " at step "
            << result.step << " generation " << result.generation << ", loss "
            << progress.first_loss << " -> " << result.last_loss
            << ", test within 0.1: " << result.accuracy << std::endl;
  return 0;
}
