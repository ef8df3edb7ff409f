#include "resnet50/data/batch_loader.h"

#include <algorithm>
#include <utility>

#include "resnet50/data/image_transform.h"

namespace edl::resnet50 {

BatchLoader::BatchLoader(const Dataset* dataset, Augment augment, uint64_t seed)
    : dataset_(dataset), augment_(augment), seed_(seed), worker_([this] { WorkerLoop(); }) {}

BatchLoader::~BatchLoader() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

Status BatchLoader::Fill(HostBatch* b) const {
  const int64_t n = static_cast<int64_t>(b->indices.size());
  const int64_t per =
      static_cast<int64_t>(dataset_->channels()) * dataset_->image_size() * dataset_->image_size();
  b->images.resize(n * per);
  b->labels.resize(n);
  return dataset_->FillBatch(b->indices, augment_, AugSeed(b->epoch), b->images.data(),
                             b->labels.data());
}

// The dataset mixes each sample's index into this seed (MixSeed).
uint64_t BatchLoader::AugSeed(int64_t epoch) const {
  return MixSeed(seed_, static_cast<uint64_t>(epoch));
}

void BatchLoader::WorkerLoop() {
  MutexLock lock(&mu_);
  while (true) {
    std::shared_ptr<Job> job;
    cv_.wait(lock.native(), [&]() REQUIRES(mu_) {
      if (stop_) return true;
      for (auto& j : jobs_) {
        if (!j->started) return true;
      }
      return false;
    });
    if (stop_) return;
    for (auto& j : jobs_) {
      if (!j->started) {
        job = j;
        break;
      }
    }
    job->started = true;
    lock.Unlock();
    Status s = Fill(&job->batch);
    lock.Lock();
    job->status = s;
    job->done = true;
    cv_.notify_all();
  }
}

int64_t HostBatch::skipped() const {
  return std::count(labels.begin(), labels.end(), kSkippedLabel);
}

void BatchLoader::Prefetch(int64_t epoch, const std::vector<int64_t>& indices) {
  if (indices.empty()) return;
  auto job = std::make_shared<Job>();
  job->batch.epoch = epoch;
  job->batch.indices = indices;
  {
    MutexLock lock(&mu_);
    while (jobs_.size() >= kMaxQueued) jobs_.pop_front();
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

Status BatchLoader::Get(int64_t epoch, const std::vector<int64_t>& indices, HostBatch* out,
                        std::chrono::milliseconds timeout) {
  std::shared_ptr<Job> job;
  bool queued = false;
  {
    MutexLock lock(&mu_);
    // The matching job, if queued; jobs queued before it were skipped and are dropped. Jobs
    // after it (or all, when none matches) stay: they are the following steps' prefetches.
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const std::shared_ptr<Job>& j) {
      return j->batch.epoch == epoch && j->batch.indices == indices;
    });
    if (it != jobs_.end()) {
      job = *it;
      jobs_.erase(jobs_.begin(), it + 1);
    }
    queued = job != nullptr;
    if (job && !job->started) {
      job->started = true;  // the worker has not begun it: fill it here instead
      job.reset();
    }
    if (job) {
      if (!cv_.wait_for(lock.native(), timeout, [&] { return job->done; })) {
        return Status::Timeout("batch prefetch did not finish within " +
                               std::to_string(timeout.count()) + " ms");
      }
    }
  }
  if (queued) ++hits_;
  if (job) {
    EDL_RETURN_IF_ERROR(job->status);
    *out = std::move(job->batch);
    return Status::OK();
  }
  out->epoch = epoch;
  out->indices = indices;
  return Fill(out);
}

}  // namespace edl::resnet50
