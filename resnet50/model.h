// Model: the ResNet family on a Backend. ResNet v1.5 (stride on the 3x3 conv of a bottleneck)
// ResNet-18/34/50/101 for 3x224x224-style images, and CIFAR-style ResNet-20/56 (3 stages of
// 16/32/64 channels, no max pool) for 1- or 3-channel 28/32 px images. Projection shortcuts
// (1x1 conv + BN) wherever the shape changes, in both families.
//
// Memory: all parameters live in ONE flat fp32 buffer and all their gradients in another (plus
// runtime::Trainable::kInbandSlots spare floats), so the optimizer and the all-reduce each see one
// buffer. Parameters with weight decay (conv and fc weights) come first, then those without (BN
// gamma/beta, fc bias) — see decay_count(). Activations are allocated per batch size, on demand.
//
// Thread-safety: not thread-safe; one training thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "resnet50/backend.h"

namespace edl::resnet50 {

struct ModelConfig {
  std::string name = "resnet20";  // resnet20|resnet56|resnet18|resnet34|resnet50|resnet101
  int in_channels = 1;
  int image_size = 28;  // square images
  int num_classes = 10;
  bool zero_init_residual = false;  // gamma of each block's last BN starts at 0
  bool decay_bn_and_bias = false;   // apply weight decay to BN params and biases too
  uint64_t seed = 1;                // He init
};

// InvalidArgument naming --model / --image_size / channels when the model cannot take the input.
Status ValidateModelConfig(const ModelConfig& config);

class Model {
 public:
  struct ParamInfo {
    std::string name;  // e.g. "layer1.0.conv1.weight" (torchvision names)
    Shape shape;
    int64_t offset = 0;  // in floats, into params() / grads()
    bool decay = true;
  };
  struct BufferInfo {
    std::string name;  // e.g. "layer1.0.bn1.running_mean"
    Tensor* tensor;    // owned by the model
  };

  // Builds the model and initialises it (He init). The backend must outlive the model.
  static StatusOr<std::unique_ptr<Model>> Create(Backend* backend, const ModelConfig& config);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamInfo>& param_info() const { return params_; }
  std::vector<BufferInfo> buffers();
  int64_t num_params() const { return num_params_; }
  int64_t decay_count() const { return decay_count_; }  // floats [0, decay_count) take decay
  Tensor& params() { return flat_params_; }             // [num_params]
  Tensor& grads() { return flat_grads_; }               // [num_params + kInbandSlots]

  // x [N, C, S, S] kNCHW (N may change between calls). On success *logits points to the model's
  // [N, classes] output, valid until the next Forward. training: batch statistics + running-stat
  // update; else running statistics.
  Status Forward(const Tensor& x, bool training, const Tensor** logits);
  // Backward of the last training Forward from dlogits [N, classes]; overwrites grads().
  Status Backward(const Tensor& dlogits);

  struct Impl;

 private:
  Model(Backend* backend, const ModelConfig& config);
  Status Build();

  Backend* const backend_;  // not owned
  const ModelConfig config_;
  std::vector<ParamInfo> params_;
  int64_t num_params_ = 0;
  int64_t decay_count_ = 0;
  Tensor flat_params_;
  Tensor flat_grads_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edl::resnet50
