// Trainer: a ResNet with its backend, SGD optimizer state and data loaders, behind the
// runtime::Trainable contract (edl/runtime/trainable.h) so that both the standalone loop
// (train_loop.h) and the elastic runtime drive it the same way.
//
// State tensors (stable names, torchvision style): every parameter ("layer1.0.conv1.weight"), the
// BN running statistics ("layer1.0.bn1.running_mean"), then every momentum buffer
// ("momentum/layer1.0.conv1.weight"), in that order.
//
// Thread-safety: as Trainable — one training thread; the data prefetch thread is internal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/teacher_source.h"
#include "edl/runtime/trainable.h"
#include "resnet50/backend.h"
#include "resnet50/data/batch_loader.h"
#include "resnet50/data/dataset.h"
#include "resnet50/distill_loss.h"
#include "resnet50/model.h"

namespace edl::resnet50 {

struct TrainerOptions {
  std::string device = "cpu";      // cpu | cuda | auto (cuda when built and usable, else cpu)
  int threads = 0;                 // CPU compute threads; 0 = DefaultThreads(trainers_on_node)
  int trainers_on_node = 1;        // trainers sharing this node's cores (the env contract's
                                   // EnvContract::TrainersOnNode())
  std::string precision = "fp32";  // CUDA compute precision: fp32 | bf16 | fp16 (CPU: fp32 only)
  int cuda_device =
      -1;  // --cuda_device; -1: device_hint modulo the visible GPUs (ResolveCudaDevice)
  int device_hint = 0;  // EnvContract::DeviceHint(): the slot, or LOCAL_RANK
  ModelConfig model;    // in_channels / image_size / num_classes come from the data
  float momentum = 0.9f;
  float weight_decay = 5e-4f;  // on conv/fc weights (and on BN/bias when model.decay_bn_and_bias)
  bool nesterov = false;
  float label_smoothing = 0.0f;
  Augment augment;    // training-set augmentation
  uint64_t seed = 1;  // init and augmentation
  // Benchmark only (--resident_batch): the first training batch is loaded and uploaded once and
  // fed again every step, so a timed window measures compute on device-resident data (no
  // per-step loading or host-to-device copy). Training then sees one batch, whatever the indices.
  bool resident_batch = false;
};

// Cores of this machine divided by `trainers_on_node`, at least 1.
int DefaultThreads(int trainers_on_node);

class Trainer : public runtime::Trainable {
 public:
  // Takes ownership of the datasets (test may be null: Evaluate then fails). InvalidArgument when
  // the model cannot take the data's images.
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                   std::unique_ptr<Dataset> train,
                                                   std::unique_ptr<Dataset> test);
  ~Trainer() override;

  // ---- runtime::Trainable
  bool on_device() const override { return backend_->on_device(); }
  void* stream() const override { return backend_->stream(); }
  std::vector<runtime::StateTensor> StateTensors() override;
  float* GradientBuffer(size_t* count) override;
  Status ScaleGradients(float factor) override;
  int64_t train_size() const override { return train_->size(); }
  int64_t test_size() const override { return test_ ? test_->size() : 0; }
  void Prefetch(int64_t epoch, const std::vector<int64_t>& indices) override;
  // Also logs, when the epoch moves on, how many samples of the last one this trainer skipped
  // as unloadable (Dataset::FillBatch, kSkippedLabel).
  void SetEpoch(int64_t epoch) override;
  // With a teacher: the window of steps whose teacher logits are asked for ahead.
  int lookahead_steps() const override { return teacher_ ? window_ : 0; }
  // Of the training samples this trainer got teacher logits for: how many, and how many of those
  // the teacher classed as their label. A low share means a teacher that does not know the data
  // (or answers for other samples) and will drag the student down.
  int64_t teacher_rows() const { return teacher_rows_; }
  int64_t teacher_hits() const { return teacher_hits_; }
  void Lookahead(const std::vector<UpcomingStep>& steps) override;
  // Samples the dataset could not load are left out: the loss and its gradient are still divided
  // by indices.size(), so a skipped sample adds nothing and the runtime's scaling by the slice size
  // stays exact; stats->samples counts the samples fed.
  Status ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  // ForwardBackward without the teacher (labels only) and without counting skipped samples: the
  // warm-up trains nothing, so a distilling student must not count its samples as answered.
  Status WarmUpStep(const std::vector<int64_t>& indices) override;
  Status ApplyUpdate(double lr) override;
  Status Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  // "<model>:<channels>x<size>:<classes>:<16 hex digits>", the digits hashing StateLayout().
  std::string Fingerprint() const override;
  Status CopyToHost(const runtime::StateTensor& t, void* dst) override;
  Status CopyFromHost(const runtime::StateTensor& t, const void* src) override;
  // Pinned on CUDA (Backend::AllocateHost): the Gloo path's gradient and state staging buffer.
  void* AllocateHostStaging(size_t bytes) override { return backend_->AllocateHost(bytes); }
  void FreeHostStaging(void* ptr) override { backend_->FreeHost(ptr); }

  // Distillation: from now on ForwardBackward trains on DistillLoss against `teacher`'s logits
  // (not owned; must outlive the trainer, or be reset with nullptr), asking for them `window`
  // steps ahead. REQUIRES: ValidateDistillLossParams(params).ok().
  void SetTeacher(runtime::TeacherSource* teacher, const DistillLossParams& params, int window);

  // Eval-mode logits of training samples as a teacher serves them: each batch's images filled as
  // the training loader fills them (augmentation `augment` seeded by its aug_seed), all batches in
  // one forward pass. *logits = [sum of the batch sizes, classes] row-major, batch after batch.
  struct TrainBatch {
    const std::vector<int64_t>* indices = nullptr;
    uint64_t aug_seed = 0;
    Augment augment;
  };
  Status InferTrain(const std::vector<TrainBatch>& batches, std::vector<float>* logits);

  Model* model() { return model_.get(); }
  Backend* backend() { return backend_.get(); }
  const TrainerOptions& options() const { return options_; }
  const Dataset& train_data() const { return *train_; }
  int threads() const { return threads_; }
  // The CUDA device the backend runs on (-1 on CPU): the communicator's too.
  int cuda_device() const { return backend_->device_ordinal(); }
  // Training samples skipped as unloadable since the start (this process).
  int64_t skipped_samples() const { return skipped_total_; }
  // The model name, input and every state tensor's name and shape, e.g.
  // "resnet20:1x28:10;conv1.weight[16,1,3,3];...": what Fingerprint() hashes.
  std::string StateLayout() const;

 private:
  Trainer(const TrainerOptions& options, std::unique_ptr<Dataset> train,
          std::unique_ptr<Dataset> test);
  Status Init();
  // Uploads a host batch into input_/labels_ (resized to the number of samples it holds), leaving
  // out samples labelled kSkippedLabel. *fed: samples uploaded.
  Status Upload(const HostBatch& batch, int64_t* fed);
  // Distillation: the loss and dlogits_ of a step from the model's `logits` and the teacher's.
  Status DistillStep(const std::vector<int64_t>& indices, const Tensor& logits, double* loss_sum,
                     int64_t* correct);

  const TrainerOptions options_;
  int threads_ = 1;
  std::unique_ptr<Dataset> train_, test_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;     // uses backend_; declared after it
  Tensor momentum_;                  // [num_params], same layout as model_->params()
  Tensor input_, labels_, dlogits_;  // [n,C,S,S], [n] int32, [n,classes]
  std::unique_ptr<BatchLoader> train_loader_, test_loader_;
  std::vector<runtime::StateTensor> state_;  // built once in Init()
  HostBatch batch_;
  std::vector<int32_t> fed_labels_;  // labels_ read back each step (StepStats::label_hash)
  bool resident_loaded_ = false;     // resident_batch: input_ / labels_ hold the batch
  HostBatch compact_;                // the loaded samples of a batch with skipped ones
  std::vector<float> logits_host_;   // Evaluate: [n, classes] for top-5
  int64_t epoch_ = 0;                // SetEpoch
  int64_t skipped_epoch_ = 0, loaded_epoch_ = 0, skipped_total_ = 0;  // unloadable samples
  // Distillation (SetTeacher); host buffers of one step: [n, classes] and [n].
  runtime::TeacherSource* teacher_ = nullptr;
  DistillLossParams distill_;
  int window_ = 0;
  std::vector<float> host_logits_, host_teacher_, host_dlogits_;
  std::vector<uint8_t> has_teacher_;
  int64_t teacher_rows_ = 0,
          teacher_hits_ = 0;  // answered samples; of them, teacher argmax == label
};

}  // namespace edl::resnet50
