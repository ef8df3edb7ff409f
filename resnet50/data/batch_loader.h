// BatchLoader: fills host batches from a Dataset on one background thread, so the training step
// finds the next batch ready. Prefetch(epoch, indices) queues a batch; Get(epoch, indices) returns
// it (waiting for it if it is still being filled) or, when nothing matching was queued, fills it on
// the spot. Augmentation is seeded by (seed, epoch) and each sample's index (Dataset::FillBatch),
// so a sample gets the same crop and flip whatever batch, thread or trainer loads it. A dataset may
// spread one batch over several threads itself (ImageFolder's DecodePool).
//
// Thread-safety: Prefetch and Get are called from the training thread; the worker thread only
// touches queued jobs under mu_. The destructor stops and joins the worker.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "edl/base/status.h"
#include "edl/base/thread_annotations.h"
#include "resnet50/data/dataset.h"

namespace edl::resnet50 {

struct HostBatch {
  int64_t epoch = 0;
  std::vector<int64_t> indices;
  std::vector<float> images;    // [n, C, S, S]
  std::vector<int32_t> labels;  // [n]; kSkippedLabel for a sample the dataset could not load
  int64_t skipped() const;      // samples labelled kSkippedLabel
};

class BatchLoader {
 public:
  // `dataset` is not owned and must outlive the loader.
  BatchLoader(const Dataset* dataset, Augment augment, uint64_t seed);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Queues `indices` of data-plan epoch `epoch` for background loading (at most kMaxQueued
  // batches; older ones are dropped).
  void Prefetch(int64_t epoch, const std::vector<int64_t>& indices);
  // Fills *out with the batch for (epoch, indices). Timeout if a queued fill takes longer than
  // `timeout`.
  Status Get(int64_t epoch, const std::vector<int64_t>& indices, HostBatch* out,
             std::chrono::milliseconds timeout = std::chrono::seconds(120));

  // The augmentation seed of data-plan epoch `epoch`; FillBatch mixes in each sample's index, so
  // a sample is augmented the same whether prefetched or not, on any rank, and a teacher given
  // (indices, this seed) fills the same images.
  uint64_t AugSeed(int64_t epoch) const;

  // Gets whose batch had been queued with Prefetch.
  int64_t prefetch_hits() const { return hits_; }

 private:
  static constexpr size_t kMaxQueued = 2;
  // started, done and status are read and written under mu_; batch by whoever set started (the
  // worker or Get), and by Get once done.
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

  Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace edl::resnet50
