// HostStaging: the elastic runtime's host-side staging buffer for gradients and state (the Gloo
// path on a device Trainable, elastic_trainer.cc).
#pragma once

#include <cstddef>

#include "edl/runtime/trainable.h"

namespace edl::runtime {

// A host buffer from Trainable::AllocateHostStaging (page-locked on CUDA), grown on demand and
// kept: every step and every re-form reuse it.
class HostStaging {
 public:
  explicit HostStaging(Trainable* t) : t_(t) {}
  ~HostStaging() { Release(); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // At least `bytes` bytes; contents undefined after growing. nullptr when out of memory.
  char* Get(size_t bytes) {
    if (bytes > size_) {
      Release();
      data_ = static_cast<char*>(t_->AllocateHostStaging(bytes));
      size_ = data_ != nullptr ? bytes : 0;
    }
    return data_;
  }

 private:
  void Release() {
    if (data_ != nullptr) t_->FreeHostStaging(data_);
    data_ = nullptr;
    size_ = 0;
  }
  Trainable* const t_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace edl::runtime
