// Trainable: what the elastic runtime needs from a model trainer (implemented by resnet50's
// Trainer for the CPU and CUDA backends; tests use small ones). The runtime owns the loop, the
// data plan (which sample indices each rank takes), the communicator and checkpoints; the
// Trainable owns the device, the model, the optimizer state and the data loader.
//
// One training step, as the runtime drives it:
//   Prefetch(epoch, next step's indices)     hint: start loading the following batch
//   BeginStep(plan)                          the step's data position, batches, rank and world
//   SetEpoch(epoch); ForwardBackward(indices, &stats)
//                                            gradient of the mean loss over `indices`
//                                            (EmptyStep(stand_in) when this rank has none)
//   <gradient hook>                          runtime scales (ScaleGradients) and all-reduces the
//                                            flat GradientBuffer, plus its in-band words
//   ApplyUpdate(lr)                          SGD step from the (reduced) gradients
//
// Thread-safety: all methods are called from the runtime's one training thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/data_plan.h"

namespace edl::runtime {

// A view of one tensor of the training state. `data` points into memory the Trainable owns
// (device memory when on_device()), valid for the Trainable's lifetime.
struct StateTensor {
  std::string name;  // stable across runs and world sizes, e.g. "layer1.0.conv1.weight",
                     // "layer1.0.bn1.running_mean", "momentum/layer1.0.conv1.weight"
  std::vector<int64_t> shape;
  DataType dtype = DataType::kFloat32;
  void* data = nullptr;
  size_t bytes = 0;
  // Updated from each rank's own data, so ranks holding the same step still differ (BatchNorm
  // running statistics, as in PyTorch DDP). The runtime re-broadcasts these at every re-form; the
  // rest only when some rank lacks the newest step (a joiner, a rollback).
  bool per_rank = false;
};

struct StepStats {
  double loss_sum = 0;        // sum over samples of the per-sample loss
  int64_t correct = 0;        // top-1 correct predictions
  int64_t correct_top5 = -1;  // Evaluate: labels among the 5 highest logits (-1: not computed)
  int64_t samples = 0;        // samples processed
  // ForwardBackward: LabelHash of the labels in the batch the model was fed, read from that batch
  // (0: the Trainable computes none). The runtime writes it to its sample log, so tests check the
  // data each rank trained on, not only the indices the data plan gave it.
  uint64_t label_hash = 0;
};

// FNV-1a over `n` labels (their int32 bytes, in batch order).
inline uint64_t LabelHash(const int32_t* labels, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; ++i) {
    const auto v = static_cast<uint32_t>(labels[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 1099511628211ULL;
    }
  }
  return h;
}

class Trainable {
 public:
  // Number of float slots after the gradients in GradientBuffer() that the runtime may use for
  // in-band words (e.g. "a newer generation was seen"), reduced with the gradients (SUM).
  static constexpr size_t kInbandSlots = 5;

  virtual ~Trainable() = default;

  // True when state, gradients and GradientBuffer() live in CUDA device memory.
  virtual bool on_device() const = 0;
  // cudaStream_t (as void*) that compute runs on; nullptr on CPU.
  virtual void* stream() const { return nullptr; }

  // Every tensor of the training state (parameters, optimizer state, BN running statistics) in a
  // stable order. Broadcasting all of them from one rank makes two trainers identical.
  virtual std::vector<StateTensor> StateTensors() = 0;
  // Flat fp32 buffer of all parameter gradients followed by kInbandSlots spare floats.
  // *count receives the number of gradient floats (the buffer holds *count + kInbandSlots).
  virtual float* GradientBuffer(size_t* count) = 0;
  // Multiplies the gradient floats (not the in-band slots) by `factor`.
  virtual Status ScaleGradients(float factor) = 0;

  // Training / test split sizes (number of samples).
  virtual int64_t train_size() const = 0;
  virtual int64_t test_size() const = 0;

  // Hint: start loading training samples `indices` of data-plan epoch `epoch` (the next step's
  // slice) so that ForwardBackward finds them ready. A hint that goes unused (the world changed
  // before that step) costs only the loading.
  virtual void Prefetch(int64_t epoch, const std::vector<int64_t>& indices) {}
  // The data-plan epoch of the indices of the following ForwardBackward calls: random
  // augmentation is seeded by (seed, epoch, sample index), so the same sample is augmented alike
  // on any rank and in any world size.
  virtual void SetEpoch(int64_t epoch) {}
  // How many steps ahead the Trainable wants to see its indices (0: none, the default). When > 0
  // the runtime calls Lookahead before each ForwardBackward with this rank's indices of the next
  // steps (steps[0] is the step after the current one) and the data-plan epoch each belongs to
  // (the next epoch's first steps are among them near an epoch's end, and their augmentation
  // differs), assuming the current world and batch sizes: a hint (a distilling trainer asks its
  // teachers ahead), wrong after a re-form.
  struct UpcomingStep {
    int64_t epoch = 0;
    std::vector<int64_t> indices;
  };
  virtual int lookahead_steps() const { return 0; }
  virtual void Lookahead(const std::vector<UpcomingStep>& steps) {}
  // The step about to run, before its SetEpoch and ForwardBackward (or EmptyStep): enough for a
  // Trainable to derive this rank's slices of the following steps itself (DataPlan over the same
  // seed and train_size()) for as long as the world stays as it is.
  struct StepPlan {
    int64_t step = 0;                  // steps committed before this one
    DataPosition position;             // where this step starts
    std::vector<int64_t> batch_sizes;  // per rank, the DataPlan's batch sizes
    int rank = 0;
    int world_size = 0;
    int64_t generation = 0;
  };
  virtual void BeginStep(const StepPlan& plan) {}
  // Forward and backward over the training samples `indices`; leaves d(mean loss)/dθ in
  // GradientBuffer(). REQUIRES: !indices.empty().
  virtual Status ForwardBackward(const std::vector<int64_t>& indices, StepStats* stats) = 0;
  // A step that gives this rank no samples (the short last step of an epoch may leave some ranks
  // none): its gradients must be zero. `stand_in` holds the samples of the lowest rank that has
  // some, for a Trainable whose step code must run on every rank all the same (edl.torch's own
  // loop, whose optimizer code is the user's): it may compute on them, then zero the gradients.
  virtual Status EmptyStep(const std::vector<int64_t>& stand_in) { return ZeroGradients(); }
  // A joiner's warm-up pass (ElasticTrainer: first use of the kernels before it reports ready):
  // like ForwardBackward, but not a training step, so a Trainable that counts or fetches per
  // trained sample (a distilling student's teacher answers, skipped-file counts) leaves that out.
  // The runtime restores the state and zeroes the gradients afterwards.
  virtual Status WarmUpStep(const std::vector<int64_t>& indices) {
    StepStats stats;
    return ForwardBackward(indices, &stats);
  }
  // One optimizer step with learning rate `lr` using the gradients in GradientBuffer().
  virtual Status ApplyUpdate(double lr) = 0;
  // Eval-mode forward over the test samples `indices` (no state changes).
  virtual Status Evaluate(const std::vector<int64_t>& indices, StepStats* stats) = 0;

  // Identifies the model and state shapes; checkpoints from another fingerprint are refused.
  virtual std::string Fingerprint() const = 0;
  // Copies a state tensor to/from host memory of t.bytes bytes (a memcpy on CPU).
  virtual Status CopyToHost(const StateTensor& t, void* dst) = 0;
  virtual Status CopyFromHost(const StateTensor& t, const void* src) = 0;

  // Host memory for staging device data through a communicator that reads host memory (Gloo with
  // on_device()): the gradient all-reduce and the state broadcast copy through it. The CUDA
  // trainer returns page-locked memory (faster, asynchronous copies); the default is ordinary
  // memory. nullptr when out of memory. Freed with FreeHostStaging.
  virtual void* AllocateHostStaging(size_t bytes) { return ::operator new(bytes, std::nothrow); }
  virtual void FreeHostStaging(void* ptr) { ::operator delete(ptr); }

  // Device-safe access to GradientBuffer() for the runtime, which never dereferences that buffer
  // itself (it is device memory when on_device()): everything goes through CopyToHost /
  // CopyFromHost on a view of the buffer.
  // Writes the kInbandSlots in-band words from host memory.
  Status WriteInband(const float* words) {
    return CopyFromHost(GradientView(/*inband=*/true), words);
  }
  // Reads the kInbandSlots in-band words into host memory.
  Status ReadInband(float* words) { return CopyToHost(GradientView(/*inband=*/true), words); }
  // Zeroes the gradients and the in-band words (a rank with no samples in a short last step).
  Status ZeroGradients() {
    const StateTensor t = GradientView(/*inband=*/false);
    const std::vector<char> zeros(t.bytes, 0);
    return CopyFromHost(t, zeros.data());
  }
  // The gradients and the in-band words as one tensor (what the runtime all-reduces), for copies
  // to and from a host staging buffer.
  StateTensor GradientTensor() { return GradientView(/*inband=*/false); }

 private:
  // A view of the in-band words, or of the gradients and the in-band words.
  StateTensor GradientView(bool inband) {
    size_t count = 0;
    float* g = GradientBuffer(&count);
    StateTensor t;
    t.name = inband ? "gradients/inband" : "gradients";
    const size_t n = inband ? kInbandSlots : count + kInbandSlots;
    t.shape = {static_cast<int64_t>(n)};
    t.data = inband ? g + count : g;
    t.bytes = n * sizeof(float);
    return t;
  }
};

}  // namespace edl::runtime
