// HostTrainable: the part of a runtime::Trainable over memory Python registered once, shared by
// edl.torch's two ways of training (docs/PYTORCH.md): PyTrainable (the runtime calls the model
// through Python hooks) and OwnLoop (the user's own loop hands each step over).
//
// What the runtime touches every step or from its own bookkeeping stays in C++ over that memory:
// the state tensors' bytes (copied, broadcast, hashed and checkpointed with memcpy), the flat
// gradient buffer the communicator all-reduces in place, ScaleGradients and the fingerprint.
// Registered memory: CPU tensors only (on_device() is false; the communicator is Gloo). Python
// keeps every registered tensor alive and in place (its data pointer never changes) for as long as
// the trainable is used; the objects are held here as well, so they outlive a run.
//
// Thread-safety: SetState / SetGradients / SetSizes / SetFingerprint are called from Python with
// the GIL held, never while a run uses the trainable; the runtime::Trainable methods are called on
// the runtime's one training thread, which never takes the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "edl/runtime/trainable.h"

namespace edl::python {

namespace py = pybind11;

class HostTrainable : public runtime::Trainable {
 public:
  HostTrainable() = default;
  ~HostTrainable() override;
  HostTrainable(const HostTrainable&) = delete;
  HostTrainable& operator=(const HostTrainable&) = delete;

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

  // ---- runtime::Trainable (the runtime's training thread)
  bool on_device() const override { return false; }
  std::vector<runtime::StateTensor> StateTensors() override { return state_; }
  float* GradientBuffer(size_t* count) override;
  Status ScaleGradients(float factor) override;
  int64_t train_size() const override { return train_size_; }
  int64_t test_size() const override { return test_size_; }
  std::string Fingerprint() const override { return fingerprint_; }
  Status CopyToHost(const runtime::StateTensor& t, void* dst) override;
  Status CopyFromHost(const runtime::StateTensor& t, const void* src) override;

 private:
  std::vector<runtime::StateTensor> state_;
  std::vector<py::object> owners_;  // keep the registered memory alive (released with the GIL)
  py::object grad_owner_;
  float* grad_ = nullptr;
  size_t grad_count_ = 0;
  int64_t train_size_ = 0, test_size_ = 0;
  std::string fingerprint_;
};

}  // namespace edl::python
