#include "resnet50/data/decode_pool.h"

namespace edl::resnet50 {

DecodePool::DecodePool(int threads) {
  for (int w = 1; w < threads; ++w) helpers_.emplace_back([this, w] { HelperLoop(w); });
}

DecodePool::~DecodePool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void DecodePool::Drain(const std::function<void(int64_t, int)>& fn, int64_t n, int worker) {
  while (true) {
    const int64_t i = next_.fetch_add(1);
    if (i >= n) return;
    fn(i, worker);
  }
}

void DecodePool::HelperLoop(int worker) {
  uint64_t seen = 0;
  MutexLock lock(&mu_);
  while (true) {
    start_cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return stop_ || round_ != seen; });
    if (stop_) return;
    seen = round_;
    // Both stay valid until this helper's busy_ count is given back (ParallelFor waits for it).
    const std::function<void(int64_t, int)>& fn = *fn_;
    const int64_t n = n_;
    lock.Unlock();
    Drain(fn, n, worker);
    lock.Lock();
    if (--busy_ == 0) done_cv_.notify_all();
  }
}

void DecodePool::ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn) {
  MutexLock run(&run_mu_);
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    busy_ = static_cast<int>(helpers_.size());
    ++round_;
  }
  start_cv_.notify_all();
  Drain(fn, n, 0);
  MutexLock lock(&mu_);
  done_cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return busy_ == 0; });
  fn_ = nullptr;
}

}  // namespace edl::resnet50
