// CudaBackend convolution and batch norm on cuDNN (legacy v7-style API of cuDNN 9). Kept in its
// own translation unit (llm.c cudnn_att.cpp) so that edits here rebuild only this file.
//
// Convolution: NHWC activations and KRSC weights in the compute precision, fp32 accumulation
// (CUDNN_DATA_FLOAT compute type). The algorithm of each direction is chosen once per shape with
// cudnnFind*AlgorithmEx (it times the candidates on the real buffers of the first call) under a
// workspace cap (config::kConvWorkspaceCap) and cached in a ConvPlan. fp32 mode pins
// CUDNN_FMA_MATH (no TF32) so results match the CPU backend; bf16/fp16 use the math type the
// search picked (tensor cores).
//
// Batch norm: cudnnBatchNormalization*Ex with NHWC input; SPATIAL_PERSISTENT (the fast NHWC
// kernels) in bf16/fp16, SPATIAL in fp32 for accuracy. Statistics and parameters are fp32. The
// reserve space a training forward leaves for its backward is kept per layer, keyed by the layer's
// save_mean buffer. ReLU fusion (BatchNormParams::fuse_relu) runs our ReLU kernel after the
// forward and masks dy before the backward.
#include <glog/logging.h>

#include <algorithm>
#include <climits>
#include <sstream>

#include "resnet50/cuda/cuda_backend.h"
#include "resnet50/cuda/cuda_check.h"

namespace edl::resnet50::cuda {
namespace {

cudnnDataType_t CudnnType(Elem e) {
  switch (e) {
    case Elem::kF32:
      return CUDNN_DATA_FLOAT;
    case Elem::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case Elem::kF16:
      return CUDNN_DATA_HALF;
  }
  return CUDNN_DATA_FLOAT;
}

std::string Key(const char* op, std::initializer_list<int64_t> values) {
  std::ostringstream os;
  os << op;
  for (int64_t v : values) os << "," << v;
  return os.str();
}

bool IsTensorOp(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

bool FitsInt(const Shape& s) {
  for (int64_t d : s) {
    if (d <= 0 || d > INT_MAX) return false;
  }
  return true;
}

Status SetNhwc(cudnnTensorDescriptor_t d, cudnnDataType_t type, const Shape& s) {
  EDL_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(
      d, CUDNN_TENSOR_NHWC, type, static_cast<int>(s[0]), static_cast<int>(s[1]),
      static_cast<int>(s[2]), static_cast<int>(s[3])));
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Convolution plans and algorithm search

StatusOr<ConvPlan*> CudaBackend::PlanConv(const Conv2dParams& p, const Shape& xs, const Shape& ws,
                                          const Shape& ys) {
  const std::string key = Key("conv", {xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], p.stride, p.pad});
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return it->second.get();
  auto plan = std::make_unique<ConvPlan>();
  const cudnnDataType_t type = CudnnType(act_);
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->x));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->y));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&plan->w));
  EDL_RETURN_IF_ERROR(SetNhwc(plan->x, type, xs));
  EDL_RETURN_IF_ERROR(SetNhwc(plan->y, type, ys));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(
      plan->w, type, CUDNN_TENSOR_NHWC, static_cast<int>(ws[0]), static_cast<int>(ws[1]),
      static_cast<int>(ws[2]), static_cast<int>(ws[3])));
  for (cudnnConvolutionDescriptor_t* d : {&plan->fwd, &plan->bwd_data, &plan->bwd_filter}) {
    EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(d));
    EDL_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        *d, p.pad, p.pad, p.stride, p.stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    EDL_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(
        *d, act_ == Elem::kF32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  }
  // cuDNN's own idea of the output shape must match ours.
  int n, c, h, w;
  EDL_CUDNN_RETURN_IF_ERROR(
      cudnnGetConvolution2dForwardOutputDim(plan->fwd, plan->x, plan->w, &n, &c, &h, &w));
  if (n != ys[0] || c != ys[1] || h != ys[2] || w != ys[3]) {
    return Status::InvalidArgument("Conv2d: output shape [" + std::to_string(n) + "," +
                                   std::to_string(c) + "," + std::to_string(h) + "," +
                                   std::to_string(w) + "] expected by cuDNN");
  }
  ConvPlan* raw = plan.get();
  conv_plans_[key] = std::move(plan);
  return raw;
}

Status CudaBackend::EnsureWorkspace(size_t bytes) {
  return bytes == 0 ? Status::OK() : workspace_.Reserve(bytes, stream_);
}

size_t CudaBackend::SearchWorkspace() {
  // As much as the cap allows and free memory can give; less (down to none) when memory is short.
  for (size_t want = config::kConvWorkspaceCap; want >= (size_t{1} << 20); want /= 4) {
    if (EnsureWorkspace(want).ok()) return want;
    cudaGetLastError();
  }
  return 0;
}

Status CudaBackend::FindForward(ConvPlan* plan, const void* x, const void* w, void* y) {
  const size_t ws = SearchWorkspace();
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithmEx(
      cudnn_, plan->x, x, plan->w, w, plan->fwd, plan->y, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
      &found, perf, ws ? workspace_.get() : nullptr, ws));
  for (int i = 0; i < found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ws) continue;
    if (act_ == Elem::kF32 && IsTensorOp(perf[i].mathType)) continue;
    plan->fwd_algo = perf[i].algo;
    plan->fwd_ws = perf[i].memory;
    EDL_RETURN_IF_ERROR(SetMath(plan->fwd, perf[i].mathType));
    plan->have_fwd = true;
    return Status::OK();
  }
  return Status::InvalidArgument("Conv2dForward: cuDNN found no algorithm for this shape in " +
                                 std::string(ElemName(act_)) + " within " +
                                 std::to_string(ws >> 20) + " MiB of workspace");
}

Status CudaBackend::FindBackwardData(ConvPlan* plan, const void* dy, const void* w, void* dx) {
  const size_t ws = SearchWorkspace();
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int found = 0;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardDataAlgorithmEx(
      cudnn_, plan->w, w, plan->y, dy, plan->bwd_data, plan->x, dx,
      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf, ws ? workspace_.get() : nullptr, ws));
  for (int i = 0; i < found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ws) continue;
    if (act_ == Elem::kF32 && IsTensorOp(perf[i].mathType)) continue;
    plan->bwd_data_algo = perf[i].algo;
    plan->bwd_data_ws = perf[i].memory;
    EDL_RETURN_IF_ERROR(SetMath(plan->bwd_data, perf[i].mathType));
    plan->have_bwd_data = true;
    return Status::OK();
  }
  return Status::InvalidArgument("Conv2dBackwardData: cuDNN found no algorithm for this shape in " +
                                 std::string(ElemName(act_)));
}

Status CudaBackend::FindBackwardFilter(ConvPlan* plan, const void* x, const void* dy, void* dw) {
  const size_t ws = SearchWorkspace();
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int found = 0;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardFilterAlgorithmEx(
      cudnn_, plan->x, x, plan->y, dy, plan->bwd_filter, plan->w, dw,
      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf, ws ? workspace_.get() : nullptr, ws));
  for (int i = 0; i < found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ws) continue;
    if (act_ == Elem::kF32 && IsTensorOp(perf[i].mathType)) continue;
    plan->bwd_filter_algo = perf[i].algo;
    plan->bwd_filter_ws = perf[i].memory;
    EDL_RETURN_IF_ERROR(SetMath(plan->bwd_filter, perf[i].mathType));
    plan->have_bwd_filter = true;
    return Status::OK();
  }
  return Status::InvalidArgument(
      "Conv2dBackwardFilter: cuDNN found no algorithm for this shape in " +
      std::string(ElemName(act_)));
}

// Applies the math type the search found, except in fp32 mode, whose descriptors keep
// CUDNN_FMA_MATH (set in PlanConv) so no TF32 kernel ever runs.
Status CudaBackend::SetMath(cudnnConvolutionDescriptor_t d, cudnnMathType_t found) {
  if (act_ == Elem::kF32) return Status::OK();
  EDL_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d, found));
  return Status::OK();
}

// OIHW fp32 master weights -> KRSC in the compute precision, in scratch kSlotW.
Status CudaBackend::PackWeights(const Tensor& w, const void** packed) {
  void* dst = nullptr;
  EDL_RETURN_IF_ERROR(ScratchFor(kSlotW, w.numel() * ElemSize(act_), &dst));
  EDL_CUDA_RETURN_IF_ERROR(Convert4d(w.raw(), Fmt4{Elem::kF32, false}, dst, native(), w.dim(0),
                                     w.dim(1), w.dim(2), w.dim(3), 1.f, stream_));
  *packed = dst;
  return Status::OK();
}

namespace {

// Checks x [N,C,H,W], w [K,C,k,k] OIHW fp32, y [N,K,OH,OW] against p.
Status CheckConvShapes(const char* op, const Conv2dParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& y) {
  const bool ok = x.rank() == 4 && w.rank() == 4 && y.rank() == 4 && w.dim(1) == x.dim(1) &&
                  w.dim(2) == p.kernel && w.dim(3) == p.kernel && y.dim(0) == x.dim(0) &&
                  y.dim(1) == w.dim(0) && y.dim(2) == p.OutSize(x.dim(2)) &&
                  y.dim(3) == p.OutSize(x.dim(3)) && w.layout() == Layout::kNCHW &&
                  FitsInt(x.shape()) && FitsInt(y.shape()) && FitsInt(w.shape());
  if (ok) return Status::OK();
  return Status::InvalidArgument(std::string(op) + ": shapes do not match (x " + x.DebugString() +
                                 ", w " + w.DebugString() + ", y " + y.DebugString() + ", kernel " +
                                 std::to_string(p.kernel) + " stride " + std::to_string(p.stride) +
                                 " pad " + std::to_string(p.pad) + ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Convolution

Status CudaBackend::Conv2dForward(const Conv2dParams& p, const Tensor& x, const Tensor& w,
                                  Tensor* y) {
  EDL_RETURN_IF_ERROR(CheckConvShapes("Conv2dForward", p, x, w, *y));
  auto plan = PlanConv(p, x.shape(), w.shape(), y->shape());
  if (!plan.ok()) return plan.status();
  ConvPlan* c = plan.value();
  const void *xin = nullptr, *wp = nullptr;
  void* yout = nullptr;
  EDL_RETURN_IF_ERROR(InNative(x, kSlotX, &xin));
  EDL_RETURN_IF_ERROR(PackWeights(w, &wp));
  EDL_RETURN_IF_ERROR(OutNative(y, kSlotY, &yout));
  if (!c->have_fwd) EDL_RETURN_IF_ERROR(FindForward(c, xin, wp, yout));
  EDL_RETURN_IF_ERROR(EnsureWorkspace(c->fwd_ws));
  const float one = 1.f, zero = 0.f;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(cudnn_, &one, c->x, xin, c->w, wp, c->fwd,
                                                    c->fwd_algo, workspace_.get(), c->fwd_ws, &zero,
                                                    c->y, yout));
  return FinishOut(y, kSlotY);
}

Status CudaBackend::Conv2dBackwardData(const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                       Tensor* dx) {
  EDL_RETURN_IF_ERROR(CheckConvShapes("Conv2dBackwardData", p, *dx, w, dy));
  auto plan = PlanConv(p, dx->shape(), w.shape(), dy.shape());
  if (!plan.ok()) return plan.status();
  ConvPlan* c = plan.value();
  const void *dyin = nullptr, *wp = nullptr;
  void* dxout = nullptr;
  EDL_RETURN_IF_ERROR(InNative(dy, kSlotDY, &dyin));
  EDL_RETURN_IF_ERROR(PackWeights(w, &wp));
  EDL_RETURN_IF_ERROR(OutNative(dx, kSlotDX, &dxout));
  if (!c->have_bwd_data) EDL_RETURN_IF_ERROR(FindBackwardData(c, dyin, wp, dxout));
  EDL_RETURN_IF_ERROR(EnsureWorkspace(c->bwd_data_ws));
  const float one = 1.f, zero = 0.f;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
      cudnn_, &one, c->w, wp, c->y, dyin, c->bwd_data, c->bwd_data_algo, workspace_.get(),
      c->bwd_data_ws, &zero, c->x, dxout));
  return FinishOut(dx, kSlotDX);
}

Status CudaBackend::Conv2dBackwardFilter(const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                         Tensor* dw) {
  EDL_RETURN_IF_ERROR(CheckConvShapes("Conv2dBackwardFilter", p, x, *dw, dy));
  auto plan = PlanConv(p, x.shape(), dw->shape(), dy.shape());
  if (!plan.ok()) return plan.status();
  ConvPlan* c = plan.value();
  const void *xin = nullptr, *dyin = nullptr;
  void* dwp = nullptr;
  EDL_RETURN_IF_ERROR(InNative(x, kSlotX, &xin));
  EDL_RETURN_IF_ERROR(InNative(dy, kSlotDY, &dyin));
  EDL_RETURN_IF_ERROR(ScratchFor(kSlotW, dw->numel() * ElemSize(act_), &dwp));
  if (!c->have_bwd_filter) EDL_RETURN_IF_ERROR(FindBackwardFilter(c, xin, dyin, dwp));
  EDL_RETURN_IF_ERROR(EnsureWorkspace(c->bwd_filter_ws));
  const float one = 1.f, zero = 0.f;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
      cudnn_, &one, c->x, xin, c->y, dyin, c->bwd_filter, c->bwd_filter_algo, workspace_.get(),
      c->bwd_filter_ws, &zero, c->w, dwp));
  // KRSC (compute precision) -> OIHW fp32, undoing the fp16 loss scale.
  EDL_CUDA_RETURN_IF_ERROR(Convert4d(dwp, native(), dw->raw(), Fmt4{Elem::kF32, false}, dw->dim(0),
                                     dw->dim(1), dw->dim(2), dw->dim(3), 1.f / loss_scale_,
                                     stream_));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Batch norm

cudnnBatchNormMode_t CudaBackend::BnMode() const {
  return act_ == Elem::kF32 ? CUDNN_BATCHNORM_SPATIAL : CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
}

StatusOr<BnPlan*> CudaBackend::PlanBn(const Shape& xs) {
  const std::string key = Key("bn", {xs[0], xs[1], xs[2], xs[3]});
  auto it = bn_plans_.find(key);
  if (it != bn_plans_.end()) return it->second.get();
  auto plan = std::make_unique<BnPlan>();
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->x));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->param));
  EDL_RETURN_IF_ERROR(SetNhwc(plan->x, CudnnType(act_), xs));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnDeriveBNTensorDescriptor(plan->param, plan->x, BnMode()));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      cudnn_, BnMode(), CUDNN_BATCHNORM_OPS_BN, plan->x, nullptr, plan->x, plan->param, nullptr,
      &plan->fwd_ws));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      cudnn_, BnMode(), CUDNN_BATCHNORM_OPS_BN, plan->x, plan->x, plan->x, nullptr, plan->x,
      plan->param, nullptr, &plan->bwd_ws));
  EDL_CUDNN_RETURN_IF_ERROR(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
      cudnn_, BnMode(), CUDNN_BATCHNORM_OPS_BN, nullptr, plan->x, &plan->reserve));
  BnPlan* raw = plan.get();
  bn_plans_[key] = std::move(plan);
  return raw;
}

namespace {

Status CheckBnShapes(const char* op, const Tensor& x, std::initializer_list<const Tensor*> vecs) {
  bool ok = x.rank() == 4 && FitsInt(x.shape());
  for (const Tensor* v : vecs)
    ok = ok && v->numel() == x.dim(1) && v->dtype() == DataType::kFloat32;
  if (ok) return Status::OK();
  return Status::InvalidArgument(std::string(op) + ": x " + x.DebugString() +
                                 " and its [C] vectors do not match");
}

}  // namespace

Status CudaBackend::BatchNormForwardTraining(const BatchNormParams& p, const Tensor& x,
                                             const Tensor& gamma, const Tensor& beta, Tensor* y,
                                             Tensor* save_mean, Tensor* save_invstd,
                                             Tensor* running_mean, Tensor* running_var) {
  EDL_RETURN_IF_ERROR(
      CheckBnShapes("BatchNormForwardTraining", x,
                    {&gamma, &beta, save_mean, save_invstd, running_mean, running_var}));
  if (x.shape() != y->shape()) return Status::InvalidArgument("BatchNormForwardTraining: y shape");
  auto plan = PlanBn(x.shape());
  if (!plan.ok()) return plan.status();
  BnPlan* b = plan.value();
  const void* xin = nullptr;
  void* yout = nullptr;
  EDL_RETURN_IF_ERROR(InNative(x, kSlotX, &xin));
  EDL_RETURN_IF_ERROR(OutNative(y, kSlotY, &yout));
  if (xin == yout) {  // y aliases x: cuDNN does not promise in-place, so read from a copy
    void* tmp = nullptr;
    const size_t bytes = x.numel() * ElemSize(act_);
    EDL_RETURN_IF_ERROR(ScratchFor(kSlotTmp, bytes, &tmp));
    EDL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tmp, xin, bytes, cudaMemcpyDeviceToDevice, stream_));
    xin = tmp;
  }
  std::unique_ptr<DeviceBuffer>& reserve = bn_reserve_[save_mean->raw()];
  if (!reserve) reserve = std::make_unique<DeviceBuffer>();
  if (b->reserve > 0) EDL_RETURN_IF_ERROR(reserve->Reserve(b->reserve, stream_));
  EDL_RETURN_IF_ERROR(EnsureWorkspace(b->fwd_ws));
  const float one = 1.f, zero = 0.f;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationForwardTrainingEx(
      cudnn_, BnMode(), CUDNN_BATCHNORM_OPS_BN, &one, &zero, b->x, xin, nullptr, nullptr, b->x,
      yout, b->param, gamma.raw(), beta.raw(), p.momentum, running_mean->raw(), running_var->raw(),
      std::max<double>(p.eps, CUDNN_BN_MIN_EPSILON), save_mean->raw(), save_invstd->raw(), nullptr,
      workspace_.get(), b->fwd_ws, reserve->get(), b->reserve));
  if (p.fuse_relu) {
    EDL_CUDA_RETURN_IF_ERROR(Relu(yout, yout, act_, x.numel(), stream_));
  }
  return FinishOut(y, kSlotY);
}

Status CudaBackend::BatchNormForwardInference(const BatchNormParams& p, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              Tensor* y) {
  EDL_RETURN_IF_ERROR(
      CheckBnShapes("BatchNormForwardInference", x, {&gamma, &beta, &running_mean, &running_var}));
  if (x.shape() != y->shape()) return Status::InvalidArgument("BatchNormForwardInference: y shape");
  auto plan = PlanBn(x.shape());
  if (!plan.ok()) return plan.status();
  BnPlan* b = plan.value();
  const void* xin = nullptr;
  void* yout = nullptr;
  EDL_RETURN_IF_ERROR(InNative(x, kSlotX, &xin));
  EDL_RETURN_IF_ERROR(OutNative(y, kSlotY, &yout));
  const float one = 1.f, zero = 0.f;
  // Inference is element-wise per channel, so in-place (y == x) is fine here.
  EDL_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationForwardInference(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, b->x, xin, b->x, yout, b->param, gamma.raw(),
      beta.raw(), running_mean.raw(), running_var.raw(),
      std::max<double>(p.eps, CUDNN_BN_MIN_EPSILON)));
  if (p.fuse_relu) {
    EDL_CUDA_RETURN_IF_ERROR(Relu(yout, yout, act_, x.numel(), stream_));
  }
  return FinishOut(y, kSlotY);
}

Status CudaBackend::BatchNormBackward(const BatchNormParams& p, const Tensor& x, const Tensor& dy,
                                      const Tensor* y, const Tensor& gamma, const Tensor& save_mean,
                                      const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                                      Tensor* dbeta) {
  EDL_RETURN_IF_ERROR(
      CheckBnShapes("BatchNormBackward", x, {&gamma, &save_mean, &save_invstd, dgamma, dbeta}));
  if (x.shape() != dy.shape() || x.shape() != dx->shape()) {
    return Status::InvalidArgument("BatchNormBackward: x, dy and dx shapes differ");
  }
  if (p.fuse_relu && (y == nullptr || y->shape() != x.shape())) {
    return Status::InvalidArgument("BatchNormBackward: fuse_relu needs the forward output y");
  }
  auto plan = PlanBn(x.shape());
  if (!plan.ok()) return plan.status();
  BnPlan* b = plan.value();
  auto reserve = bn_reserve_.find(save_mean.raw());
  if (b->reserve > 0 && (reserve == bn_reserve_.end() || reserve->second->get() == nullptr)) {
    return Status::FailedPrecondition(
        "BatchNormBackward: no training forward has run with this save_mean buffer");
  }
  const void *xin = nullptr, *dyin = nullptr;
  void* dxout = nullptr;
  EDL_RETURN_IF_ERROR(InNative(x, kSlotX, &xin));
  EDL_RETURN_IF_ERROR(InNative(dy, kSlotDY, &dyin));
  EDL_RETURN_IF_ERROR(OutNative(dx, kSlotDX, &dxout));
  const size_t bytes = x.numel() * ElemSize(act_);
  if (p.fuse_relu) {  // dy masked by y > 0, into a scratch (dx may alias dy)
    const void* yin = nullptr;
    void* masked = nullptr;
    EDL_RETURN_IF_ERROR(InNative(*y, kSlotY, &yin));
    EDL_RETURN_IF_ERROR(ScratchFor(kSlotTmp, bytes, &masked));
    EDL_CUDA_RETURN_IF_ERROR(cuda::ReluBackward(yin, dyin, masked, act_, x.numel(), stream_));
    dyin = masked;
  } else if (dyin == dxout) {
    void* copy = nullptr;
    EDL_RETURN_IF_ERROR(ScratchFor(kSlotTmp, bytes, &copy));
    EDL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy, dyin, bytes, cudaMemcpyDeviceToDevice, stream_));
    dyin = copy;
  }
  EDL_RETURN_IF_ERROR(EnsureWorkspace(b->bwd_ws));
  const float one = 1.f, zero = 0.f, unscale = 1.f / loss_scale_;
  EDL_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationBackwardEx(
      cudnn_, BnMode(), CUDNN_BATCHNORM_OPS_BN, &one, &zero, &unscale, &zero, b->x, xin, nullptr,
      nullptr, b->x, dyin, nullptr, nullptr, b->x, dxout, b->param, gamma.raw(),
      /*bnBiasData (unused without activation)=*/gamma.raw(), dgamma->raw(), dbeta->raw(),
      std::max<double>(p.eps, CUDNN_BN_MIN_EPSILON), save_mean.raw(), save_invstd.raw(), nullptr,
      workspace_.get(), b->bwd_ws, b->reserve > 0 ? reserve->second->get() : nullptr, b->reserve));
  return FinishOut(dx, kSlotDX);
}

}  // namespace edl::resnet50::cuda
