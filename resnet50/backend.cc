// Tensor bookkeeping and the backend factory (device-neutral parts of backend.h).
#include "resnet50/backend.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "edl/runtime/cuda_plugin.h"

namespace edl::resnet50 {

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kNCHW:
      return "nchw";
    case Layout::kNHWC:
      return "nhwc";
    case Layout::kNative:
      return "native";
  }
  return "?";
}

Tensor::Tensor(Backend* backend, Shape shape, Layout layout, DataType dtype)
    : backend_(backend), shape_(std::move(shape)), layout_(layout), dtype_(dtype) {
  bytes_ = backend_->BytesFor(shape_, layout_, dtype_);
  data_ = backend_->Allocate(bytes_ == 0 ? 64 : bytes_);
  owned_ = true;
}

Tensor Tensor::View(Backend* backend, void* data, Shape shape, Layout layout, DataType dtype) {
  Tensor t;
  t.backend_ = backend;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.layout_ = layout;
  t.dtype_ = dtype;
  t.bytes_ = backend->BytesFor(t.shape_, layout, dtype);
  t.owned_ = false;
  return t;
}

Tensor::~Tensor() { Release(); }

void Tensor::Release() {
  if (owned_ && data_ != nullptr) backend_->Free(data_);
  data_ = nullptr;
  owned_ = false;
}

Tensor::Tensor(Tensor&& o) noexcept { *this = std::move(o); }

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    Release();
    backend_ = o.backend_;
    data_ = o.data_;
    shape_ = std::move(o.shape_);
    layout_ = o.layout_;
    dtype_ = o.dtype_;
    bytes_ = o.bytes_;
    owned_ = o.owned_;
    o.data_ = nullptr;
    o.owned_ = false;
  }
  return *this;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

std::string Tensor::DebugString() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? "," : "") << shape_[i];
  os << "] " << (dtype_ == DataType::kInt32 ? "i32" : "fp32") << " " << LayoutName(layout_);
  return os.str();
}

// The CUDA backend lives in the CUDA plugin (edl/runtime/cuda_plugin.h): load it, then call its
// entry point (resnet50/cuda/cuda_backend.cc). Without the plugin: FailedPrecondition naming the
// missing file or library and the fix.
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  using Entry = void(const BackendOptions*, StatusOr<std::unique_ptr<Backend>>*);
  auto fn = runtime::CudaPluginFunction<Entry>("edl_resnet50_new_cuda_backend_v1");
  if (!fn.ok()) return Status::FailedPrecondition("--device cuda: " + fn.status().message());
  StatusOr<std::unique_ptr<Backend>> out(
      Status::Internal("the CUDA plugin's backend entry point returned nothing"));
  fn.value()(&options, &out);
  return out;
}

Status CheckSgdRange(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                     int64_t offset, int64_t count) {
  const int64_t n = static_cast<int64_t>(params.bytes() / sizeof(float));
  if (offset < 0 || count < 0 || offset + count > n ||
      grads.bytes() < static_cast<size_t>(offset + count) * sizeof(float) ||
      momentum.bytes() < static_cast<size_t>(offset + count) * sizeof(float)) {
    return Status::InvalidArgument("SgdUpdate: range outside the flat buffers");
  }
  return Status::OK();
}

StatusOr<int> ResolveCudaDevice(int requested, int hint, int visible) {
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string seen =
      std::to_string(visible) + " CUDA device" + (visible == 1 ? "" : "s") + " visible" +
      (cvd != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + cvd + ")" : "");
  if (visible <= 0) {
    return Status::InvalidArgument(
        "--device cuda: " + seen +
        "; check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu");
  }
  if (requested == kAutoCudaDevice) return visible > 1 ? std::max(hint, 0) % visible : 0;
  if (requested < 0 || requested >= visible) {
    return Status::InvalidArgument(
        "--cuda_device " + std::to_string(requested) + " is out of range: " + seen + "; use 0.." +
        std::to_string(visible - 1) +
        ", or leave it unset (the slot, or LOCAL_RANK, modulo the visible devices)");
  }
  return requested;
}

StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                 const BackendOptions& options) {
  if (name == "cpu") return CreateCpuBackend(options);
  if (name == "cuda") return CreateCudaBackend(options);
  return Status::InvalidArgument("unknown backend '" + name + "'; use cpu or cuda");
}

}  // namespace edl::resnet50
