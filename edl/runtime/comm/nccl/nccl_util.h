// Helpers of the NCCL communicator (CUDA plugin only): error statuses with a hint, the unique id
// as hex, the bounded poll that every NCCL wait goes through, and the pinned host blocks that
// carry host arguments of collectives. See nccl_communicator.cc for how they are used and
// docs/ARCHITECTURE.md ("The NCCL re-form state machine") for what bounds each call.
//
// Thread-safety: PinnedPool and Reaper are thread-safe; the rest are pure functions or per-call
// objects.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "edl/base/status.h"
#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime::nccl {

using Clock = std::chrono::steady_clock;

// Bytes of one pinned host-argument block (and of the device slot it is staged through). Larger
// host arguments go through in slices of this size (they are scalars in practice).
inline constexpr size_t kHostArgBytes = 64 * 1024;

Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line);
Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line);

#define EDL_NCCL_CHECK(expr)                                                  \
  do {                                                                        \
    const ncclResult_t _r = (expr);                                           \
    if (_r != ncclSuccess && _r != ncclInProgress) {                          \
      return ::edl::runtime::nccl::NcclStatus(_r, #expr, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)
#define EDL_CUDA_CHECK(expr)                                                                       \
  do {                                                                                             \
    const cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess) return ::edl::runtime::nccl::CudaStatus(_e, #expr, __FILE__, __LINE__); \
  } while (0)

ncclDataType_t ToNccl(DataType t);
std::string ToHex(const void* data, size_t n);
bool FromHex(const std::string& hex, void* data, size_t n);

// What one wait polls besides its own completion: the communicator's asynchronous error (when
// `comm` is set), the abort flag, the interrupt (every kInterruptEvery) and the deadline.
struct WaitScope {
  std::string name;  // "NCCL communicator (generation 7, rank 1/4)", for messages
  const char* what = "";
  ncclComm_t comm = nullptr;
  const std::atomic<bool>* aborted = nullptr;
  const std::function<Status(CommPhase)>* interrupt = nullptr;
  CommPhase phase = CommPhase::kCollective;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
};

// Polls `done` (StatusOr<bool>: true = finished) until it finishes, fails, or one of the scope's
// conditions ends the wait; never blocks longer than one nap (<= 1 ms) between polls.
Status PollUntil(const WaitScope& scope, const std::function<StatusOr<bool>()>& done);

// Pinned (page-locked, portable) host blocks of kHostArgBytes for host arguments: a copy between
// pageable memory and the device is synchronous for the host (it returns only once the stream
// reaches it, which a collective stuck on a dead peer never lets happen), a copy from or to pinned
// memory is not. A block comes back with the event recorded after the last copy that uses it and
// is handed out again only once that event has completed, so a device-to-host copy still queued
// behind an aborted collective never writes into another communicator's arguments. Blocks are
// never freed: cudaFreeHost synchronises with the device, which a stuck stream would block; the
// pool holds one block per communicator alive at once (two or three) plus any whose stream never
// drained.
class PinnedPool {
 public:
  static PinnedPool& Get();
  StatusOr<void*> Take();
  // Takes ownership of `last_use` (may be null: the block is free at once).
  void Give(void* block, cudaEvent_t last_use);

 private:
  Mutex mu_;
  std::vector<std::pair<void*, cudaEvent_t>> free_ GUARDED_BY(mu_);
};

// Aborts communicators off the caller's thread. ncclCommAbort sets NCCL's abort flag (which ends
// the NCCL kernels at once) and then frees the communicator, and the frees synchronise with the
// device: while other work on a stream has not drained (a kernel or host function of the trainer
// behind the stuck collective) they wait for it. A collective that must return within one poll of
// Abort(), a watcher and a failing init therefore hand the handle here and go on; one process-wide
// thread aborts the handles in order. Each handle is aborted exactly once and is never used again
// by the caller. A handle whose abort is stuck delays only the ones queued after it, never a
// caller; the re-form builds its next communicator meanwhile (NCCL allows several at once).
class Reaper {
 public:
  static Reaper& Get();
  // Queues ncclCommAbort(comm) on device `device`; returns at once. Null handles are ignored.
  void Abort(ncclComm_t comm, int device);

 private:
  void Loop();

  Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<ncclComm_t, int>> queue_ GUARDED_BY(mu_);
  bool started_ GUARDED_BY(mu_) = false;
};

}  // namespace edl::runtime::nccl
