// Own CUDA kernels of the CUDA backend (cuda_kernels.cu): layout/dtype conversion, element-wise
// ops, pooling, the fully connected layer's bias helpers, softmax cross-entropy and the SGD update.
// cuDNN/cuBLAS do convolution, batch norm and the FC matrix products (cudnn_ops.cc,
// cuda_backend.cc).
//
// Every launcher checks its shape preconditions (CHECK: these are programmer errors; the backend
// validates tensors from callers first), launches on `stream`, and returns cudaGetLastError() so
// the caller turns a failed launch into a Status with its own file:line.
//
// Numerics: storage is fp32, bf16 or fp16 (Elem); every kernel computes in fp32 and rounds once
// on store (round-to-nearest-even). Reductions (pooling sums, softmax) accumulate in fp32 per
// thread/block; the loss sum over rows is accumulated in fp64.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace edl::resnet50::cuda {

enum class Elem { kF32, kBF16, kF16 };
size_t ElemSize(Elem e);
const char* ElemName(Elem e);

// Physical format of a 4-D tensor [n, c, h, w]: element type and NCHW or NHWC order.
struct Fmt4 {
  Elem elem = Elem::kF32;
  bool nhwc = false;
};

// dst = scale * src for a 4-D tensor [n,c,h,w], converting element type and order. Also packs
// OIHW fp32 weights into KRSC (nhwc) and back. src and dst must not overlap.
cudaError_t Convert4d(const void* src, Fmt4 sf, void* dst, Fmt4 df, int64_t n, int64_t c, int64_t h,
                      int64_t w, float scale, cudaStream_t stream);
// dst[0..count) = value.
cudaError_t Fill(void* dst, Elem e, int64_t count, float value, cudaStream_t stream);
// x[0..count) *= factor (fp32).
cudaError_t ScaleF32(float* x, int64_t count, float factor, cudaStream_t stream);

// Element-wise over `count` elements of one type (operands may alias).
cudaError_t Relu(const void* x, void* y, Elem e, int64_t count, cudaStream_t stream);
// dx = y > 0 ? dy : 0.
cudaError_t ReluBackward(const void* y, const void* dy, void* dx, Elem e, int64_t count,
                         cudaStream_t stream);
// y = a + b, then relu(y) when `relu`.
cudaError_t Add(const void* a, const void* b, void* y, Elem e, int64_t count, bool relu,
                cudaStream_t stream);

struct PoolShape {
  int64_t n, c, h, w, oh, ow;
  int kernel, stride, pad;
};
// Max pool x [n,c,h,w] -> y [n,c,oh,ow] (same format); padding never wins (-inf).
cudaError_t MaxPoolForward(const void* x, void* y, Fmt4 f, const PoolShape& s, cudaStream_t stream);
// dx[i] = sum of dy over the windows whose first maximum is x[i] (a gather: no atomics, so the
// result is deterministic). Overwrites dx.
cudaError_t MaxPoolBackward(const void* x, const void* dy, void* dx, Fmt4 f, const PoolShape& s,
                            cudaStream_t stream);
// y [n,c] fp32 = mean of x [n,c,h,w] over h,w.
cudaError_t GlobalAvgPoolForward(const void* x, Fmt4 f, int64_t n, int64_t c, int64_t h, int64_t w,
                                 float* y, cudaStream_t stream);
// dx [n,c,h,w] = dy [n,c] / (h*w), broadcast.
cudaError_t GlobalAvgPoolBackward(const float* dy, void* dx, Fmt4 f, int64_t n, int64_t c,
                                  int64_t h, int64_t w, cudaStream_t stream);

// y [n,m] = b [m] broadcast over rows (the bias before a beta=1 GEMM).
cudaError_t BroadcastRows(const float* b, float* y, int64_t n, int64_t m, cudaStream_t stream);
// db [m] = scale * sum over rows of dy [n,m].
cudaError_t ColumnSum(const float* dy, float* db, int64_t n, int64_t m, float scale,
                      cudaStream_t stream);

// Device-side results of SoftmaxCrossEntropy; zeroed by the launcher before the kernel.
struct XentResult {
  double loss_sum;
  unsigned long long correct;
  int bad_label;  // 1 when some label was outside [0, m)
  int pad;
};
// logits [n,m] fp32, labels [n] int32. Accumulates into *result (device memory). When dlogits is
// not null: dlogits = grad_scale * (softmax - target), target = (1-eps)*onehot + eps/m.
cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t m,
                                float label_smoothing, float grad_scale, float* dlogits,
                                XentResult* result, cudaStream_t stream);

// *flag = 1 when some x[0..count) is inf or NaN (left as is otherwise).
cudaError_t FlagNonFinite(const float* x, int64_t count, int* flag, cudaStream_t stream);
// One SGD step (SgdParams semantics in backend.h) over count floats; a no-op when skip != nullptr
// and *skip != 0 (fp16 overflow: the step is dropped and the loss scale lowered).
cudaError_t SgdUpdate(float* w, const float* g, float* buf, int64_t count, float lr, float momentum,
                      float weight_decay, bool nesterov, const int* skip, cudaStream_t stream);

}  // namespace edl::resnet50::cuda
