#include "resnet50/data/decode_pool.h"

namespace edl::resnet50 {

DecodePool::DecodePool(int threads) {
  for (int w = 1; w < threads; ++w) helpers_.emplace_back([this, w] { HelperLoop(w); });
}

DecodePool::~DecodePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void DecodePool::Drain(int worker) {
  while (true) {
    const int64_t i = next_.fetch_add(1);
    if (i >= n_) return;
    (*fn_)(i, worker);
  }
}

void DecodePool::HelperLoop(int worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || round_ != seen; });
    if (stop_) return;
    seen = round_;
    lock.unlock();
    Drain(worker);
    lock.lock();
    if (--busy_ == 0) done_cv_.notify_all();
  }
}

void DecodePool::ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn) {
  std::lock_guard<std::mutex> run(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0);
    busy_ = static_cast<int>(helpers_.size());
    ++round_;
  }
  start_cv_.notify_all();
  Drain(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

}  // namespace edl::resnet50
