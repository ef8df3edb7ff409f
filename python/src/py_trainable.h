// PyTrainable: a runtime::Trainable whose model, optimizer and data loader live in Python
// (edl.torch), so a PyTorch program is an in-place trainer of the same ElasticTrainer as
// `edl train` (docs/PYTORCH.md, "PyTorch, in place").
//
// The registered memory and everything the runtime does with it are HostTrainable's
// (python/src/host_trainable.h); only the compute goes to Python, through methods a Python
// subclass defines (the trampoline): forward_backward(indices) -> (loss_sum, correct, samples,
// label_hash), apply_update(lr), evaluate(indices) -> (loss_sum, correct, samples), and optionally
// prefetch(epoch, indices), set_epoch(epoch) and warm_up(indices) (default: forward_backward);
// indices are int64 numpy arrays. Each C++ override takes the GIL for the call and nothing else.
//
// A hook that raises is turned into an Aborted Status naming the hook and the exception, which ends
// ElasticTrainer::Run; the exception itself is kept (error()) so the binding re-raises it as the
// cause of its own. After one failure every later hook fails at once without calling Python.
//
// Thread-safety: the runtime calls every Trainable method on its one training thread (which
// holds no GIL between calls). error(), Raise() and Fail() are called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "python/src/host_trainable.h"

namespace edl::python {

namespace py = pybind11;

class PyTrainable : public HostTrainable {
 public:
  PyTrainable() = default;
  ~PyTrainable() override;
  PyTrainable(const PyTrainable&) = delete;
  PyTrainable& operator=(const PyTrainable&) = delete;

  // The exception the first failing hook raised (None when none did).
  py::object error() const;
  // Raises `type`(message) in Python, with the exception a hook raised (if one did) as its cause.
  [[noreturn]] void Raise(py::handle type, const std::string& message);
  // Marks the trainable failed by a Python error outside a hook (an observer callback, raised in
  // `where`), unless it failed already: every later hook returns that failure instead of calling
  // Python, and Raise() makes the exception the cause. GIL held.
  void Fail(py::error_already_set& e, const std::string& where);

  // ---- runtime::Trainable (the runtime's training thread)
  void Prefetch(int64_t epoch, const std::vector<int64_t>& indices) override;
  void SetEpoch(int64_t epoch) override;
  Status ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  Status WarmUpStep(const std::vector<int64_t>& indices) override;
  Status ApplyUpdate(double lr) override;
  Status Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;

 private:
  // Calls the Python method `name` with the GIL held: `body` gets the bound method. A Python
  // exception or a return value of the wrong type becomes Aborted naming `name` (and is kept). A
  // method the subclass does not define is InvalidArgument when `required`, else skipped.
  Status Hook(const char* name, const std::function<void(const py::function&)>& body,
              bool required = true);

  Status failed_;  // the first hook failure: later hooks return it without calling Python
  std::unique_ptr<py::error_already_set> error_;  // its Python exception, if it was one
};

}  // namespace edl::python
