// CudaBackend: construction, memory, copies, element-wise ops, pooling, the FC layer on cuBLAS,
// softmax cross-entropy, SGD and the factory. Convolution and batch norm are in cudnn_ops.cc.
// See cuda_backend.h for formats, precision and streams.
#include "resnet50/cuda/cuda_backend.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "edl/runtime/env_contract.h"
#include "resnet50/cuda/cuda_check.h"

namespace edl::resnet50::cuda {

namespace {

Status SameShape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    return Status::InvalidArgument(std::string(op) + ": shape mismatch " + a.DebugString() +
                                   " vs " + b.DebugString());
  }
  return Status::OK();
}

Status Need(bool ok, const char* op, const std::string& what) {
  return ok ? Status::OK() : Status::InvalidArgument(std::string(op) + ": " + what);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DeviceBuffer, plans

Status DeviceBuffer::Reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_ != nullptr) return Status::OK();
  Reset();
  stream_ = stream;
  EDL_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ptr_, std::max<size_t>(bytes, 256), stream));
  bytes_ = std::max<size_t>(bytes, 256);
  return Status::OK();
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  ptr_ = nullptr;
  bytes_ = 0;
}

ConvPlan::~ConvPlan() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (fwd) cudnnDestroyConvolutionDescriptor(fwd);
  if (bwd_data) cudnnDestroyConvolutionDescriptor(bwd_data);
  if (bwd_filter) cudnnDestroyConvolutionDescriptor(bwd_filter);
}

BnPlan::~BnPlan() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (param) cudnnDestroyTensorDescriptor(param);
}

// ---------------------------------------------------------------------------------------------
// Construction

CudaBackend::CudaBackend(const BackendOptions& options, Elem act) : options_(options), act_(act) {}

Status CudaBackend::Init() {
  EDL_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.cuda_device));
  EDL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Keep freed blocks in the stream-ordered pool: activations are re-allocated whenever the
  // batch size changes (elastic re-forms), which must not hit cudaMalloc each time.
  cudaMemPool_t pool;
  EDL_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options_.cuda_device));
  uint64_t keep = UINT64_MAX;
  EDL_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreate(&cudnn_));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnSetStream(cudnn_, stream_));
  EDL_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  EDL_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  // fp32 mode is exact fp32 (parity with the CPU); the mixed-precision modes let the FC use TF32.
  EDL_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      cublas_, act_ == Elem::kF32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_TF32_TENSOR_OP_MATH));
  EDL_CUDA_RETURN_IF_ERROR(cudaMalloc(&xent_dev_, sizeof(XentResult)));
  EDL_CUDA_RETURN_IF_ERROR(cudaMallocHost(&xent_host_, sizeof(XentResult)));
  EDL_CUDA_RETURN_IF_ERROR(cudaMalloc(&overflow_dev_, sizeof(int)));
  EDL_CUDA_RETURN_IF_ERROR(cudaMallocHost(&overflow_host_, sizeof(int)));
  EDL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_dev_, 0, sizeof(int), stream_));
  *overflow_host_ = 0;
  loss_scale_ = act_ == Elem::kF16 ? config::kInitialLossScale : 1.f;
  const char* phases = std::getenv(runtime::env::kCudaPhaseTimes);
  phase_on_ = phases != nullptr && phases[0] == '1';
  for (int i = 0; phase_on_ && i < kNumPhaseEvents; ++i) {
    EDL_CUDA_RETURN_IF_ERROR(cudaEventCreate(&phase_ev_[i]));
  }
  return WaitStream("CUDA backend initialisation");
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.cuda_device);
  if (stream_ != nullptr) {
    Status s = WaitStream("CUDA backend shutdown");
    if (!s.ok()) LOG(ERROR) << s.ToString();
  }
  if (phase_on_) {
    // The last step has no next upload to end it: it is not counted.
    const int n = std::max(1, phase_sum_.steps);
    // One machine-readable line on stderr (bench/trainer_gpu.sh parses it); the phases sum to step.
    std::fprintf(stderr,
                 "EDL_CUDA_PHASE_TIMES steps=%d step_ms=%.3f h2d_ms=%.3f forward_ms=%.3f "
                 "backward_ms=%.3f allreduce_ms=%.3f update_ms=%.3f idle_ms=%.3f\n",
                 phase_sum_.steps, phase_sum_.step / n, phase_sum_.h2d / n, phase_sum_.forward / n,
                 phase_sum_.backward / n, phase_sum_.allreduce / n, phase_sum_.update / n,
                 phase_sum_.idle / n);
    for (cudaEvent_t e : phase_ev_) {
      if (e) cudaEventDestroy(e);
    }
  }
  conv_plans_.clear();
  bn_plans_.clear();
  bn_reserve_.clear();
  for (DeviceBuffer& b : scratch_) b.Reset();
  workspace_.Reset();
  for (PinnedSlot& p : pinned_) {
    if (p.done) cudaEventDestroy(p.done);
    if (p.ptr) cudaFreeHost(p.ptr);
  }
  if (xent_dev_) cudaFree(xent_dev_);
  if (xent_host_) cudaFreeHost(xent_host_);
  if (overflow_dev_) cudaFree(overflow_dev_);
  if (overflow_host_) cudaFreeHost(overflow_host_);
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) {
    cudaStreamSynchronize(stream_);  // the pool frees above are stream-ordered
    cudaStreamDestroy(stream_);
  }
}

Status CudaBackend::WaitStream(const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + config::kSyncTimeout;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return Status::OK();
    if (e != cudaErrorNotReady) return CudaError(e, what, __FILE__, __LINE__);
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      return Status::Timeout(std::string(what) + ": the GPU stream did not drain within " +
                             std::to_string(config::kSyncTimeout.count()) +
                             " s; a kernel or collective is hung (check nvidia-smi and peers)");
    }
    if (now - start < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::microseconds(now - start < std::chrono::milliseconds(10) ? 20 : 200));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Phase times (EDL_CUDA_PHASE_TIMES)

void CudaBackend::RecordPhase(PhaseEvent e) {
  if (!phase_on_) return;
  auto seen = [this](PhaseEvent p) { return (phase_state_ & (1 << p)) != 0; };
  if (e == kUploadStart && seen(kUploadStart)) {
    if (!seen(kUpdateEnd)) return;  // a second upload (labels, in-band words) of one step
    // The previous step is complete: its end is this step's start.
    if (cudaEventRecord(phase_ev_[kNextStart], stream_) != cudaSuccess) return;
    phase_state_ |= 1 << kNextStart;
    CollectPhases();
    std::swap(phase_ev_[kUploadStart], phase_ev_[kNextStart]);
    phase_state_ = 1 << kUploadStart;
    return;
  }
  if (e == kUploadEnd && seen(kLoss)) {
    // An upload after the loss (the runtime's in-band write): the backward pass is over.
    if (seen(kBackwardEnd)) return;
    e = kBackwardEnd;
  }
  if (e == kUpdateStart && seen(kUpdateStart)) return;  // only the first
  if (cudaEventRecord(phase_ev_[e], stream_) == cudaSuccess) phase_state_ |= 1 << e;
}

void CudaBackend::CollectPhases() {
  const int need = (1 << kUploadStart) | (1 << kUploadEnd) | (1 << kLoss) | (1 << kUpdateStart) |
                   (1 << kUpdateEnd) | (1 << kNextStart);
  if ((phase_state_ & need) == need && cudaEventSynchronize(phase_ev_[kNextStart]) == cudaSuccess &&
      ++phase_seen_ > 3) {
    auto ms = [this](PhaseEvent a, PhaseEvent b) {
      float t = 0;
      return cudaEventElapsedTime(&t, phase_ev_[a], phase_ev_[b]) == cudaSuccess ? double{t} : 0.0;
    };
    const bool split = (phase_state_ & (1 << kBackwardEnd)) != 0;
    phase_sum_.step += ms(kUploadStart, kNextStart);
    phase_sum_.h2d += ms(kUploadStart, kUploadEnd);
    phase_sum_.forward += ms(kUploadEnd, kLoss);
    phase_sum_.backward += ms(kLoss, split ? kBackwardEnd : kUpdateStart);
    phase_sum_.allreduce += split ? ms(kBackwardEnd, kUpdateStart) : 0.0;
    phase_sum_.update += ms(kUpdateStart, kUpdateEnd);
    phase_sum_.idle += ms(kUpdateEnd, kNextStart);
    ++phase_sum_.steps;
  }
  cudaGetLastError();
  phase_state_ = 0;
}

// ---------------------------------------------------------------------------------------------
// Formats and scratch

Fmt4 CudaBackend::FmtOf(const Tensor& t) const {
  if (t.rank() == 4 && t.dtype() == DataType::kFloat32) {
    if (t.layout() == Layout::kNative) return native();
    if (t.layout() == Layout::kNHWC) return Fmt4{Elem::kF32, true};
  }
  return Fmt4{Elem::kF32, false};
}

size_t CudaBackend::BytesFor(const Shape& shape, Layout layout, DataType dtype) const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (shape.size() == 4 && layout == Layout::kNative && dtype == DataType::kFloat32) {
    return static_cast<size_t>(n) * ElemSize(act_);
  }
  return static_cast<size_t>(n) * runtime::DataTypeSize(dtype);
}

void* CudaBackend::Allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, std::max<size_t>(bytes, 256), stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    LOG(WARNING) << "CUDA backend: cannot allocate " << bytes
                 << " bytes: " << cudaGetErrorString(e);
    return nullptr;
  }
  return p;
}

void CudaBackend::Free(void* ptr) {
  if (ptr != nullptr) cudaFreeAsync(ptr, stream_);
}

void* CudaBackend::AllocateHost(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    LOG(WARNING) << "CUDA backend: cannot allocate " << bytes
                 << " bytes of pinned host memory: " << cudaGetErrorString(e);
    return nullptr;
  }
  return p;
}

void CudaBackend::FreeHost(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

Status CudaBackend::ScratchFor(Slot slot, size_t bytes, void** ptr) {
  EDL_RETURN_IF_ERROR(scratch_[slot].Reserve(bytes, stream_));
  *ptr = scratch_[slot].get();
  return Status::OK();
}

Status CudaBackend::InNative(const Tensor& t, Slot slot, const void** ptr) {
  const Fmt4 f = FmtOf(t);
  if (t.rank() != 4)
    return Status::InvalidArgument("expected a 4-D tensor, got " + t.DebugString());
  if (f.elem == act_ && f.nhwc) {
    *ptr = t.raw();
    return Status::OK();
  }
  void* s = nullptr;
  EDL_RETURN_IF_ERROR(ScratchFor(slot, t.numel() * ElemSize(act_), &s));
  EDL_CUDA_RETURN_IF_ERROR(
      Convert4d(t.raw(), f, s, native(), t.dim(0), t.dim(1), t.dim(2), t.dim(3), 1.f, stream_));
  *ptr = s;
  return Status::OK();
}

Status CudaBackend::OutNative(Tensor* t, Slot slot, void** ptr) {
  const Fmt4 f = FmtOf(*t);
  if (t->rank() != 4)
    return Status::InvalidArgument("expected a 4-D tensor, got " + t->DebugString());
  if (f.elem == act_ && f.nhwc) {
    *ptr = t->raw();
    return Status::OK();
  }
  return ScratchFor(slot, t->numel() * ElemSize(act_), ptr);
}

Status CudaBackend::FinishOut(Tensor* t, Slot slot) {
  const Fmt4 f = FmtOf(*t);
  if (f.elem == act_ && f.nhwc) return Status::OK();
  EDL_CUDA_RETURN_IF_ERROR(Convert4d(scratch_[slot].get(), native(), t->raw(), f, t->dim(0),
                                     t->dim(1), t->dim(2), t->dim(3), 1.f, stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Copies

Status CudaBackend::CopyFromHost(const void* src, Tensor* dst) {
  const size_t bytes = dst->bytes();
  if (bytes == 0) return Status::OK();
  // Take the next ring slot; wait (bounded) for its previous DMA when the ring is full.
  if (pinned_.size() < static_cast<size_t>(config::kPinnedSlots)) {
    pinned_.emplace_back();
    EDL_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&pinned_.back().done, cudaEventDisableTiming));
    next_pinned_ = pinned_.size() - 1;
  }
  PinnedSlot& slot = pinned_[next_pinned_];
  next_pinned_ = (next_pinned_ + 1) % config::kPinnedSlots;
  const auto deadline = std::chrono::steady_clock::now() + config::kSyncTimeout;
  for (;;) {
    const cudaError_t e = cudaEventQuery(slot.done);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady)
      return CudaError(e, "cudaEventQuery(pinned slot)", __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Timeout("CopyFromHost: the previous upload did not finish; the GPU is hung");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (slot.bytes < bytes) {
    if (slot.ptr != nullptr) EDL_CUDA_RETURN_IF_ERROR(cudaFreeHost(slot.ptr));
    slot.ptr = nullptr;
    slot.bytes = 0;
    EDL_CUDA_RETURN_IF_ERROR(cudaMallocHost(&slot.ptr, bytes));
    slot.bytes = bytes;
  }
  std::memcpy(slot.ptr, src, bytes);
  RecordPhase(kUploadStart);
  EDL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst->raw(), slot.ptr, bytes, cudaMemcpyHostToDevice, stream_));
  EDL_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.done, stream_));
  RecordPhase(kUploadEnd);
  return Status::OK();
}

Status CudaBackend::CopyToHost(const Tensor& src, void* dst) {
  if (src.bytes() == 0) return Status::OK();
  EDL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
  return WaitStream("CopyToHost");
}

Status CudaBackend::Copy(const Tensor& src, Tensor* dst) {
  EDL_RETURN_IF_ERROR(SameShape("Copy", src, *dst));
  EDL_RETURN_IF_ERROR(Need(src.dtype() == dst->dtype(), "Copy", "dtype mismatch"));
  const Fmt4 sf = FmtOf(src), df = FmtOf(*dst);
  if (src.rank() == 4 && (sf.elem != df.elem || sf.nhwc != df.nhwc)) {
    EDL_CUDA_RETURN_IF_ERROR(Convert4d(src.raw(), sf, dst->raw(), df, src.dim(0), src.dim(1),
                                       src.dim(2), src.dim(3), 1.f, stream_));
    return Status::OK();
  }
  if (src.raw() == dst->raw()) return Status::OK();
  EDL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->raw(), src.raw(),
                                           std::min(src.bytes(), dst->bytes()),
                                           cudaMemcpyDeviceToDevice, stream_));
  return Status::OK();
}

Status CudaBackend::Fill(Tensor* dst, float value) {
  if (dst->dtype() == DataType::kInt32 || dst->dtype() == DataType::kFloat32) {
    const Fmt4 f = FmtOf(*dst);
    const int64_t count = static_cast<int64_t>(dst->bytes() / ElemSize(f.elem));
    EDL_CUDA_RETURN_IF_ERROR(cuda::Fill(dst->raw(), f.elem, count, value, stream_));
    return Status::OK();
  }
  return Status::InvalidArgument("Fill: unsupported dtype of " + dst->DebugString());
}

Status CudaBackend::Scale(Tensor* x, float factor, int64_t offset, int64_t count) {
  if (FmtOf(*x).elem != Elem::kF32 || x->dtype() != DataType::kFloat32) {
    return Status::InvalidArgument("Scale: needs an fp32 tensor, got " + x->DebugString());
  }
  const int64_t storage = static_cast<int64_t>(x->bytes() / sizeof(float));
  if (count < 0) count = storage - offset;
  if (offset < 0 || offset + count > storage) {
    return Status::InvalidArgument("Scale: range [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + count) + ") outside " +
                                   x->DebugString());
  }
  EDL_CUDA_RETURN_IF_ERROR(ScaleF32(x->data() + offset, count, factor, stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Element-wise (one format for all operands)

namespace {
bool SameFmt(Fmt4 a, Fmt4 b) { return a.elem == b.elem && a.nhwc == b.nhwc; }
}  // namespace

Status CudaBackend::ReluForward(const Tensor& x, Tensor* y) {
  EDL_RETURN_IF_ERROR(SameShape("ReluForward", x, *y));
  EDL_RETURN_IF_ERROR(Need(SameFmt(FmtOf(x), FmtOf(*y)), "ReluForward", "layouts differ"));
  EDL_CUDA_RETURN_IF_ERROR(Relu(x.raw(), y->raw(), FmtOf(x).elem, x.numel(), stream_));
  return Status::OK();
}

Status CudaBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  EDL_RETURN_IF_ERROR(SameShape("ReluBackward", y, dy));
  EDL_RETURN_IF_ERROR(SameShape("ReluBackward", y, *dx));
  EDL_RETURN_IF_ERROR(Need(SameFmt(FmtOf(y), FmtOf(dy)) && SameFmt(FmtOf(y), FmtOf(*dx)),
                           "ReluBackward", "layouts differ"));
  EDL_CUDA_RETURN_IF_ERROR(
      cuda::ReluBackward(y.raw(), dy.raw(), dx->raw(), FmtOf(y).elem, y.numel(), stream_));
  return Status::OK();
}

Status CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor* y, bool relu) {
  EDL_RETURN_IF_ERROR(SameShape("Add", a, b));
  EDL_RETURN_IF_ERROR(SameShape("Add", a, *y));
  EDL_RETURN_IF_ERROR(
      Need(SameFmt(FmtOf(a), FmtOf(b)) && SameFmt(FmtOf(a), FmtOf(*y)), "Add", "layouts differ"));
  EDL_CUDA_RETURN_IF_ERROR(
      cuda::Add(a.raw(), b.raw(), y->raw(), FmtOf(a).elem, a.numel(), relu, stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Pooling (own kernels: any format, deterministic max-pool backward)

Status CudaBackend::MaxPool2dForward(const PoolParams& p, const Tensor& x, Tensor* y) {
  EDL_RETURN_IF_ERROR(Need(x.rank() == 4 && y->rank() == 4 && x.dim(0) == y->dim(0) &&
                               x.dim(1) == y->dim(1) && y->dim(2) == p.OutSize(x.dim(2)) &&
                               y->dim(3) == p.OutSize(x.dim(3)),
                           "MaxPool2dForward", x.DebugString() + " -> " + y->DebugString()));
  EDL_RETURN_IF_ERROR(Need(SameFmt(FmtOf(x), FmtOf(*y)), "MaxPool2dForward", "layouts differ"));
  EDL_RETURN_IF_ERROR(Need(p.kernel > 0 && p.stride > 0 && p.pad >= 0 && p.pad < p.kernel,
                           "MaxPool2dForward", "bad kernel/stride/pad"));
  const PoolShape s{x.dim(0),  x.dim(1), x.dim(2), x.dim(3), y->dim(2),
                    y->dim(3), p.kernel, p.stride, p.pad};
  EDL_CUDA_RETURN_IF_ERROR(cuda::MaxPoolForward(x.raw(), y->raw(), FmtOf(x), s, stream_));
  return Status::OK();
}

Status CudaBackend::MaxPool2dBackward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                      const Tensor& dy, Tensor* dx) {
  EDL_RETURN_IF_ERROR(SameShape("MaxPool2dBackward", x, *dx));
  EDL_RETURN_IF_ERROR(SameShape("MaxPool2dBackward", y, dy));
  EDL_RETURN_IF_ERROR(
      Need(x.rank() == 4 && y.dim(2) == p.OutSize(x.dim(2)) && y.dim(3) == p.OutSize(x.dim(3)),
           "MaxPool2dBackward", "output size does not match the pool"));
  EDL_RETURN_IF_ERROR(Need(SameFmt(FmtOf(x), FmtOf(dy)) && SameFmt(FmtOf(x), FmtOf(*dx)),
                           "MaxPool2dBackward", "layouts differ"));
  EDL_RETURN_IF_ERROR(Need(p.kernel > 0 && p.stride > 0 && p.pad >= 0 && p.pad < p.kernel,
                           "MaxPool2dBackward", "bad kernel/stride/pad"));
  const PoolShape s{x.dim(0), x.dim(1), x.dim(2), x.dim(3), y.dim(2),
                    y.dim(3), p.kernel, p.stride, p.pad};
  EDL_CUDA_RETURN_IF_ERROR(
      cuda::MaxPoolBackward(x.raw(), dy.raw(), dx->raw(), FmtOf(x), s, stream_));
  return Status::OK();
}

Status CudaBackend::GlobalAvgPoolForward(const Tensor& x, Tensor* y) {
  EDL_RETURN_IF_ERROR(Need(x.rank() == 4 && y->rank() == 2 && y->dim(0) == x.dim(0) &&
                               y->dim(1) == x.dim(1) && FmtOf(*y).elem == Elem::kF32,
                           "GlobalAvgPoolForward", x.DebugString() + " -> " + y->DebugString()));
  EDL_CUDA_RETURN_IF_ERROR(cuda::GlobalAvgPoolForward(x.raw(), FmtOf(x), x.dim(0), x.dim(1),
                                                      x.dim(2), x.dim(3), y->data(), stream_));
  return Status::OK();
}

Status CudaBackend::GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) {
  EDL_RETURN_IF_ERROR(
      Need(dx->rank() == 4 && dy.rank() == 2 && dy.dim(0) == dx->dim(0) && dy.dim(1) == dx->dim(1),
           "GlobalAvgPoolBackward", dy.DebugString() + " -> " + dx->DebugString()));
  EDL_CUDA_RETURN_IF_ERROR(cuda::GlobalAvgPoolBackward(
      dy.data(), dx->raw(), FmtOf(*dx), dx->dim(0), dx->dim(1), dx->dim(2), dx->dim(3), stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Fully connected on cuBLAS. Row-major x [N,K] is column-major x^T (K x N, ld K); likewise
// w [M,K] is w^T (K x M, ld K) and y [N,M] is y^T (M x N, ld M). So
//   y^T  = w x^T        -> gemm(T, N, M, N, K, w, x)      (after y = broadcast(b), beta = 1)
//   dx^T = w^T dy^T     -> gemm(N, N, K, N, M, w, dy)
//   dw^T = x^T dy       -> gemm(N, T, K, M, N, x, dy)     (alpha = 1/loss_scale)

Status CudaBackend::LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* y) {
  EDL_RETURN_IF_ERROR(Need(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1) &&
                               b.numel() == w.dim(0) && y->rank() == 2 && y->dim(0) == x.dim(0) &&
                               y->dim(1) == w.dim(0),
                           "LinearForward", x.DebugString() + " x " + w.DebugString()));
  const int n = static_cast<int>(x.dim(0)), k = static_cast<int>(x.dim(1)),
            m = static_cast<int>(w.dim(0));
  EDL_CUDA_RETURN_IF_ERROR(BroadcastRows(b.data(), y->data(), n, m, stream_));
  const float one = 1.f;
  EDL_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data(),
                                         k, x.data(), k, &one, y->data(), m));
  return Status::OK();
}

Status CudaBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                   Tensor* dw, Tensor* db) {
  EDL_RETURN_IF_ERROR(Need(x.rank() == 2 && w.rank() == 2 && dy.rank() == 2 &&
                               x.dim(1) == w.dim(1) && dy.dim(0) == x.dim(0) &&
                               dy.dim(1) == w.dim(0) && dw->shape() == w.shape() &&
                               db->numel() == w.dim(0),
                           "LinearBackward", x.DebugString() + ", " + dy.DebugString()));
  const int n = static_cast<int>(x.dim(0)), k = static_cast<int>(x.dim(1)),
            m = static_cast<int>(w.dim(0));
  const float one = 1.f, zero = 0.f, unscale = 1.f / loss_scale_;
  if (dx != nullptr) {
    EDL_RETURN_IF_ERROR(SameShape("LinearBackward dx", x, *dx));
    EDL_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, &one,
                                           w.data(), k, dy.data(), m, &zero, dx->data(), k));
  }
  EDL_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, &unscale,
                                         x.data(), k, dy.data(), m, &zero, dw->data(), k));
  EDL_CUDA_RETURN_IF_ERROR(ColumnSum(dy.data(), db->data(), n, m, unscale, stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Loss, loss scale, optimizer

Status CudaBackend::UpdateLossScale() {
  // *overflow_host_ was copied after the last step's gradient check; the wait in the caller's
  // previous SoftmaxCrossEntropy or this one's made it valid.
  if (!update_pending_) return Status::OK();
  update_pending_ = false;
  if (*overflow_host_ != 0) {
    loss_scale_ = std::max(1.f, loss_scale_ / 2);
    clean_steps_ = 0;
    LOG(WARNING) << "fp16: inf/NaN gradients, step skipped; loss scale lowered to " << loss_scale_;
  } else if (++clean_steps_ >= config::kGrowthInterval) {
    loss_scale_ = std::min(loss_scale_ * 2, 16777216.f);
    clean_steps_ = 0;
  }
  *overflow_host_ = 0;
  EDL_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_dev_, 0, sizeof(int), stream_));
  return Status::OK();
}

Status CudaBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                        float label_smoothing, float grad_scale, Tensor* dlogits,
                                        double* loss_sum, int64_t* correct) {
  if (logits.rank() != 2 || labels.numel() != logits.dim(0) || labels.dtype() != DataType::kInt32 ||
      FmtOf(logits).elem != Elem::kF32) {
    return Status::InvalidArgument("SoftmaxCrossEntropy: logits " + logits.DebugString() +
                                   " and labels " + labels.DebugString() + " do not match");
  }
  if (dlogits != nullptr) EDL_RETURN_IF_ERROR(SameShape("SoftmaxCrossEntropy", logits, *dlogits));
  const bool backward = dlogits != nullptr;
  if (backward && act_ == Elem::kF16) {
    EDL_RETURN_IF_ERROR(WaitStream("SoftmaxCrossEntropy (loss scale)"));
    EDL_RETURN_IF_ERROR(UpdateLossScale());
  }
  if (backward) RecordPhase(kLoss);
  const int64_t n = logits.dim(0), m = logits.dim(1);
  const float scale = backward ? grad_scale * loss_scale_ : grad_scale;
  EDL_CUDA_RETURN_IF_ERROR(
      cuda::SoftmaxCrossEntropy(logits.data(), labels.data_i32(), n, m, label_smoothing, scale,
                                backward ? dlogits->data() : nullptr, xent_dev_, stream_));
  EDL_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(xent_host_, xent_dev_, sizeof(XentResult), cudaMemcpyDeviceToHost, stream_));
  EDL_RETURN_IF_ERROR(WaitStream("SoftmaxCrossEntropy"));
  if (xent_host_->bad_label != 0) {
    return Status::InvalidArgument("SoftmaxCrossEntropy: a label is outside [0, " +
                                   std::to_string(m) + "); check the dataset's class count");
  }
  if (backward) grads_checked_ = false;
  *loss_sum = xent_host_->loss_sum;
  *correct = static_cast<int64_t>(xent_host_->correct);
  return Status::OK();
}

Status CudaBackend::SgdUpdate(const SgdParams& p, Tensor* params, const Tensor& grads,
                              Tensor* momentum, int64_t offset, int64_t count) {
  EDL_RETURN_IF_ERROR(CheckSgdRange(*params, grads, *momentum, offset, count));
  RecordPhase(kUpdateStart);
  const int* skip = nullptr;
  if (act_ == Elem::kF16) {
    if (!grads_checked_) {  // first update of this step: check the whole gradient buffer once
      EDL_CUDA_RETURN_IF_ERROR(FlagNonFinite(grads.data(),
                                             static_cast<int64_t>(grads.bytes() / sizeof(float)),
                                             overflow_dev_, stream_));
      EDL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(overflow_host_, overflow_dev_, sizeof(int),
                                               cudaMemcpyDeviceToHost, stream_));
      grads_checked_ = true;
      update_pending_ = true;
    }
    skip = overflow_dev_;
  }
  EDL_CUDA_RETURN_IF_ERROR(cuda::SgdUpdate(params->data() + offset, grads.data() + offset,
                                           momentum->data() + offset, count, p.lr, p.momentum,
                                           p.weight_decay, p.nesterov, skip, stream_));
  RecordPhase(kUpdateEnd);
  return Status::OK();
}

}  // namespace edl::resnet50::cuda

// ---------------------------------------------------------------------------------------------
// Factory: the plugin's entry point behind CreateCudaBackend (resnet50/backend.cc).

namespace edl::resnet50 {

StatusOr<std::unique_ptr<Backend>> NewCudaBackend(const BackendOptions& options) {
  cuda::Elem act;
  if (options.precision == "fp32") {
    act = cuda::Elem::kF32;
  } else if (options.precision == "bf16") {
    act = cuda::Elem::kBF16;
  } else if (options.precision == "fp16") {
    act = cuda::Elem::kF16;
  } else {
    return Status::InvalidArgument("--precision '" + options.precision +
                                   "' is unknown; use fp32, bf16 or fp16");
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unavailable(
        std::string("--device cuda: no usable GPU (") +
        (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                          : std::string("no device visible")) +
        "); check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES, or use --device cpu");
  }
  auto device = ResolveCudaDevice(options.cuda_device, options.device_hint, count);
  if (!device.ok()) return device.status();
  BackendOptions resolved = options;
  resolved.cuda_device = device.value();
  auto backend = std::make_unique<cuda::CudaBackend>(resolved, act);
  EDL_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace edl::resnet50

extern "C" __attribute__((visibility("default"))) void edl_resnet50_new_cuda_backend_v1(
    const edl::resnet50::BackendOptions* options,
    edl::StatusOr<std::unique_ptr<edl::resnet50::Backend>>* out) {
  *out = edl::resnet50::NewCudaBackend(*options);
}
