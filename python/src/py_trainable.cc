#include "python/src/py_trainable.h"

#include <pybind11/numpy.h>
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

py::array_t<int64_t> ToArray(const std::vector<int64_t>& v) {
  return py::array_t<int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
}

}  // namespace

PyTrainable::~PyTrainable() = default;

void PyTrainable::SetState(const py::sequence& tensors) {
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

void PyTrainable::SetGradients(py::object owner, uintptr_t data_ptr, size_t count) {
  if (data_ptr == 0) throw py::value_error("the gradient buffer has no memory");
  grad_owner_ = std::move(owner);
  grad_ = reinterpret_cast<float*>(data_ptr);
  grad_count_ = count;
}

void PyTrainable::SetSizes(int64_t train_size, int64_t test_size) {
  if (train_size <= 0) throw py::value_error("the training set is empty");
  if (test_size < 0) throw py::value_error("negative test set size");
  train_size_ = train_size;
  test_size_ = test_size;
}

py::object PyTrainable::error() const {
  if (!error_) return py::none();
  return error_->value();
}

void PyTrainable::Fail(py::error_already_set& e, const std::string& where) {
  if (!failed_.ok()) return;
  failed_ = Status::Aborted(where + " raised " + std::string(py::str(e.type().attr("__name__"))) +
                            ": " + std::string(py::str(e.value())));
  error_ = std::make_unique<py::error_already_set>(e);
}

void PyTrainable::Raise(py::handle type, const std::string& message) {
  if (error_) {
    py::raise_from(*error_, type.ptr(), message.c_str());
  } else {
    PyErr_SetString(type.ptr(), message.c_str());
  }
  throw py::error_already_set();
}

float* PyTrainable::GradientBuffer(size_t* count) {
  *count = grad_count_;
  return grad_;
}

Status PyTrainable::ScaleGradients(float factor) {
  for (size_t i = 0; i < grad_count_; ++i) grad_[i] *= factor;
  return Status::OK();
}

Status PyTrainable::CopyToHost(const runtime::StateTensor& t, void* dst) {
  if (t.bytes > 0) std::memcpy(dst, t.data, t.bytes);
  return Status::OK();
}

Status PyTrainable::CopyFromHost(const runtime::StateTensor& t, const void* src) {
  if (t.bytes > 0) std::memcpy(t.data, src, t.bytes);
  return Status::OK();
}

Status PyTrainable::Hook(const char* name, const std::function<void(const py::function&)>& body,
                         bool required) {
  py::gil_scoped_acquire gil;
  if (!failed_.ok()) return failed_;
  try {
    py::function f = py::get_override(this, name);
    if (!f) {
      if (!required) return Status::OK();
      failed_ = Status::InvalidArgument(std::string("the edl.Trainable subclass defines no ") +
                                        name + "()");
      return failed_;
    }
    body(f);
    return Status::OK();
  } catch (py::error_already_set& e) {
    Fail(e, std::string(name) + "()");
  } catch (const py::cast_error& e) {
    failed_ =
        Status::Aborted(std::string(name) + "() returned a value of the wrong type: " + e.what());
  }
  return failed_;
}

void PyTrainable::Prefetch(int64_t epoch, const std::vector<int64_t>& indices) {
  // A hint: a failure is kept (failed_) and shows at the next ForwardBackward (every hook fails
  // once one has), so the Status is not needed here.
  (void)Hook("prefetch", [&](const py::function& f) { f(epoch, ToArray(indices)); }, false);
}

void PyTrainable::SetEpoch(int64_t epoch) {
  // As Prefetch: a failure is kept and reported by the next step.
  (void)Hook("set_epoch", [&](const py::function& f) { f(epoch); }, false);
}

Status PyTrainable::ForwardBackward(const std::vector<int64_t>& indices,
                                    runtime::StepStats* stats) {
  return Hook("forward_backward", [&](const py::function& f) {
    auto [loss_sum, correct, samples, label_hash] =
        f(ToArray(indices)).cast<std::tuple<double, int64_t, int64_t, uint64_t>>();
    stats->loss_sum = loss_sum;
    stats->correct = correct;
    stats->samples = samples;
    stats->label_hash = label_hash;
  });
}

Status PyTrainable::WarmUpStep(const std::vector<int64_t>& indices) {
  bool defined = true;
  {
    py::gil_scoped_acquire gil;
    defined = static_cast<bool>(py::get_override(this, "warm_up"));
  }
  if (!defined) return runtime::Trainable::WarmUpStep(indices);  // a forward_backward
  return Hook("warm_up", [&](const py::function& f) { f(ToArray(indices)); });
}

Status PyTrainable::ApplyUpdate(double lr) {
  return Hook("apply_update", [&](const py::function& f) { f(lr); });
}

Status PyTrainable::Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) {
  return Hook("evaluate", [&](const py::function& f) {
    auto [loss_sum, correct, samples] =
        f(ToArray(indices)).cast<std::tuple<double, int64_t, int64_t>>();
    stats->loss_sum = loss_sum;
    stats->correct = correct;
    stats->samples = samples;
  });
}

}  // namespace edl::python
