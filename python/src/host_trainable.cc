#include "python/src/host_trainable.h"

#include <pybind11/stl.h>

#include <cstring>
#include <set>
#include <tuple>

namespace edl::python {

namespace {

// The dtype names edl.torch passes (torch.float32 -> "float32", ...).
bool ParseDataType(const std::string& name, DataType* out) {
  static const std::pair<const char*, DataType> kTypes[] = {
      {"float32", DataType::kFloat32}, {"float64", DataType::kFloat64},
      {"int64", DataType::kInt64},     {"int32", DataType::kInt32},
      {"uint8", DataType::kUInt8},     {"bfloat16", DataType::kBFloat16},
      {"float16", DataType::kFloat16}};
  for (const auto& [n, t] : kTypes) {
    if (name == n) {
      *out = t;
      return true;
    }
  }
  return false;
}

}  // namespace

HostTrainable::~HostTrainable() = default;

void HostTrainable::SetState(const py::sequence& tensors) {
  std::vector<runtime::StateTensor> state;
  std::vector<py::object> owners;
  std::set<std::string> names;
  for (const py::handle item : tensors) {
    auto [name, owner, ptr, shape, dtype, nbytes, per_rank] =
        py::cast<std::tuple<std::string, py::object, uintptr_t, std::vector<int64_t>, std::string,
                            size_t, bool>>(item);
    runtime::StateTensor t;
    t.name = name;
    t.shape = shape;
    t.per_rank = per_rank;
    if (!ParseDataType(dtype, &t.dtype)) {
      throw py::value_error("state tensor '" + name + "' has dtype " + dtype +
                            ", which edl cannot carry; use float32, float64, bfloat16, float16, "
                            "int64, int32 or uint8");
    }
    size_t elements = 1;
    for (int64_t d : shape) {
      if (d < 0) throw py::value_error("state tensor '" + name + "' has a negative dimension");
      elements *= static_cast<size_t>(d);
    }
    if (elements * DataTypeSize(t.dtype) != nbytes) {
      throw py::value_error("state tensor '" + name + "': " + std::to_string(nbytes) +
                            " bytes registered for its shape and dtype (not contiguous?)");
    }
    if (ptr == 0 && nbytes > 0) throw py::value_error("state tensor '" + name + "' has no memory");
    if (!names.insert(name).second) {
      throw py::value_error("two state tensors are named '" + name + "'");
    }
    t.data = reinterpret_cast<void*>(ptr);
    t.bytes = nbytes;
    state.push_back(std::move(t));
    owners.push_back(std::move(owner));
  }
  state_ = std::move(state);
  owners_ = std::move(owners);
}

void HostTrainable::SetGradients(py::object owner, uintptr_t data_ptr, size_t count) {
  if (data_ptr == 0) throw py::value_error("the gradient buffer has no memory");
  grad_owner_ = std::move(owner);
  grad_ = reinterpret_cast<float*>(data_ptr);
  grad_count_ = count;
}

void HostTrainable::SetSizes(int64_t train_size, int64_t test_size) {
  if (train_size <= 0) throw py::value_error("the training set is empty");
  if (test_size < 0) throw py::value_error("negative test set size");
  train_size_ = train_size;
  test_size_ = test_size;
}

float* HostTrainable::GradientBuffer(size_t* count) {
  *count = grad_count_;
  return grad_;
}

Status HostTrainable::ScaleGradients(float factor) {
  for (size_t i = 0; i < grad_count_; ++i) grad_[i] *= factor;
  return Status::OK();
}

Status HostTrainable::CopyToHost(const runtime::StateTensor& t, void* dst) {
  if (t.bytes > 0) std::memcpy(dst, t.data, t.bytes);
  return Status::OK();
}

Status HostTrainable::CopyFromHost(const runtime::StateTensor& t, const void* src) {
  if (t.bytes > 0) std::memcpy(t.data, src, t.bytes);
  return Status::OK();
}

}  // namespace edl::python
