// Backend: the device-neutral compute interface the ResNet trainer runs on. One implementation per
// device, with the same op names and signatures (llm.c style): resnet50/cpu/ on oneDNN and
// resnet50/cuda/ on cuDNN/cuBLAS. The model, the optimizer and the tests only talk to this header.
//
// Tensors own device memory (allocated through their Backend) and carry shape, dtype and layout,
// so every op sees its operands' shapes and layouts explicitly; ops CHECK nothing that comes from
// outside and return a Status (a failed library call, an unsupported shape/layout combination).
//
// Layouts. Weights, biases, BN vectors, 2-D tensors and host data are always kNCHW (row-major in
// shape order: NCHW, OIHW, NC, C), so parameters and gradients are identical on every device and
// can live in one flat buffer, be all-reduced and be checkpointed. 4-D activations may use kNative,
// the backend's preferred activation layout (CPU: oneDNN blocked nChw16c/nChw8c; CUDA: the CUDA
// backend's choice, e.g. NHWC). Its storage may be padded: allocate with Backend::BytesFor, convert
// with Backend::Copy. Element-wise ops (BN, ReLU, Add) require all their 4-D operands in one
// layout.
//
// Numerics: fp32 everywhere; reductions (BN statistics, softmax) accumulate in fp32 or wider.
//
// Thread-safety: a Backend and its Tensors are used from one thread at a time. Ops may run
// asynchronously with respect to the host (CUDA: on the backend's stream); CopyToHost, the host
// outputs of SoftmaxCrossEntropy and Synchronize() wait for the work queued before them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"  // edl::runtime::DataType

namespace edl::resnet50 {

using runtime::DataType;
using Shape = std::vector<int64_t>;

enum class Layout {
  kNCHW,    // row-major in shape order (NCHW, OIHW, NC, C); the layout of host data and parameters
  kNHWC,    // channels last (4-D only)
  kNative,  // the backend's preferred 4-D activation layout; possibly padded (see BytesFor)
};
const char* LayoutName(Layout layout);

class Backend;

// ---------------------------------------------------------------------------------------------
// Tensor: a device buffer with shape, dtype and layout. Owning (allocated by the backend, freed by
// the destructor) or a non-owning view into memory somebody else owns (e.g. a slice of the flat
// parameter buffer). Movable, not copyable.
class Tensor {
 public:
  Tensor() = default;
  // Allocates Backend::BytesFor(shape, layout, dtype) bytes of device memory (contents undefined).
  // On allocation failure the tensor is empty (data() == nullptr); check with ok().
  Tensor(Backend* backend, Shape shape, Layout layout = Layout::kNCHW,
         DataType dtype = DataType::kFloat32);
  // A non-owning view of `data` (device memory of `backend`), which must outlive the view.
  static Tensor View(Backend* backend, void* data, Shape shape, Layout layout = Layout::kNCHW,
                     DataType dtype = DataType::kFloat32);
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  bool ok() const { return data_ != nullptr; }
  Backend* backend() const { return backend_; }
  void* raw() const { return data_; }
  float* data() const { return static_cast<float*>(data_); }          // REQUIRES: dtype fp32
  int32_t* data_i32() const { return static_cast<int32_t*>(data_); }  // REQUIRES: dtype int32
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  Layout layout() const { return layout_; }
  DataType dtype() const { return dtype_; }
  int64_t numel() const;                   // product of the shape (logical elements, no padding)
  size_t bytes() const { return bytes_; }  // storage size, including any padding
  std::string DebugString() const;         // "[8,64,56,56] fp32 native"

 private:
  void Release();

  Backend* backend_ = nullptr;  // not owned; outlives every tensor it allocated
  void* data_ = nullptr;
  Shape shape_;
  Layout layout_ = Layout::kNCHW;
  DataType dtype_ = DataType::kFloat32;
  size_t bytes_ = 0;
  bool owned_ = false;
};

// ---------------------------------------------------------------------------------------------
// Op parameters.

struct Conv2dParams {
  int kernel = 3;  // square kernel kernel x kernel
  int stride = 1;
  int pad = 1;  // symmetric zero padding
  // Output spatial size for input size `in`: (in + 2*pad - kernel) / stride + 1.
  int64_t OutSize(int64_t in) const { return (in + 2 * pad - kernel) / stride + 1; }
};

struct PoolParams {
  int kernel = 3;
  int stride = 2;
  int pad = 1;
  int64_t OutSize(int64_t in) const { return (in + 2 * pad - kernel) / stride + 1; }
};

struct BatchNormParams {
  float eps = 1e-5f;
  float momentum = 0.1f;   // running = (1 - momentum) * running + momentum * batch_stat
  bool fuse_relu = false;  // y = relu(bn(x)); the backward then needs y to mask dy
};

struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // L2 added to the gradient: g += weight_decay * p
  bool nesterov = false;
  // PyTorch semantics: g += wd*p; buf = momentum*buf + g; step = nesterov ? g + momentum*buf : buf;
  // p -= lr*step. (Momentum buffers start at zero; buf = g on the first step is equivalent.)
};

struct BackendOptions {
  int threads = 0;  // CPU: compute threads (OpenMP); 0 = all cores. Ignored by CUDA.
  // CUDA: device ordinal (after CUDA_VISIBLE_DEVICES); kAutoCudaDevice: ResolveCudaDevice's
  // default from device_hint. Ignored by CPU.
  int cuda_device = -1;
  int device_hint =
      0;  // CUDA: EnvContract::DeviceHint() (the slot, or LOCAL_RANK), the default device
  // CUDA: compute precision of activations and convolutions: fp32 | bf16 | fp16 (fp16 adds dynamic
  // loss scaling); parameters, gradients and optimizer state stay fp32. Ignored by CPU (fp32).
  std::string precision = "fp32";
};

inline constexpr int kAutoCudaDevice = -1;

// The CUDA device a trainer uses: `requested` (--cuda_device) when it is not kAutoCudaDevice, else
// `hint` (EnvContract::DeviceHint(): the slot under `edl client --slots`, LOCAL_RANK under `edl
// launch --nproc_per_node` or torchrun, each trainer seeing every GPU) modulo the visible devices
// when more than one is visible, else 0 (a trainer that sees one GPU, e.g. through `edl client
// --gpus`). InvalidArgument naming the flag, the visible count and the fix when `requested` is out
// of range or no device is visible.
StatusOr<int> ResolveCudaDevice(int requested, int hint, int visible);

// ---------------------------------------------------------------------------------------------
// Backend. Shapes in comments: N batch, C/K channels, H/W spatial, M output features.
// Output tensors must be pre-allocated with the documented shape (and, for activations, the layout
// the caller wants); ops overwrite them unless stated otherwise.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;              // "cpu" or "cuda"
  virtual bool on_device() const = 0;                // memory is not host-addressable (CUDA)
  virtual void* stream() const { return nullptr; }   // cudaStream_t as void*; nullptr on CPU
  virtual int device_ordinal() const { return -1; }  // CUDA: the device in use; -1 on CPU

  // ---- memory
  // Storage bytes for a tensor of `shape` in `layout` (kNative may pad channels).
  virtual size_t BytesFor(const Shape& shape, Layout layout, DataType dtype) const = 0;
  // Device allocation (aligned to at least 64 bytes); nullptr when out of memory.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Host memory for staging copies to and from the device (CUDA: page-locked, cudaMallocHost;
  // CPU: ordinary memory); nullptr when out of memory. Freed with FreeHost.
  virtual void* AllocateHost(size_t bytes) { return ::operator new(bytes, std::nothrow); }
  virtual void FreeHost(void* ptr) { ::operator delete(ptr); }
  // Raw byte copies between host memory and a tensor's storage (bytes() bytes; no layout change).
  virtual Status CopyFromHost(const void* src, Tensor* dst) = 0;
  virtual Status CopyToHost(const Tensor& src, void* dst) = 0;
  // Device-to-device copy with layout conversion: same shape and dtype, any layouts.
  virtual Status Copy(const Tensor& src, Tensor* dst) = 0;
  // dst[i] = value for every logical element (fp32) or every storage float.
  virtual Status Fill(Tensor* dst, float value) = 0;
  // x *= factor over `count` floats starting at float offset `offset` of x's storage (count < 0:
  // to the end). Used on the flat gradient buffer.
  virtual Status Scale(Tensor* x, float factor, int64_t offset = 0, int64_t count = -1) = 0;
  // Waits until every queued op has finished.
  virtual Status Synchronize() = 0;
  // A training step starts on data already on the device (no CopyFromHost this step): CUDA's
  // phase timing (EDL_CUDA_PHASE_TIMES) starts the step here with an empty h2d phase.
  virtual void MarkResidentStep() {}

  // ---- convolution (no bias; ResNet convs are followed by BN)
  // x [N,C,H,W] (kNCHW or kNative), w [K,C,k,k] kNCHW, y [N,K,OH,OW] (kNative or kNCHW).
  virtual Status Conv2dForward(const Conv2dParams& p, const Tensor& x, const Tensor& w,
                               Tensor* y) = 0;
  // dy [N,K,OH,OW], w [K,C,k,k] -> dx [N,C,H,W].
  virtual Status Conv2dBackwardData(const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                    Tensor* dx) = 0;
  // x [N,C,H,W], dy [N,K,OH,OW] -> dw [K,C,k,k] kNCHW (overwritten).
  virtual Status Conv2dBackwardFilter(const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                      Tensor* dw) = 0;

  // ---- batch normalisation over N,H,W per channel C (x, y [N,C,H,W]; vectors [C] kNCHW)
  // Training: normalises with the batch statistics, writes save_mean / save_invstd
  // (1/sqrt(var+eps), biased variance) for the backward and updates running_mean / running_var in
  // place (running_var with the unbiased variance, as PyTorch). y may alias x.
  virtual Status BatchNormForwardTraining(const BatchNormParams& p, const Tensor& x,
                                          const Tensor& gamma, const Tensor& beta, Tensor* y,
                                          Tensor* save_mean, Tensor* save_invstd,
                                          Tensor* running_mean, Tensor* running_var) = 0;
  // Inference: normalises with running_mean / running_var. y may alias x.
  virtual Status BatchNormForwardInference(const BatchNormParams& p, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           Tensor* y) = 0;
  // Backward of the training forward. dy is d/dy; when p.fuse_relu, `y` (the forward output) masks
  // dy (dy where y > 0) and must be given, else y may be null. Writes dx, dgamma, dbeta [C]
  // (overwritten). dx may alias dy.
  virtual Status BatchNormBackward(const BatchNormParams& p, const Tensor& x, const Tensor& dy,
                                   const Tensor* y, const Tensor& gamma, const Tensor& save_mean,
                                   const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                                   Tensor* dbeta) = 0;

  // ---- element-wise (same shape and layout for all operands; outputs may alias inputs)
  virtual Status ReluForward(const Tensor& x, Tensor* y) = 0;
  // dx = dy where y > 0 else 0 (y is the forward output).
  virtual Status ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) = 0;
  // y = a + b, then relu(y) when `relu` (the residual join).
  virtual Status Add(const Tensor& a, const Tensor& b, Tensor* y, bool relu) = 0;

  // ---- pooling
  // Max pool: x [N,C,H,W] -> y [N,C,OH,OW], same layout.
  virtual Status MaxPool2dForward(const PoolParams& p, const Tensor& x, Tensor* y) = 0;
  // x, y: the forward's input and output; dy [N,C,OH,OW] -> dx [N,C,H,W] (overwritten).
  virtual Status MaxPool2dBackward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, Tensor* dx) = 0;
  // Global average pool: x [N,C,H,W] (any layout) -> y [N,C] kNCHW.
  virtual Status GlobalAvgPoolForward(const Tensor& x, Tensor* y) = 0;
  // dy [N,C] -> dx [N,C,H,W] (dx = dy / (H*W) broadcast; dx's layout as allocated).
  virtual Status GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) = 0;

  // ---- fully connected: y = x w^T + b
  // x [N,K], w [M,K], b [M] -> y [N,M].
  virtual Status LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* y) = 0;
  // dy [N,M] -> dx [N,K] (skipped when null), dw [M,K], db [M] (overwritten).
  virtual Status LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                Tensor* dw, Tensor* db) = 0;

  // ---- loss: softmax cross-entropy with label smoothing eps:
  // target = (1 - eps) * onehot(label) + eps / M; loss_i = -sum_k target_k log softmax(logits_i)_k.
  // logits [N,M], labels [N] int32 in [0, M). Host outputs: *loss_sum = sum_i loss_i, *correct =
  // number of i whose argmax equals the label (both waited for). When dlogits [N,M] is not null it
  // receives grad_scale * (softmax - target) (grad_scale = 1/N for the mean loss).
  virtual Status SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                     float label_smoothing, float grad_scale, Tensor* dlogits,
                                     double* loss_sum, int64_t* correct) = 0;

  // ---- optimizer: one SGD step over `count` floats at float offset `offset` of the flat
  // buffers params, grads and momentum (same offsets in all three; see SgdParams).
  virtual Status SgdUpdate(const SgdParams& p, Tensor* params, const Tensor& grads,
                           Tensor* momentum, int64_t offset, int64_t count) = 0;
};

// Shared precondition of every SgdUpdate: [offset, offset + count) lies inside all three flat
// buffers. InvalidArgument otherwise.
Status CheckSgdRange(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                     int64_t offset, int64_t count);

// Creates the backend `name`: "cpu" (oneDNN) or "cuda" (cuDNN/cuBLAS, from the CUDA plugin
// libedl_cuda.so: FailedPrecondition when the plugin or a CUDA library it needs is missing,
// Unavailable when no GPU can be used).
StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                 const BackendOptions& options);

// Implementations, called by CreateBackend. CreateCudaBackend loads the CUDA plugin
// (edl/runtime/cuda_plugin.h) and calls the backend inside it.
StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options);
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace edl::resnet50
