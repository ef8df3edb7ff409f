// DecodePool: `threads` threads that share the samples of one batch (--data_threads). The calling
// thread is one of them, so threads = 1 starts no thread. Which thread prepares a sample never
// changes its result: every sample is computed from its own inputs into its own output slot.
//
// Thread-safety: ParallelFor may be called from several threads; calls run one at a time (a batch
// being filled ahead by the prefetch thread and one filled on the spot by the training thread
// queue behind each other). The destructor joins the threads. REQUIRES: no ParallelFor running
// when the pool is destroyed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "edl/base/thread_annotations.h"

namespace edl::resnet50 {

class DecodePool {
 public:
  // REQUIRES: threads >= 1.
  explicit DecodePool(int threads);
  ~DecodePool();
  DecodePool(const DecodePool&) = delete;
  DecodePool& operator=(const DecodePool&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(i, worker) for every i in [0, n), spread over the threads; `worker` in
  // [0, threads()) names the thread (for per-thread scratch such as a decoder). Returns when all
  // calls have returned.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn);

 private:
  void HelperLoop(int worker);
  // Calls fn(i, worker) for the indices it claims, until all n are claimed.
  void Drain(const std::function<void(int64_t, int)>& fn, int64_t n, int worker);

  Mutex run_mu_;  // one ParallelFor at a time: a round's fn_ and n_ stay until it ends

  Mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int)>* fn_ GUARDED_BY(mu_) = nullptr;
  int64_t n_ GUARDED_BY(mu_) = 0;
  uint64_t round_ GUARDED_BY(mu_) = 0;  // bumped for every ParallelFor
  int busy_ GUARDED_BY(mu_) = 0;        // helpers still draining this round
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> next_{0};  // next index to claim

  std::vector<std::thread> helpers_;
};

}  // namespace edl::resnet50
