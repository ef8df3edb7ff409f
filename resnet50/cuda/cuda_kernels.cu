// Own CUDA kernels of the CUDA backend; see cuda_kernels.h for the contracts and numerics.
// Kept to one translation unit with few template instantiations (3 element types) so nvcc stays
// quick on the 2-core CI machine.
#include "resnet50/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <glog/logging.h>

#include <algorithm>
#include <cfloat>

namespace edl::resnet50::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b, 65535LL * 16)));
}

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromF<__half>(float x) {
  return __float2half_rn(x);
}

// Grid-stride loop over [0, n).
#define EDL_KERNEL_LOOP(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Offset of element (n, c, h, w) of a [N, C, H, W] tensor in NCHW or NHWC order.
__device__ __forceinline__ int64_t Offset(bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w,
                                          int64_t C, int64_t H, int64_t W) {
  return nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// Calls body.template operator()<T>() with T the C++ type of `e`.
template <typename F>
cudaError_t Dispatch(Elem e, F&& body) {
  switch (e) {
    case Elem::kF32:
      body(float{});
      break;
    case Elem::kBF16:
      body(__nv_bfloat16{});
      break;
    case Elem::kF16:
      body(__half{});
      break;
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Conversion and fill

template <typename S, typename D>
__global__ void Convert4dKernel(const S* src, bool snhwc, D* dst, bool dnhwc, int64_t N, int64_t C,
                                int64_t H, int64_t W, float scale) {
  const int64_t total = N * C * H * W;
  EDL_KERNEL_LOOP(i, total) {
    // i enumerates dst in its own order, so stores are coalesced.
    int64_t n, c, h, w, r = i;
    if (dnhwc) {
      c = r % C;
      r /= C;
      w = r % W;
      r /= W;
      h = r % H;
      n = r / H;
    } else {
      w = r % W;
      r /= W;
      h = r % H;
      r /= H;
      c = r % C;
      n = r / C;
    }
    dst[i] = FromF<D>(scale * ToF(src[Offset(snhwc, n, c, h, w, C, H, W)]));
  }
}

template <typename T>
__global__ void FillKernel(T* dst, int64_t count, float value) {
  const T v = FromF<T>(value);
  EDL_KERNEL_LOOP(i, count) dst[i] = v;
}

__global__ void ScaleKernel(float* x, int64_t count, float factor) {
  EDL_KERNEL_LOOP(i, count) x[i] *= factor;
}

// ---------------------------------------------------------------------------------------------
// Element-wise

template <typename T>
__global__ void ReluKernel(const T* x, T* y, int64_t count) {
  EDL_KERNEL_LOOP(i, count) y[i] = FromF<T>(fmaxf(ToF(x[i]), 0.f));
}

template <typename T>
__global__ void ReluBackwardKernel(const T* y, const T* dy, T* dx, int64_t count) {
  EDL_KERNEL_LOOP(i, count) dx[i] = ToF(y[i]) > 0.f ? dy[i] : FromF<T>(0.f);
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* y, int64_t count, bool relu) {
  EDL_KERNEL_LOOP(i, count) {
    const float v = ToF(a[i]) + ToF(b[i]);
    y[i] = FromF<T>(relu ? fmaxf(v, 0.f) : v);
  }
}

// ---------------------------------------------------------------------------------------------
// Pooling

template <typename T>
__global__ void MaxPoolForwardKernel(const T* x, T* y, bool nhwc, PoolShape s) {
  const int64_t total = s.n * s.c * s.oh * s.ow;
  EDL_KERNEL_LOOP(i, total) {
    int64_t n, c, oh, ow, r = i;
    if (nhwc) {
      c = r % s.c;
      r /= s.c;
      ow = r % s.ow;
      r /= s.ow;
      oh = r % s.oh;
      n = r / s.oh;
    } else {
      ow = r % s.ow;
      r /= s.ow;
      oh = r % s.oh;
      r /= s.oh;
      c = r % s.c;
      n = r / s.c;
    }
    float best = -FLT_MAX;
    for (int kh = 0; kh < s.kernel; ++kh) {
      const int64_t h = oh * s.stride - s.pad + kh;
      if (h < 0 || h >= s.h) continue;
      for (int kw = 0; kw < s.kernel; ++kw) {
        const int64_t w = ow * s.stride - s.pad + kw;
        if (w < 0 || w >= s.w) continue;
        best = fmaxf(best, ToF(x[Offset(nhwc, n, c, h, w, s.c, s.h, s.w)]));
      }
    }
    y[Offset(nhwc, n, c, oh, ow, s.c, s.oh, s.ow)] = FromF<T>(best);
  }
}

__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Index (h * W + w) of the first maximum of window (oh, ow).
template <typename T>
__device__ int64_t ArgMaxOfWindow(const T* x, bool nhwc, const PoolShape& s, int64_t n, int64_t c,
                                  int64_t oh, int64_t ow) {
  float best = -FLT_MAX;
  int64_t arg = -1;
  for (int kh = 0; kh < s.kernel; ++kh) {
    const int64_t h = oh * s.stride - s.pad + kh;
    if (h < 0 || h >= s.h) continue;
    for (int kw = 0; kw < s.kernel; ++kw) {
      const int64_t w = ow * s.stride - s.pad + kw;
      if (w < 0 || w >= s.w) continue;
      const float v = ToF(x[Offset(nhwc, n, c, h, w, s.c, s.h, s.w)]);
      if (arg < 0 || v > best) {
        best = v;
        arg = h * s.w + w;
      }
    }
  }
  return arg;
}

template <typename T>
__global__ void MaxPoolBackwardKernel(const T* x, const T* dy, T* dx, bool nhwc, PoolShape s) {
  const int64_t total = s.n * s.c * s.h * s.w;
  EDL_KERNEL_LOOP(i, total) {
    int64_t n, c, h, w, r = i;
    if (nhwc) {
      c = r % s.c;
      r /= s.c;
      w = r % s.w;
      r /= s.w;
      h = r % s.h;
      n = r / s.h;
    } else {
      w = r % s.w;
      r /= s.w;
      h = r % s.h;
      r /= s.h;
      c = r % s.c;
      n = r / s.c;
    }
    // Windows (oh, ow) with oh*stride - pad <= h < oh*stride - pad + kernel.
    const int64_t oh_lo = Max64(0, (h + s.pad - s.kernel + s.stride) / s.stride);
    const int64_t oh_hi = Min64(s.oh - 1, (h + s.pad) / s.stride);
    const int64_t ow_lo = Max64(0, (w + s.pad - s.kernel + s.stride) / s.stride);
    const int64_t ow_hi = Min64(s.ow - 1, (w + s.pad) / s.stride);
    float grad = 0.f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        if (ArgMaxOfWindow(x, nhwc, s, n, c, oh, ow) == h * s.w + w) {
          grad += ToF(dy[Offset(nhwc, n, c, oh, ow, s.c, s.oh, s.ow)]);
        }
      }
    }
    dx[Offset(nhwc, n, c, h, w, s.c, s.h, s.w)] = FromF<T>(grad);
  }
}

// One thread per (n, c); in NHWC neighbouring threads read neighbouring channels (coalesced).
template <typename T>
__global__ void GapForwardKernel(const T* x, bool nhwc, int64_t N, int64_t C, int64_t H, int64_t W,
                                 float* y) {
  EDL_KERNEL_LOOP(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float sum = 0.f;
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t w = 0; w < W; ++w) sum += ToF(x[Offset(nhwc, n, c, h, w, C, H, W)]);
    }
    y[i] = sum / static_cast<float>(H * W);
  }
}

template <typename T>
__global__ void GapBackwardKernel(const float* dy, T* dx, bool nhwc, int64_t N, int64_t C,
                                  int64_t H, int64_t W) {
  const float inv = 1.f / static_cast<float>(H * W);
  EDL_KERNEL_LOOP(i, N * C * H * W) {
    int64_t n, c, r = i;
    if (nhwc) {
      c = r % C;
      n = r / (C * H * W);
    } else {
      r /= H * W;
      c = r % C;
      n = r / C;
    }
    dx[i] = FromF<T>(dy[n * C + c] * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// Fully connected helpers

__global__ void BroadcastRowsKernel(const float* b, float* y, int64_t n, int64_t m) {
  EDL_KERNEL_LOOP(i, n * m) y[i] = b[i % m];
}

__global__ void ColumnSumKernel(const float* dy, float* db, int64_t n, int64_t m, float scale) {
  EDL_KERNEL_LOOP(j, m) {
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) sum += dy[i * m + j];
    db[j] = scale * sum;
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy: one block per row.

__global__ void XentKernel(const float* logits, const int32_t* labels, int64_t m, float eps,
                           float grad_scale, float* dlogits, XentResult* result) {
  __shared__ float s_val[kThreads];
  __shared__ int64_t s_idx[kThreads];
  __shared__ float s_sum[kThreads];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * m;
  const int t = threadIdx.x;
  // Max and first argmax.
  float best = -FLT_MAX;
  int64_t arg = m;
  for (int64_t k = t; k < m; k += blockDim.x) {
    if (z[k] > best) {
      best = z[k];
      arg = k;
    }
  }
  s_val[t] = best;
  s_idx[t] = arg;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      const float ov = s_val[t + stride];
      const int64_t oi = s_idx[t + stride];
      if (ov > s_val[t] || (ov == s_val[t] && oi < s_idx[t])) {
        s_val[t] = ov;
        s_idx[t] = oi;
      }
    }
    __syncthreads();
  }
  const float mx = s_val[0];
  const int64_t argmax = s_idx[0];
  __syncthreads();
  // Sum of exp(z - max) and sum of z.
  float se = 0.f, sz = 0.f;
  for (int64_t k = t; k < m; k += blockDim.x) {
    se += __expf(z[k] - mx);
    sz += z[k];
  }
  s_val[t] = se;
  s_sum[t] = sz;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      s_val[t] += s_val[t + stride];
      s_sum[t] += s_sum[t + stride];
    }
    __syncthreads();
  }
  const float lse = mx + logf(s_val[0]);
  const int32_t label = labels[row];
  const bool bad = label < 0 || label >= m;
  if (t == 0) {
    if (bad) {
      atomicExch(&result->bad_label, 1);
    } else {
      // loss = lse - (1-eps) z_label - eps/m * sum_k z_k
      const double loss = static_cast<double>(lse) - (1.0 - eps) * z[label] -
                          static_cast<double>(eps) / m * s_sum[0];
      atomicAdd(&result->loss_sum, loss);
      if (argmax == label) atomicAdd(&result->correct, 1ULL);
    }
  }
  if (dlogits != nullptr) {
    const float off = eps / static_cast<float>(m);
    for (int64_t k = t; k < m; k += blockDim.x) {
      const float target = off + (k == label ? 1.f - eps : 0.f);
      dlogits[row * m + k] = bad ? 0.f : grad_scale * (__expf(z[k] - lse) - target);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer

__global__ void NonFiniteKernel(const float* x, int64_t count, int* flag) {
  EDL_KERNEL_LOOP(i, count) {
    if (!isfinite(x[i])) *flag = 1;
  }
}

__global__ void SgdKernel(float* w, const float* g, float* buf, int64_t count, float lr, float mu,
                          float wd, bool nesterov, const int* skip) {
  if (skip != nullptr && *skip != 0) return;
  EDL_KERNEL_LOOP(i, count) {
    const float gi = g[i] + wd * w[i];
    const float b = mu * buf[i] + gi;
    buf[i] = b;
    w[i] -= lr * (nesterov ? gi + mu * b : b);
  }
}

}  // namespace

size_t ElemSize(Elem e) { return e == Elem::kF32 ? 4 : 2; }

const char* ElemName(Elem e) {
  switch (e) {
    case Elem::kF32:
      return "fp32";
    case Elem::kBF16:
      return "bf16";
    case Elem::kF16:
      return "fp16";
  }
  return "?";
}

cudaError_t Convert4d(const void* src, Fmt4 sf, void* dst, Fmt4 df, int64_t n, int64_t c, int64_t h,
                      int64_t w, float scale, cudaStream_t stream) {
  CHECK(src != dst) << "Convert4d: src and dst overlap";
  const int64_t total = n * c * h * w;
  if (total == 0) return cudaSuccess;
  return Dispatch(sf.elem, [&](auto s) {
    using S = decltype(s);
    Dispatch(df.elem, [&](auto d) {
      using D = decltype(d);
      Convert4dKernel<S, D><<<Blocks(total), kThreads, 0, stream>>>(
          static_cast<const S*>(src), sf.nhwc, static_cast<D*>(dst), df.nhwc, n, c, h, w, scale);
    });
  });
}

cudaError_t Fill(void* dst, Elem e, int64_t count, float value, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return Dispatch(e, [&](auto t) {
    using T = decltype(t);
    FillKernel<T><<<Blocks(count), kThreads, 0, stream>>>(static_cast<T*>(dst), count, value);
  });
}

cudaError_t ScaleF32(float* x, int64_t count, float factor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, factor);
  return cudaGetLastError();
}

cudaError_t Relu(const void* x, void* y, Elem e, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return Dispatch(e, [&](auto t) {
    using T = decltype(t);
    ReluKernel<T><<<Blocks(count), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                          static_cast<T*>(y), count);
  });
}

cudaError_t ReluBackward(const void* y, const void* dy, void* dx, Elem e, int64_t count,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return Dispatch(e, [&](auto t) {
    using T = decltype(t);
    ReluBackwardKernel<T><<<Blocks(count), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), count);
  });
}

cudaError_t Add(const void* a, const void* b, void* y, Elem e, int64_t count, bool relu,
                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return Dispatch(e, [&](auto t) {
    using T = decltype(t);
    AddKernel<T><<<Blocks(count), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), count, relu);
  });
}

cudaError_t MaxPoolForward(const void* x, void* y, Fmt4 f, const PoolShape& s,
                           cudaStream_t stream) {
  CHECK(s.kernel > 0 && s.stride > 0 && s.pad >= 0 && s.pad < s.kernel) << "MaxPoolForward params";
  const int64_t total = s.n * s.c * s.oh * s.ow;
  if (total == 0) return cudaSuccess;
  return Dispatch(f.elem, [&](auto t) {
    using T = decltype(t);
    MaxPoolForwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                    static_cast<T*>(y), f.nhwc, s);
  });
}

cudaError_t MaxPoolBackward(const void* x, const void* dy, void* dx, Fmt4 f, const PoolShape& s,
                            cudaStream_t stream) {
  CHECK(s.kernel > 0 && s.stride > 0 && s.pad >= 0 && s.pad < s.kernel) << "MaxPoolBackward params";
  const int64_t total = s.n * s.c * s.h * s.w;
  if (total == 0) return cudaSuccess;
  return Dispatch(f.elem, [&](auto t) {
    using T = decltype(t);
    MaxPoolBackwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), f.nhwc, s);
  });
}

cudaError_t GlobalAvgPoolForward(const void* x, Fmt4 f, int64_t n, int64_t c, int64_t h, int64_t w,
                                 float* y, cudaStream_t stream) {
  CHECK(h > 0 && w > 0) << "GlobalAvgPoolForward: empty spatial size";
  if (n * c == 0) return cudaSuccess;
  return Dispatch(f.elem, [&](auto t) {
    using T = decltype(t);
    GapForwardKernel<T>
        <<<Blocks(n * c), kThreads, 0, stream>>>(static_cast<const T*>(x), f.nhwc, n, c, h, w, y);
  });
}

cudaError_t GlobalAvgPoolBackward(const float* dy, void* dx, Fmt4 f, int64_t n, int64_t c,
                                  int64_t h, int64_t w, cudaStream_t stream) {
  CHECK(h > 0 && w > 0) << "GlobalAvgPoolBackward: empty spatial size";
  const int64_t total = n * c * h * w;
  if (total == 0) return cudaSuccess;
  return Dispatch(f.elem, [&](auto t) {
    using T = decltype(t);
    GapBackwardKernel<T>
        <<<Blocks(total), kThreads, 0, stream>>>(dy, static_cast<T*>(dx), f.nhwc, n, c, h, w);
  });
}

cudaError_t BroadcastRows(const float* b, float* y, int64_t n, int64_t m, cudaStream_t stream) {
  if (n * m == 0) return cudaSuccess;
  BroadcastRowsKernel<<<Blocks(n * m), kThreads, 0, stream>>>(b, y, n, m);
  return cudaGetLastError();
}

cudaError_t ColumnSum(const float* dy, float* db, int64_t n, int64_t m, float scale,
                      cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  ColumnSumKernel<<<Blocks(m), kThreads, 0, stream>>>(dy, db, n, m, scale);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t m,
                                float label_smoothing, float grad_scale, float* dlogits,
                                XentResult* result, cudaStream_t stream) {
  CHECK(m > 0 && n >= 0 && n <= 0x7fffffff) << "SoftmaxCrossEntropy shape " << n << "x" << m;
  cudaError_t e = cudaMemsetAsync(result, 0, sizeof(XentResult), stream);
  if (e != cudaSuccess || n == 0) return e;
  XentKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, labels, m, label_smoothing,
                                                                grad_scale, dlogits, result);
  return cudaGetLastError();
}

cudaError_t FlagNonFinite(const float* x, int64_t count, int* flag, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  NonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, flag);
  return cudaGetLastError();
}

cudaError_t SgdUpdate(float* w, const float* g, float* buf, int64_t count, float lr, float momentum,
                      float weight_decay, bool nesterov, const int* skip, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SgdKernel<<<Blocks(count), kThreads, 0, stream>>>(w, g, buf, count, lr, momentum, weight_decay,
                                                    nesterov, skip);
  return cudaGetLastError();
}

}  // namespace edl::resnet50::cuda
