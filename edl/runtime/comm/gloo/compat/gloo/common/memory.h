// Stand-in for gloo/common/memory.h, which Debian's libgloo-dev (0.0~git20220518) references from
// gloo/transport/tcp/pair.h but does not ship. Only gloo_communicator.cc sees this folder, and only
// to name tcp::Pair (for Abort); it never creates, copies or inspects these pointer types, so only
// their names and shapes matter here. Written for EDL; remove once the package ships the header.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;

// A strong reference to an object owned elsewhere, taken from a WeakNonOwningPtr.
template <typename T>
class NonOwningPtr {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak) : ptr_(weak.ptr_.lock()) {}
  T* get() const { return ptr_.get(); }
  T* operator->() const { return ptr_.get(); }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  std::shared_ptr<T> ptr_;
};

// The owner side: hands out weak references to `this` without owning it.
template <typename T>
class ShareableNonOwningPtr {
 public:
  explicit ShareableNonOwningPtr(T* ptr) : ptr_(ptr, [](T*) {}) {}

 private:
  std::shared_ptr<T> ptr_;
  friend class WeakNonOwningPtr<T>;
};

template <typename T>
class WeakNonOwningPtr {
 public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& owner) : ptr_(owner.ptr_) {}

 private:
  std::weak_ptr<T> ptr_;
  friend class NonOwningPtr<T>;
};

}  // namespace gloo
