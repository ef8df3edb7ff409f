#include "python/src/py_trainable.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <tuple>

namespace edl::python {

namespace {

py::array_t<int64_t> ToArray(const std::vector<int64_t>& v) {
  return py::array_t<int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
}

}  // namespace

PyTrainable::~PyTrainable() = default;

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
  (void)Hook(
      "prefetch", [&](const py::function& f) { f(epoch, ToArray(indices)); }, false);
}

void PyTrainable::SetEpoch(int64_t epoch) {
  // As Prefetch: a failure is kept and reported by the next step.
  (void)Hook(
      "set_epoch", [&](const py::function& f) { f(epoch); }, false);
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
