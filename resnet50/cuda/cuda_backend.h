// CudaBackend: the Backend (resnet50/backend.h) on one NVIDIA GPU. Internal to resnet50/cuda/;
// everything else reaches it through CreateBackend("cuda", ...). Split over two translation units:
// cuda_backend.cc (memory, copies, element-wise, pooling, FC on cuBLAS, loss, SGD) and
// cudnn_ops.cc (convolution and batch norm on cuDNN), so cuDNN-heavy code rebuilds alone.
//
// Formats. Layout::kNative 4-D activations are NHWC in the compute precision (fp32, bf16 or fp16,
// BackendOptions::precision); Layout::kNHWC is NHWC fp32; kNCHW and everything that is not 4-D is
// plain fp32 (int32 for labels). Parameters and gradients stay fp32 in the model's flat buffers
// (the fp32 master weights); each conv packs its OIHW fp32 weights into a KRSC copy in the compute
// precision on the fly and unpacks weight gradients back into OIHW fp32. An operand that is not in
// the format an op computes in goes through a scratch buffer (e.g. the NCHW fp32 images into the
// stem conv), so every op accepts every layout.
//
// Precision. fp32: exact fp32 (TF32 tensor cores disabled in cuDNN and cuBLAS) for parity with the
// CPU backend. bf16: bf16 activations and conv operands, fp32 accumulation, fp32 BN statistics and
// parameters, fp32 FC and loss. fp16: as bf16 with dynamic loss scaling: dlogits are multiplied by
// the loss scale S, every parameter gradient is divided by S where it is written (the alpha of the
// cuDNN/cuBLAS call), the first SgdUpdate after a backward flags inf/NaN in the whole gradient
// buffer and every SgdUpdate of that step is skipped on the device; the next loss halves S after an
// overflow and doubles it after kGrowthInterval clean steps.
//
// Streams and copies. One stream per backend; every op is enqueued on it and returns at once.
// CopyFromHost stages through a small ring of pinned buffers (host memcpy, then an async DMA), so
// the host prepares the next batch while the GPU computes. Host waits (CopyToHost,
// SoftmaxCrossEntropy, Synchronize) poll the stream with a timeout (kSyncTimeout) instead of
// blocking forever on a wedged device.
//
// Phase times. With EDL_CUDA_PHASE_TIMES=1 the backend records CUDA events at the step's phase
// boundaries it can see and logs, when destroyed, the mean GPU milliseconds per training step of
// each phase, skipping 3 warm-up steps. The phases tile the step (from its first upload to the
// next step's first upload), so they sum to it:
//   h2d       first upload of the step .. last upload before the loss (images, labels)
//   forward   .. the loss
//   backward  .. the first upload after the loss (the runtime's in-band write, which comes right
//             after the backward and the gradient scaling)
//   allreduce .. the first SgdUpdate (the in-band write, the gradient all-reduce when it runs on
//             this stream (NCCL), the in-band read-back); 0 when no upload follows the loss
//   update    .. the last SgdUpdate
//   idle      .. the next step's first upload (the GPU waits for the host between steps:
//             loading the next batch, logging, checkpoint hooks)
// An evaluation's uploads between two steps count as the next step's h2d (bench/trainer_gpu.sh
// runs without evaluation). It waits for the previous step's events at the next upload, so it
// costs some overlap; leave it off for throughput figures.
//
// Thread-safety: one thread at a time, like every Backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "resnet50/backend.h"
#include "resnet50/cuda/cuda_kernels.h"

namespace edl::resnet50::cuda {

namespace config {
constexpr size_t kConvWorkspaceCap = size_t{1} << 30;  // cuDNN algorithms needing more are skipped
constexpr std::chrono::seconds kSyncTimeout{600};      // longest host wait for the stream
constexpr int kPinnedSlots = 4;                        // CopyFromHost staging buffers in flight
constexpr float kInitialLossScale = 1024.f;            // fp16 only; grows when clean
constexpr int kGrowthInterval = 2000;                  // fp16: clean steps before S doubles
}  // namespace config

// A device allocation, freed in stream order.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Makes the buffer at least `bytes` long (contents lost when it grows).
  Status Reserve(size_t bytes, cudaStream_t stream);
  void Reset();
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // the stream it was allocated on (not owned)
};

// cuDNN descriptors and chosen algorithms of one convolution shape.
struct ConvPlan {
  ConvPlan() = default;
  ~ConvPlan();
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

// cuDNN descriptors of one batch-norm input shape.
struct BnPlan {
  BnPlan() = default;
  ~BnPlan();
  BnPlan(const BnPlan&) = delete;
  BnPlan& operator=(const BnPlan&) = delete;

  cudnnTensorDescriptor_t x = nullptr, param = nullptr;
  size_t fwd_ws = 0, bwd_ws = 0, reserve = 0;
};

class CudaBackend : public Backend {
 public:
  // Use NewCudaBackend; REQUIRES: options validated there, cuda_device resolved.
  explicit CudaBackend(const BackendOptions& options, Elem act);
  ~CudaBackend() override;
  Status Init();

  std::string name() const override { return "cuda"; }
  bool on_device() const override { return true; }
  void* stream() const override { return stream_; }
  int device_ordinal() const override { return options_.cuda_device; }

  size_t BytesFor(const Shape& shape, Layout layout, DataType dtype) const override;
  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void* AllocateHost(size_t bytes) override;  // cudaMallocHost (page-locked)
  void FreeHost(void* ptr) override;
  void MarkResidentStep() override {
    RecordPhase(kUploadStart);
    RecordPhase(kUploadEnd);
  }
  Status CopyFromHost(const void* src, Tensor* dst) override;
  Status CopyToHost(const Tensor& src, void* dst) override;
  Status Copy(const Tensor& src, Tensor* dst) override;
  Status Fill(Tensor* dst, float value) override;
  Status Scale(Tensor* x, float factor, int64_t offset, int64_t count) override;
  Status Synchronize() override { return WaitStream("Synchronize"); }

  // cudnn_ops.cc
  Status Conv2dForward(const Conv2dParams& p, const Tensor& x, const Tensor& w, Tensor* y) override;
  Status Conv2dBackwardData(const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                            Tensor* dx) override;
  Status Conv2dBackwardFilter(const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                              Tensor* dw) override;
  Status BatchNormForwardTraining(const BatchNormParams& p, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, Tensor* y, Tensor* save_mean,
                                  Tensor* save_invstd, Tensor* running_mean,
                                  Tensor* running_var) override;
  Status BatchNormForwardInference(const BatchNormParams& p, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, const Tensor& running_mean,
                                   const Tensor& running_var, Tensor* y) override;
  Status BatchNormBackward(const BatchNormParams& p, const Tensor& x, const Tensor& dy,
                           const Tensor* y, const Tensor& gamma, const Tensor& save_mean,
                           const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                           Tensor* dbeta) override;

  // cuda_backend.cc
  Status ReluForward(const Tensor& x, Tensor* y) override;
  Status ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) override;
  Status Add(const Tensor& a, const Tensor& b, Tensor* y, bool relu) override;
  Status MaxPool2dForward(const PoolParams& p, const Tensor& x, Tensor* y) override;
  Status MaxPool2dBackward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                           Tensor* dx) override;
  Status GlobalAvgPoolForward(const Tensor& x, Tensor* y) override;
  Status GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) override;
  Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* y) override;
  Status LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                        Tensor* db) override;
  Status SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             float grad_scale, Tensor* dlogits, double* loss_sum,
                             int64_t* correct) override;
  Status SgdUpdate(const SgdParams& p, Tensor* params, const Tensor& grads, Tensor* momentum,
                   int64_t offset, int64_t count) override;

  float loss_scale() const { return loss_scale_; }

  // EDL_CUDA_PHASE_TIMES: GPU ms per step of each phase (see the header comment); the phases sum
  // to step.
  struct PhaseTimes {
    double step = 0, h2d = 0, forward = 0, backward = 0, allreduce = 0, update = 0, idle = 0;
    int steps = 0;
  };
  PhaseTimes phase_times() const { return phase_sum_; }

 private:
  // Scratch slots: one op never uses one slot for two operands.
  enum Slot { kSlotX, kSlotY, kSlotDY, kSlotDX, kSlotW, kSlotTmp, kNumSlots };

  // Physical format of a 4-D tensor (see the header comment).
  Fmt4 FmtOf(const Tensor& t) const;
  Fmt4 native() const { return Fmt4{act_, true}; }
  // *ptr = t's data in the native format: t itself, or a converted copy in scratch `slot`.
  Status InNative(const Tensor& t, Slot slot, const void** ptr);
  // *ptr = where an op writes t in the native format; FinishOut converts it into t if needed.
  Status OutNative(Tensor* t, Slot slot, void** ptr);
  Status FinishOut(Tensor* t, Slot slot);
  Status ScratchFor(Slot slot, size_t bytes, void** ptr);
  // Polls the stream until it drains; Timeout after config::kSyncTimeout.
  Status WaitStream(const char* what);

  // cudnn_ops.cc helpers.
  StatusOr<ConvPlan*> PlanConv(const Conv2dParams& p, const Shape& xs, const Shape& ws,
                               const Shape& ys);
  StatusOr<BnPlan*> PlanBn(const Shape& xs);
  Status PackWeights(const Tensor& w, const void** packed);
  Status EnsureWorkspace(size_t bytes);
  // Gives `bytes` of workspace for an algorithm search (capped; may be less when memory is short).
  size_t SearchWorkspace();
  Status FindForward(ConvPlan* plan, const void* x, const void* w, void* y);
  Status FindBackwardData(ConvPlan* plan, const void* dy, const void* w, void* dx);
  Status FindBackwardFilter(ConvPlan* plan, const void* x, const void* dy, void* dw);
  Status SetMath(cudnnConvolutionDescriptor_t d, cudnnMathType_t found);
  cudnnBatchNormMode_t BnMode() const;

  // Loss scaling (fp16).
  Status UpdateLossScale();
  // Phase events (EDL_CUDA_PHASE_TIMES).
  enum PhaseEvent {
    kUploadStart,
    kUploadEnd,
    kLoss,
    kBackwardEnd,
    kUpdateStart,
    kUpdateEnd,
    kNextStart,  // the next step's first upload: ends this step, then becomes its kUploadStart
    kNumPhaseEvents
  };
  void RecordPhase(PhaseEvent e);
  void CollectPhases();

  const BackendOptions options_;
  const Elem act_;  // compute precision of native activations
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer scratch_[kNumSlots];
  DeviceBuffer workspace_;
  std::unordered_map<std::string, std::unique_ptr<ConvPlan>> conv_plans_;
  std::unordered_map<std::string, std::unique_ptr<BnPlan>> bn_plans_;
  // BN reserve space of each layer's last training forward, keyed by its save_mean buffer.
  std::unordered_map<const void*, std::unique_ptr<DeviceBuffer>> bn_reserve_;

  struct PinnedSlot {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the DMA that reads ptr
  };
  std::vector<PinnedSlot> pinned_;
  size_t next_pinned_ = 0;

  XentResult* xent_dev_ = nullptr;   // device
  XentResult* xent_host_ = nullptr;  // pinned
  int* overflow_dev_ = nullptr;      // device flag: inf/NaN in this step's gradients (fp16)
  int* overflow_host_ = nullptr;     // pinned copy, read at the next loss
  bool grads_checked_ = false;       // the overflow check ran for this step's gradients
  bool update_pending_ = false;      // an SgdUpdate ran since the last loss scale update
  float loss_scale_ = 1.f;
  int clean_steps_ = 0;

  bool phase_on_ = false;
  cudaEvent_t phase_ev_[kNumPhaseEvents] = {};
  int phase_state_ = 0;  // bit i: event i recorded in the current step
  int phase_seen_ = 0;   // training steps seen (the first 3 are not counted)
  PhaseTimes phase_sum_;
};

}  // namespace edl::resnet50::cuda

namespace edl::resnet50 {
// The CUDA backend, inside the CUDA plugin; CreateCudaBackend (resnet50/backend.cc) reaches it
// through the plugin's entry point edl_resnet50_new_cuda_backend_v1.
StatusOr<std::unique_ptr<Backend>> NewCudaBackend(const BackendOptions& options);
}  // namespace edl::resnet50
