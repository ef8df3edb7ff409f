// ThreadChecker: the assertion behind "Thread-safety: none; one thread only". A class whose
// methods must all run on one thread (a daemon's io_context thread) holds one and checks it at its
// entry points with EDL_DCHECK_OWNING_THREAD; a call from another thread then fails the DCHECK
// (debug and sanitizer builds; nothing is checked or evaluated under NDEBUG).
//
// The checker belongs to the first thread that checks it. Detach() gives it up, so that the next
// thread to check takes it over: an object set up on one thread and then run by another.
//
// Thread-safety: CalledOnOwningThread and Detach may be called from any thread.
#pragma once

#include <glog/logging.h>

#include <atomic>
#include <thread>

namespace edl {

class ThreadChecker {
 public:
  // True on the owning thread; the first call makes its thread the owner.
  bool CalledOnOwningThread() const {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id owner = owner_.load();
    if (owner == std::thread::id() && owner_.compare_exchange_strong(owner, me)) return true;
    return owner == me;
  }
  void Detach() { owner_.store(std::thread::id()); }

 private:
  mutable std::atomic<std::thread::id> owner_{};
};

}  // namespace edl

#define EDL_DCHECK_OWNING_THREAD(checker) \
  DCHECK((checker).CalledOnOwningThread()) << "called off the one thread this object runs on"
