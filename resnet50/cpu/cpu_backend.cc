// CPU backend on oneDNN 2.6 (libdnnl, OpenMP runtime).
//
// Speed notes: every primitive is created once per (op, shapes, layouts, params) and cached. 4-D
// activations in Layout::kNative are nChw16c (AVX-512) or nChw8c (otherwise), the format oneDNN's
// jit convolutions run natively, so activations are never reordered between layers; only the
// plain OIHW weights are reordered into the convolution's preferred weight format on each call
// (weights are small next to activations), and weight gradients back into OIHW.
//
// Numerics: BN keeps oneDNN's fp32 statistics; save_invstd = 1/sqrt(var + eps) and the backward
// recovers var + eps from it. Softmax cross-entropy is computed in double per row.
//
// Errors: dnnl::error (unsupported shapes/layouts, out of memory) is caught in Guard() and returned
// as Status::Internal naming the op and operands.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "resnet50/backend.h"

namespace edl::resnet50 {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

bool HasAvx512() { return __builtin_cpu_supports("avx512f"); }

memory::dims Dims(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::desc MdOf(const Shape& shape, Layout layout, DataType dtype) {
  const dt type = dtype == DataType::kInt32 ? dt::s32 : dt::f32;
  const int rank = static_cast<int>(shape.size());
  if (rank == 4 && layout == Layout::kNHWC) return memory::desc(Dims(shape), type, tag::nhwc);
  if (rank == 4 && layout == Layout::kNative) {
    return memory::desc(Dims(shape), type, HasAvx512() ? tag::nChw16c : tag::nChw8c);
  }
  switch (rank) {
    case 1:
      return memory::desc(Dims(shape), type, tag::a);
    case 2:
      return memory::desc(Dims(shape), type, tag::ab);
    case 3:
      return memory::desc(Dims(shape), type, tag::abc);
    case 4:
      return memory::desc(Dims(shape), type, tag::abcd);
    default:
      return memory::desc(Dims(shape), type, tag::any);
  }
}

memory::desc MdOf(const Tensor& t) { return MdOf(t.shape(), t.layout(), t.dtype()); }

// Cache key: the op name and every operand's shape/layout plus the op's integer parameters.
class KeyBuilder {
 public:
  explicit KeyBuilder(const char* op) { os_ << op; }
  KeyBuilder& Add(const Tensor& t) {
    os_ << "|";
    for (int64_t d : t.shape()) os_ << d << ",";
    os_ << static_cast<int>(t.layout());
    return *this;
  }
  KeyBuilder& Add(int64_t v) {
    os_ << "|" << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

template <typename F>
Status Guard(const char* op, F&& body) {
  try {
    return body();
  } catch (const dnnl::error& e) {
    return Status::Internal(std::string("oneDNN ") + op + " failed: " + e.what() + " (status " +
                            std::to_string(static_cast<int>(e.status)) + ")");
  } catch (const std::bad_alloc&) {
    return Status::Internal(std::string(op) + ": out of host memory");
  }
}

Status SameShape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    return Status::InvalidArgument(std::string(op) + ": shape mismatch " + a.DebugString() +
                                   " vs " + b.DebugString());
  }
  return Status::OK();
}

// A cached primitive with the scratch memories it needs (reordered weights, workspace, ...).
struct Cached {
  dnnl::primitive prim;
  dnnl::primitive reorder_in;   // e.g. weights OIHW -> primitive format
  dnnl::primitive reorder_out;  // e.g. diff weights primitive format -> OIHW
  memory scratch;               // target of reorder_in / source of reorder_out
  memory scratch2;              // e.g. pooling workspace
  memory scratch3;              // e.g. recomputed pooling output
  memory::desc fixed_md;        // e.g. reshaped view of an operand
  bool needs_in = false;
  bool needs_out = false;
};

// ---------------------------------------------------------------------------------------------
class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    if (options.threads > 0) omp_set_num_threads(options.threads);
  }

  std::string name() const override { return "cpu"; }
  bool on_device() const override { return false; }

  // ---- memory
  size_t BytesFor(const Shape& shape, Layout layout, DataType dtype) const override {
    if (shape.empty()) return 0;
    if (shape.size() > 4) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      return n * (dtype == DataType::kFloat64 || dtype == DataType::kInt64 ? 8 : 4);
    }
    return MdOf(shape, layout, dtype).get_size();
  }
  void* Allocate(size_t bytes) override {
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  }
  void Free(void* ptr) override { std::free(ptr); }
  Status CopyFromHost(const void* src, Tensor* dst) override {
    std::memcpy(dst->raw(), src, dst->bytes());
    return Status::OK();
  }
  Status CopyToHost(const Tensor& src, void* dst) override {
    std::memcpy(dst, src.raw(), src.bytes());
    return Status::OK();
  }
  Status Copy(const Tensor& src, Tensor* dst) override;
  Status Fill(Tensor* dst, float value) override;
  Status Scale(Tensor* x, float factor, int64_t offset, int64_t count) override;
  Status Synchronize() override {
    return Guard("Synchronize", [&] {
      stream_.wait();
      return Status::OK();
    });
  }

  // ---- ops
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

 private:
  memory Mem(const Tensor& t) { return memory(MdOf(t), engine_, t.raw()); }
  memory Mem(const Tensor& t, const memory::desc& md) { return memory(md, engine_, t.raw()); }
  // Sets up c->reorder_in (into c->scratch) when the primitive wants the weights `w` in another
  // format than theirs (`want`, e.g. a blocked layout for OIHW weights).
  void PrepareWeightsIn(Cached* c, const memory::desc& want, const Tensor& w) {
    c->needs_in = want != MdOf(w);
    if (!c->needs_in) return;
    c->scratch = memory(want, engine_);
    c->reorder_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine_, MdOf(w), engine_, want));
  }
  // The weights in the primitive's format: `w` itself, or reordered into c.scratch.
  memory WeightsIn(Cached& c, const Tensor& w) {
    if (!c.needs_in) return Mem(w);
    c.reorder_in.execute(stream_, {{DNNL_ARG_FROM, Mem(w)}, {DNNL_ARG_TO, c.scratch}});
    return c.scratch;
  }
  dnnl::convolution_forward::primitive_desc ConvFwdPd(const Conv2dParams& p,
                                                      const memory::desc& src,
                                                      const memory::desc& w,
                                                      const memory::desc& dst);
  dnnl::batch_normalization_forward::primitive_desc BnFwdPd(const memory::desc& md, float eps,
                                                            bool training);
  dnnl::eltwise_forward::primitive_desc ReluFwdPd(const memory::desc& md);

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<std::string, Cached> cache_;
  std::vector<float> var_scratch_;  // [C] variance recovered from invstd in BN backward
};

dnnl::convolution_forward::primitive_desc CpuBackend::ConvFwdPd(const Conv2dParams& p,
                                                                const memory::desc& src,
                                                                const memory::desc& w,
                                                                const memory::desc& dst) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::convolution_direct, src, w, dst,
                                    {p.stride, p.stride}, {p.pad, p.pad}, {p.pad, p.pad});
  return dnnl::convolution_forward::primitive_desc(d, engine_);
}

dnnl::batch_normalization_forward::primitive_desc CpuBackend::BnFwdPd(const memory::desc& md,
                                                                      float eps, bool training) {
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (!training) flags = flags | dnnl::normalization_flags::use_global_stats;
  dnnl::batch_normalization_forward::desc d(
      training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, md, eps,
      flags);
  return dnnl::batch_normalization_forward::primitive_desc(d, engine_);
}

dnnl::eltwise_forward::primitive_desc CpuBackend::ReluFwdPd(const memory::desc& md) {
  dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training,
                                dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, 0.f, 0.f);
  return dnnl::eltwise_forward::primitive_desc(d, engine_);
}

// ---------------------------------------------------------------------------------------------
// Memory ops

Status CpuBackend::Copy(const Tensor& src, Tensor* dst) {
  EDL_RETURN_IF_ERROR(SameShape("Copy", src, *dst));
  if (src.layout() == dst->layout() || src.rank() != 4) {
    std::memcpy(dst->raw(), src.raw(), std::min(src.bytes(), dst->bytes()));
    return Status::OK();
  }
  return Guard("Copy", [&] {
    Cached& c = cache_[KeyBuilder("copy").Add(src).Add(*dst).str()];
    if (!c.prim)
      c.prim =
          dnnl::reorder(dnnl::reorder::primitive_desc(engine_, MdOf(src), engine_, MdOf(*dst)));
    c.prim.execute(stream_, {{DNNL_ARG_FROM, Mem(src)}, {DNNL_ARG_TO, Mem(*dst)}});
    return Status::OK();
  });
}

Status CpuBackend::Fill(Tensor* dst, float value) {
  const int64_t n = dst->numel();
  const bool padded = dst->bytes() > static_cast<size_t>(n) * sizeof(float);
  if (!padded || value == 0.f) {
    float* p = dst->data();
    const int64_t storage = static_cast<int64_t>(dst->bytes() / sizeof(float));
    const float v = padded ? 0.f : value;
#pragma omp parallel for simd
    for (int64_t i = 0; i < storage; ++i) p[i] = v;
    return Status::OK();
  }
  // Padded native layout: zero the padding, then write the logical elements via a plain copy.
  Tensor plain(this, dst->shape(), Layout::kNCHW, dst->dtype());
  EDL_RETURN_IF_ERROR(Fill(&plain, value));
  EDL_RETURN_IF_ERROR(Fill(dst, 0.f));
  return Copy(plain, dst);
}

Status CpuBackend::Scale(Tensor* x, float factor, int64_t offset, int64_t count) {
  const int64_t storage = static_cast<int64_t>(x->bytes() / sizeof(float));
  if (count < 0) count = storage - offset;
  if (offset < 0 || offset + count > storage) {
    return Status::InvalidArgument("Scale: range [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + count) + ") outside " +
                                   x->DebugString());
  }
  float* p = x->data() + offset;
#pragma omp parallel for simd
  for (int64_t i = 0; i < count; ++i) p[i] *= factor;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Convolution

Status CpuBackend::Conv2dForward(const Conv2dParams& p, const Tensor& x, const Tensor& w,
                                 Tensor* y) {
  return Guard("Conv2dForward", [&] {
    Cached& c = cache_[KeyBuilder("convf").Add(x).Add(w).Add(*y).Add(p.stride).Add(p.pad).str()];
    if (!c.prim) {
      auto pd = ConvFwdPd(p, MdOf(x), memory::desc(Dims(w.shape()), dt::f32, tag::any), MdOf(*y));
      c.prim = dnnl::convolution_forward(pd);
      PrepareWeightsIn(&c, pd.weights_desc(), w);
    }
    const memory wm = WeightsIn(c, w);
    c.prim.execute(stream_,
                   {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, Mem(*y)}});
    return Status::OK();
  });
}

Status CpuBackend::Conv2dBackwardData(const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                      Tensor* dx) {
  return Guard("Conv2dBackwardData", [&] {
    Cached& c = cache_[KeyBuilder("convbd").Add(dy).Add(w).Add(*dx).Add(p.stride).Add(p.pad).str()];
    if (!c.prim) {
      const memory::desc wany(Dims(w.shape()), dt::f32, tag::any);
      auto hint = ConvFwdPd(p, MdOf(*dx), wany, MdOf(dy));
      dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, MdOf(*dx), wany,
                                              MdOf(dy), {p.stride, p.stride}, {p.pad, p.pad},
                                              {p.pad, p.pad});
      dnnl::convolution_backward_data::primitive_desc pd(d, engine_, hint);
      c.prim = dnnl::convolution_backward_data(pd);
      PrepareWeightsIn(&c, pd.weights_desc(), w);
    }
    const memory wm = WeightsIn(c, w);
    c.prim.execute(
        stream_,
        {{DNNL_ARG_DIFF_DST, Mem(dy)}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, Mem(*dx)}});
    return Status::OK();
  });
}

Status CpuBackend::Conv2dBackwardFilter(const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                        Tensor* dw) {
  return Guard("Conv2dBackwardFilter", [&] {
    Cached& c = cache_[KeyBuilder("convbw").Add(x).Add(dy).Add(*dw).Add(p.stride).Add(p.pad).str()];
    if (!c.prim) {
      const memory::desc wany(Dims(dw->shape()), dt::f32, tag::any);
      auto hint = ConvFwdPd(p, MdOf(x), wany, MdOf(dy));
      dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, MdOf(x), wany,
                                                 MdOf(dy), {p.stride, p.stride}, {p.pad, p.pad},
                                                 {p.pad, p.pad});
      dnnl::convolution_backward_weights::primitive_desc pd(d, engine_, hint);
      c.prim = dnnl::convolution_backward_weights(pd);
      c.needs_out = pd.diff_weights_desc() != MdOf(*dw);
      if (c.needs_out) {
        c.scratch = memory(pd.diff_weights_desc(), engine_);
        c.reorder_out = dnnl::reorder(
            dnnl::reorder::primitive_desc(engine_, pd.diff_weights_desc(), engine_, MdOf(*dw)));
      }
    }
    memory dwm = c.needs_out ? c.scratch : Mem(*dw);
    c.prim.execute(
        stream_,
        {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DIFF_DST, Mem(dy)}, {DNNL_ARG_DIFF_WEIGHTS, dwm}});
    if (c.needs_out) {
      c.reorder_out.execute(stream_, {{DNNL_ARG_FROM, c.scratch}, {DNNL_ARG_TO, Mem(*dw)}});
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Batch normalisation

Status CpuBackend::BatchNormForwardTraining(const BatchNormParams& p, const Tensor& x,
                                            const Tensor& gamma, const Tensor& beta, Tensor* y,
                                            Tensor* save_mean, Tensor* save_invstd,
                                            Tensor* running_mean, Tensor* running_var) {
  EDL_RETURN_IF_ERROR(SameShape("BatchNormForwardTraining", x, *y));
  return Guard("BatchNormForwardTraining", [&] {
    Cached& c = cache_[KeyBuilder("bnft").Add(x).Add(static_cast<int64_t>(p.eps * 1e9)).str()];
    if (!c.prim) c.prim = dnnl::batch_normalization_forward(BnFwdPd(MdOf(x), p.eps, true));
    // save_invstd first receives the batch variance; converted below.
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)},
                             {DNNL_ARG_DST, Mem(*y)},
                             {DNNL_ARG_SCALE, Mem(gamma)},
                             {DNNL_ARG_SHIFT, Mem(beta)},
                             {DNNL_ARG_MEAN, Mem(*save_mean)},
                             {DNNL_ARG_VARIANCE, Mem(*save_invstd)}});
    const int64_t channels = x.dim(1);
    const int64_t m = x.numel() / channels;
    const float unbias = m > 1 ? static_cast<float>(m) / static_cast<float>(m - 1) : 1.f;
    const float* mean = save_mean->data();
    float* inv = save_invstd->data();
    float* rm = running_mean->data();
    float* rv = running_var->data();
    for (int64_t ch = 0; ch < channels; ++ch) {
      const float var = inv[ch];
      rm[ch] = (1.f - p.momentum) * rm[ch] + p.momentum * mean[ch];
      rv[ch] = (1.f - p.momentum) * rv[ch] + p.momentum * var * unbias;
      inv[ch] = 1.f / std::sqrt(var + p.eps);
    }
    if (p.fuse_relu) return ReluForward(*y, y);
    return Status::OK();
  });
}

Status CpuBackend::BatchNormForwardInference(const BatchNormParams& p, const Tensor& x,
                                             const Tensor& gamma, const Tensor& beta,
                                             const Tensor& running_mean, const Tensor& running_var,
                                             Tensor* y) {
  EDL_RETURN_IF_ERROR(SameShape("BatchNormForwardInference", x, *y));
  return Guard("BatchNormForwardInference", [&] {
    Cached& c = cache_
        [KeyBuilder("bnfi").Add(x).Add(static_cast<int64_t>(p.eps * 1e9)).Add(p.fuse_relu).str()];
    if (!c.prim) {
      auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                   dnnl::normalization_flags::use_global_stats;
      if (p.fuse_relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
      dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, MdOf(x), p.eps,
                                                flags);
      c.prim = dnnl::batch_normalization_forward(
          dnnl::batch_normalization_forward::primitive_desc(d, engine_));
    }
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)},
                             {DNNL_ARG_DST, Mem(*y)},
                             {DNNL_ARG_SCALE, Mem(gamma)},
                             {DNNL_ARG_SHIFT, Mem(beta)},
                             {DNNL_ARG_MEAN, Mem(running_mean)},
                             {DNNL_ARG_VARIANCE, Mem(running_var)}});
    return Status::OK();
  });
}

Status CpuBackend::BatchNormBackward(const BatchNormParams& p, const Tensor& x, const Tensor& dy,
                                     const Tensor* y, const Tensor& gamma, const Tensor& save_mean,
                                     const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                                     Tensor* dbeta) {
  EDL_RETURN_IF_ERROR(SameShape("BatchNormBackward", x, dy));
  if (p.fuse_relu && y == nullptr) {
    return Status::InvalidArgument("BatchNormBackward: fuse_relu needs the forward output y");
  }
  const Tensor* grad = &dy;
  if (p.fuse_relu) {
    EDL_RETURN_IF_ERROR(ReluBackward(*y, dy, dx));
    grad = dx;
  }
  return Guard("BatchNormBackward", [&] {
    Cached& c = cache_[KeyBuilder("bnb").Add(x).Add(static_cast<int64_t>(p.eps * 1e9)).str()];
    if (!c.prim) {
      auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
      auto hint = BnFwdPd(MdOf(x), p.eps, true);
      dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, MdOf(dy), MdOf(x),
                                                 p.eps, flags);
      c.prim = dnnl::batch_normalization_backward(
          dnnl::batch_normalization_backward::primitive_desc(d, engine_, hint));
    }
    const int64_t channels = x.dim(1);
    var_scratch_.resize(channels);
    const float* inv = save_invstd.data();
    for (int64_t ch = 0; ch < channels; ++ch) {
      var_scratch_[ch] = 1.f / (inv[ch] * inv[ch]) - p.eps;
    }
    memory var(memory::desc({channels}, dt::f32, tag::a), engine_, var_scratch_.data());
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)},
                             {DNNL_ARG_DIFF_DST, Mem(*grad)},
                             {DNNL_ARG_SCALE, Mem(gamma)},
                             {DNNL_ARG_SHIFT, Mem(gamma)},  // unused by the math; 2.6 asks for it
                             {DNNL_ARG_MEAN, Mem(save_mean)},
                             {DNNL_ARG_VARIANCE, var},
                             {DNNL_ARG_DIFF_SRC, Mem(*dx)},
                             {DNNL_ARG_DIFF_SCALE, Mem(*dgamma)},
                             {DNNL_ARG_DIFF_SHIFT, Mem(*dbeta)}});
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Element-wise

Status CpuBackend::ReluForward(const Tensor& x, Tensor* y) {
  EDL_RETURN_IF_ERROR(SameShape("ReluForward", x, *y));
  return Guard("ReluForward", [&] {
    Cached& c = cache_[KeyBuilder("reluf").Add(x).str()];
    if (!c.prim) c.prim = dnnl::eltwise_forward(ReluFwdPd(MdOf(x)));
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DST, Mem(*y)}});
    return Status::OK();
  });
}

Status CpuBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  EDL_RETURN_IF_ERROR(SameShape("ReluBackward", y, dy));
  return Guard("ReluBackward", [&] {
    Cached& c = cache_[KeyBuilder("relub").Add(y).Add(dy).Add(*dx).str()];
    if (!c.prim) {
      dnnl::eltwise_backward::desc d(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, MdOf(*dx),
                                     MdOf(y), 0.f, 0.f);
      c.prim = dnnl::eltwise_backward(
          dnnl::eltwise_backward::primitive_desc(d, engine_, ReluFwdPd(MdOf(y))));
    }
    c.prim.execute(
        stream_,
        {{DNNL_ARG_DST, Mem(y)}, {DNNL_ARG_DIFF_DST, Mem(dy)}, {DNNL_ARG_DIFF_SRC, Mem(*dx)}});
    return Status::OK();
  });
}

Status CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor* y, bool relu) {
  EDL_RETURN_IF_ERROR(SameShape("Add", a, b));
  EDL_RETURN_IF_ERROR(SameShape("Add", a, *y));
  return Guard("Add", [&] {
    Cached& c = cache_[KeyBuilder("add").Add(a).Add(b).Add(*y).Add(relu).str()];
    if (!c.prim) {
      dnnl::primitive_attr attr;
      if (relu) {
        dnnl::post_ops ops;
        ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
        attr.set_post_ops(ops);
      }
      dnnl::binary::desc d(dnnl::algorithm::binary_add, MdOf(a), MdOf(b), MdOf(*y));
      c.prim = dnnl::binary(dnnl::binary::primitive_desc(d, attr, engine_));
    }
    c.prim.execute(stream_,
                   {{DNNL_ARG_SRC_0, Mem(a)}, {DNNL_ARG_SRC_1, Mem(b)}, {DNNL_ARG_DST, Mem(*y)}});
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Pooling

Status CpuBackend::MaxPool2dForward(const PoolParams& p, const Tensor& x, Tensor* y) {
  return Guard("MaxPool2dForward", [&] {
    Cached& c =
        cache_[KeyBuilder("maxf").Add(x).Add(*y).Add(p.kernel).Add(p.stride).Add(p.pad).str()];
    if (!c.prim) {
      dnnl::pooling_forward::desc d(
          dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, MdOf(x), MdOf(*y),
          {p.stride, p.stride}, {p.kernel, p.kernel}, {p.pad, p.pad}, {p.pad, p.pad});
      c.prim = dnnl::pooling_forward(dnnl::pooling_forward::primitive_desc(d, engine_));
    }
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DST, Mem(*y)}});
    return Status::OK();
  });
}

// oneDNN's max-pool backward needs the forward's workspace (argmax); the interface does not carry
// one, so the forward is re-run in training mode here (one pooling in the whole ResNet stem).
Status CpuBackend::MaxPool2dBackward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                     const Tensor& dy, Tensor* dx) {
  return Guard("MaxPool2dBackward", [&] {
    Cached& c = cache_
        [KeyBuilder("maxb").Add(x).Add(dy).Add(*dx).Add(p.kernel).Add(p.stride).Add(p.pad).str()];
    if (!c.prim) {
      dnnl::pooling_forward::desc fd(
          dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, MdOf(x), MdOf(y),
          {p.stride, p.stride}, {p.kernel, p.kernel}, {p.pad, p.pad}, {p.pad, p.pad});
      dnnl::pooling_forward::primitive_desc fpd(fd, engine_);
      c.reorder_in = dnnl::pooling_forward(fpd);  // the training forward
      c.scratch2 = memory(fpd.workspace_desc(), engine_);
      c.scratch3 = memory(fpd.dst_desc(), engine_);
      dnnl::pooling_backward::desc bd(dnnl::algorithm::pooling_max, MdOf(*dx), MdOf(dy),
                                      {p.stride, p.stride}, {p.kernel, p.kernel}, {p.pad, p.pad},
                                      {p.pad, p.pad});
      c.prim = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(bd, engine_, fpd));
    }
    c.reorder_in.execute(
        stream_,
        {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DST, c.scratch3}, {DNNL_ARG_WORKSPACE, c.scratch2}});
    c.prim.execute(stream_, {{DNNL_ARG_DIFF_DST, Mem(dy)},
                             {DNNL_ARG_WORKSPACE, c.scratch2},
                             {DNNL_ARG_DIFF_SRC, Mem(*dx)}});
    return Status::OK();
  });
}

Status CpuBackend::GlobalAvgPoolForward(const Tensor& x, Tensor* y) {
  return Guard("GlobalAvgPoolForward", [&] {
    Cached& c = cache_[KeyBuilder("gapf").Add(x).Add(*y).str()];
    const memory::desc ymd({x.dim(0), x.dim(1), 1, 1}, dt::f32, tag::nchw);
    if (!c.prim) {
      const memory::dim h = x.dim(2), w = x.dim(3);
      dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::pooling_avg_exclude_padding, MdOf(x), ymd,
                                    {1, 1}, {h, w}, {0, 0}, {0, 0});
      c.prim = dnnl::pooling_forward(dnnl::pooling_forward::primitive_desc(d, engine_));
    }
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DST, Mem(*y, ymd)}});
    return Status::OK();
  });
}

Status CpuBackend::GlobalAvgPoolBackward(const Tensor& dy, Tensor* dx) {
  return Guard("GlobalAvgPoolBackward", [&] {
    Cached& c = cache_[KeyBuilder("gapb").Add(dy).Add(*dx).str()];
    const memory::desc dymd({dx->dim(0), dx->dim(1), 1, 1}, dt::f32, tag::nchw);
    if (!c.prim) {
      const memory::dim h = dx->dim(2), w = dx->dim(3);
      dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training,
                                     dnnl::algorithm::pooling_avg_exclude_padding, MdOf(*dx), dymd,
                                     {1, 1}, {h, w}, {0, 0}, {0, 0});
      dnnl::pooling_forward::primitive_desc fpd(fd, engine_);
      dnnl::pooling_backward::desc bd(dnnl::algorithm::pooling_avg_exclude_padding, MdOf(*dx), dymd,
                                      {1, 1}, {h, w}, {0, 0}, {0, 0});
      c.prim = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(bd, engine_, fpd));
    }
    c.prim.execute(stream_, {{DNNL_ARG_DIFF_DST, Mem(dy, dymd)}, {DNNL_ARG_DIFF_SRC, Mem(*dx)}});
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Fully connected

Status CpuBackend::LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* y) {
  return Guard("LinearForward", [&] {
    Cached& c = cache_[KeyBuilder("fcf").Add(x).Add(w).str()];
    if (!c.prim) {
      dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_training, MdOf(x), MdOf(w),
                                          MdOf(b), MdOf(*y));
      c.prim = dnnl::inner_product_forward(dnnl::inner_product_forward::primitive_desc(d, engine_));
    }
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)},
                             {DNNL_ARG_WEIGHTS, Mem(w)},
                             {DNNL_ARG_BIAS, Mem(b)},
                             {DNNL_ARG_DST, Mem(*y)}});
    return Status::OK();
  });
}

Status CpuBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                  Tensor* dw, Tensor* db) {
  return Guard("LinearBackward", [&] {
    Cached& c = cache_[KeyBuilder("fcb").Add(x).Add(w).str()];
    if (!c.prim) {
      dnnl::inner_product_forward::desc fd(dnnl::prop_kind::forward_training, MdOf(x), MdOf(w),
                                           MdOf(*db), MdOf(dy));
      dnnl::inner_product_forward::primitive_desc fpd(fd, engine_);
      dnnl::inner_product_backward_weights::desc wd(MdOf(x), MdOf(*dw), MdOf(*db), MdOf(dy));
      c.prim = dnnl::inner_product_backward_weights(
          dnnl::inner_product_backward_weights::primitive_desc(wd, engine_, fpd));
      dnnl::inner_product_backward_data::desc dd(MdOf(x), MdOf(w), MdOf(dy));
      c.reorder_in = dnnl::inner_product_backward_data(
          dnnl::inner_product_backward_data::primitive_desc(dd, engine_, fpd));
    }
    c.prim.execute(stream_, {{DNNL_ARG_SRC, Mem(x)},
                             {DNNL_ARG_DIFF_DST, Mem(dy)},
                             {DNNL_ARG_DIFF_WEIGHTS, Mem(*dw)},
                             {DNNL_ARG_DIFF_BIAS, Mem(*db)}});
    if (dx != nullptr) {
      c.reorder_in.execute(stream_, {{DNNL_ARG_DIFF_DST, Mem(dy)},
                                     {DNNL_ARG_WEIGHTS, Mem(w)},
                                     {DNNL_ARG_DIFF_SRC, Mem(*dx)}});
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Loss and optimizer (plain loops)

Status CpuBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                       float label_smoothing, float grad_scale, Tensor* dlogits,
                                       double* loss_sum, int64_t* correct) {
  if (logits.rank() != 2 || labels.numel() != logits.dim(0)) {
    return Status::InvalidArgument("SoftmaxCrossEntropy: logits " + logits.DebugString() +
                                   " and labels " + labels.DebugString() + " do not match");
  }
  const int64_t n = logits.dim(0), m = logits.dim(1);
  const float* z = logits.data();
  const int32_t* lab = labels.data_i32();
  float* dz = dlogits ? dlogits->data() : nullptr;
  double loss = 0;
  int64_t hits = 0;
  const double off = label_smoothing / static_cast<double>(m);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z + i * m;
    const int32_t label = lab[i];
    if (label < 0 || label >= m) {
      return Status::InvalidArgument("SoftmaxCrossEntropy: label " + std::to_string(label) +
                                     " outside [0, " + std::to_string(m) + ")");
    }
    int64_t arg = 0;
    for (int64_t k = 1; k < m; ++k) arg = row[k] > row[arg] ? k : arg;
    hits += arg == label;
    const double mx = row[arg];
    double sum = 0;
    for (int64_t k = 0; k < m; ++k) sum += std::exp(row[k] - mx);
    const double lse = mx + std::log(sum);
    for (int64_t k = 0; k < m; ++k) {
      const double target = off + (k == label ? 1.0 - label_smoothing : 0.0);
      const double logp = row[k] - lse;
      loss -= target * logp;
      if (dz) dz[i * m + k] = static_cast<float>(grad_scale * (std::exp(logp) - target));
    }
  }
  *loss_sum = loss;
  *correct = hits;
  return Status::OK();
}

Status CpuBackend::SgdUpdate(const SgdParams& p, Tensor* params, const Tensor& grads,
                             Tensor* momentum, int64_t offset, int64_t count) {
  EDL_RETURN_IF_ERROR(CheckSgdRange(*params, grads, *momentum, offset, count));
  float* w = params->data() + offset;
  const float* g = grads.data() + offset;
  float* buf = momentum->data() + offset;
  const float lr = p.lr, mu = p.momentum, wd = p.weight_decay;
  const bool nesterov = p.nesterov;
#pragma omp parallel for simd
  for (int64_t i = 0; i < count; ++i) {
    const float gi = g[i] + wd * w[i];
    const float b = mu * buf[i] + gi;
    buf[i] = b;
    w[i] -= lr * (nesterov ? gi + mu * b : b);
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  try {
    return std::unique_ptr<Backend>(new CpuBackend(options));
  } catch (const dnnl::error& e) {
    return Status::Internal(std::string("oneDNN CPU engine could not be created: ") + e.what());
  }
}

}  // namespace edl::resnet50
