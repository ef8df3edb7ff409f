// BatchLoader: fills host batches from a Dataset on one background thread, so the training step
// finds the next batch ready. Prefetch(indices) queues a batch; Get(indices) returns it (waiting for
// it if it is still being filled) or, when nothing matching was queued, fills it on the spot.
//
// Thread-safety: Prefetch and Get are called from the training thread; the worker thread only
// touches queued jobs under mu_. The destructor stops and joins the worker.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "edl/base/status.h"
#include "resnet50/data/dataset.h"

namespace edl::resnet50 {

struct HostBatch {
  std::vector<int64_t> indices;
  std::vector<float> images;   // [n, C, S, S]
  std::vector<int32_t> labels;  // [n]
};

class BatchLoader {
 public:
  // `dataset` is not owned and must outlive the loader.
  BatchLoader(const Dataset* dataset, Augment augment, uint64_t seed);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Queues `indices` for background loading (at most kMaxQueued batches; older ones are dropped).
  void Prefetch(const std::vector<int64_t>& indices);
  // Fills *out with the batch for `indices`. Timeout if a queued fill takes longer than `timeout`.
  Status Get(const std::vector<int64_t>& indices, HostBatch* out,
             std::chrono::milliseconds timeout = std::chrono::seconds(120));

  // The augmentation seed of the batch `indices`: a hash of (seed, indices), so a batch is
  // augmented the same whether prefetched or not, and a teacher can fill the same images.
  uint64_t AugSeed(const std::vector<int64_t>& indices) const;

  // Gets whose batch had been queued with Prefetch.
  int64_t prefetch_hits() const { return hits_; }

 private:
  static constexpr size_t kMaxQueued = 2;
  struct Job {
    HostBatch batch;
    Status status;
    bool started = false;
    bool done = false;
  };
  Status Fill(HostBatch* batch) const;
  void WorkerLoop();

  const Dataset* const dataset_;  // not owned
  const Augment augment_;
  const uint64_t seed_;
  int64_t hits_ = 0;  // training thread only

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace edl::resnet50
