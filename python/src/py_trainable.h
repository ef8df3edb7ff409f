// PyTrainable: a runtime::Trainable whose model, optimizer and data loader live in Python
// (edl.torch), so a PyTorch program is an in-place trainer of the same ElasticTrainer as
// `edl train` (docs/PYTORCH.md, "PyTorch, in place").
//
// The split: what the runtime touches every step or from its own bookkeeping stays in C++ over
// memory Python registered once (SetState, SetGradients): the state tensors' bytes (copied,
// broadcast, hashed and checkpointed with memcpy), the flat gradient buffer the communicator
// all-reduces in place, ScaleGradients and the fingerprint. Only the compute goes to Python,
// through methods a Python subclass defines (the trampoline): forward_backward(indices) ->
// (loss_sum, correct, samples, label_hash), apply_update(lr), evaluate(indices) -> (loss_sum,
// correct, samples), and optionally prefetch(epoch, indices), set_epoch(epoch) and
// warm_up(indices) (default: forward_backward); indices are int64 numpy arrays. Each C++ override
// takes the GIL for the call and nothing else.
//
// A hook that raises is turned into an Aborted Status naming the hook and the exception, which ends
// ElasticTrainer::Run; the exception itself is kept (error()) so the binding re-raises it as the
// cause of its own. After one failure every later hook fails at once without calling Python.
//
// Registered memory: CPU tensors only (on_device() is false; the communicator is Gloo). Python
// keeps every registered tensor alive and in place (its data pointer never changes) for as long as
// the trainable is used; the objects are held here as well, so they outlive a Run.
//
// Thread-safety: the runtime calls every Trainable method on its one training thread (which
// holds no GIL between calls). SetState / SetGradients / SetSizes / SetFingerprint / error() are
// called from Python with the GIL held, never during a Run.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "edl/runtime/trainable.h"

namespace edl::python {

namespace py = pybind11;

class PyTrainable : public runtime::Trainable {
 public:
  PyTrainable() = default;
  ~PyTrainable() override;
  PyTrainable(const PyTrainable&) = delete;
  PyTrainable& operator=(const PyTrainable&) = delete;

  // ---- registration (Python, GIL held)
  // `tensors`: a sequence of (name, owner, data_ptr, shape, dtype, nbytes, per_rank), where dtype
  // is "float32", "float64", "int64", "int32", "uint8", "bfloat16" or "float16" and owner the
  // object that keeps the memory alive. Throws ValueError naming the tensor for a bad entry.
  void SetState(const py::sequence& tensors);
  // The flat float32 gradient buffer: `count` gradient floats followed by kInbandSlots spare ones
  // at `data_ptr`, kept alive by `owner`.
  void SetGradients(py::object owner, uintptr_t data_ptr, size_t count);
  void SetSizes(int64_t train_size, int64_t test_size);
  // Describes the model and optimizer (checkpoints and peers with another one are refused).
  void SetFingerprint(std::string fingerprint) { fingerprint_ = std::move(fingerprint); }
  // The exception the first failing hook raised (None when none did).
  py::object error() const;
  // Raises `type`(message) in Python, with the exception a hook raised (if one did) as its cause.
  [[noreturn]] void Raise(py::handle type, const std::string& message);
  // Marks the trainable failed by a Python error outside a hook (an observer callback, raised in
  // `where`), unless it failed already: every later hook returns that failure instead of calling
  // Python, and Raise() makes the exception the cause. GIL held.
  void Fail(py::error_already_set& e, const std::string& where);

  // ---- runtime::Trainable (the runtime's training thread)
  bool on_device() const override { return false; }
  std::vector<runtime::StateTensor> StateTensors() override { return state_; }
  float* GradientBuffer(size_t* count) override;
  Status ScaleGradients(float factor) override;
  int64_t train_size() const override { return train_size_; }
  int64_t test_size() const override { return test_size_; }
  void Prefetch(int64_t epoch, const std::vector<int64_t>& indices) override;
  void SetEpoch(int64_t epoch) override;
  Status ForwardBackward(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  Status WarmUpStep(const std::vector<int64_t>& indices) override;
  Status ApplyUpdate(double lr) override;
  Status Evaluate(const std::vector<int64_t>& indices, runtime::StepStats* stats) override;
  std::string Fingerprint() const override { return fingerprint_; }
  Status CopyToHost(const runtime::StateTensor& t, void* dst) override;
  Status CopyFromHost(const runtime::StateTensor& t, const void* src) override;

 private:
  // Calls the Python method `name` with the GIL held: `body` gets the bound method. A Python
  // exception or a return value of the wrong type becomes Aborted naming `name` (and is kept). A
  // method the subclass does not define is InvalidArgument when `required`, else skipped.
  Status Hook(const char* name, const std::function<void(const py::function&)>& body,
              bool required = true);

  std::vector<runtime::StateTensor> state_;
  std::vector<py::object> owners_;  // keep the registered memory alive (released with the GIL)
  py::object grad_owner_;
  float* grad_ = nullptr;
  size_t grad_count_ = 0;
  int64_t train_size_ = 0, test_size_ = 0;
  std::string fingerprint_;
  Status failed_;  // the first hook failure: later hooks return it without calling Python
  std::unique_ptr<py::error_already_set> error_;  // its Python exception, if it was one
};

}  // namespace edl::python
