// Clang thread-safety annotations (-Wthread-safety, enabled in clang builds by the top-level
// CMakeLists.txt): the compiler checks that a member marked GUARDED_BY(mu_) is only touched with
// mu_ held. Under gcc the macros expand to nothing.
//
// libstdc++'s std::mutex carries no capability attribute, so annotated members are guarded by
// edl::Mutex (a std::mutex with the attribute) and locked with edl::MutexLock, which also hands
// std::condition_variable the std::unique_lock it needs. A wait predicate that reads guarded
// members is a lambda marked REQUIRES(mu_): std::condition_variable calls it with the lock held.
//
// Thread-safety: Mutex and MutexLock are what their names say; MutexLock belongs to one thread.
#pragma once

#include <mutex>

#if defined(__clang__)
#define EDL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define EDL_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) EDL_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY EDL_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) EDL_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) EDL_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) EDL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) EDL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) EDL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) EDL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) EDL_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS EDL_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace edl {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `*mu` from construction to destruction (std::lock_guard with the annotations).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases / re-takes the mutex before destruction (a long write without the lock).
  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

  // For std::condition_variable::wait*: the waits release and re-acquire the mutex inside, and
  // return with it held, so the capability stays held from the analysis' point of view.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace edl
