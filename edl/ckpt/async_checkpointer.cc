#include "edl/ckpt/async_checkpointer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include <glog/logging.h>

namespace edl::ckpt {

AsyncCheckpointer::AsyncCheckpointer(CheckpointStore* store, AsyncCheckpointerOptions options)
    : store_(store),
      options_(options),
      last_trigger_micros_(options.clock->NowMicros()),
      writer_([this] { WriterLoop(); }) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  Status s = WaitIdle(options_.wait_timeout);
  if (!s.ok() && s.IsTimeout())
    LOG(ERROR) << "checkpoint writer still busy at shutdown: " << s.ToString();
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // A writer stuck past wait_timeout is detached rather than hanging shutdown; the store's own
  // atomicity keeps the directory consistent whatever happens to that write.
  if (s.IsTimeout()) {
    writer_.detach();
  } else {
    writer_.join();
  }
}

AsyncCheckpointer::CopyFn AsyncCheckpointer::HostCopy(const std::vector<TensorView>& tensors) {
  return [&tensors](size_t i, void* dst) {
    std::memcpy(dst, tensors[i].data, tensors[i].bytes);
    return Status::OK();
  };
}

bool AsyncCheckpointer::Due(int64_t step) const {
  if (options_.checkpoint_steps > 0) {
    const int64_t base = last_trigger_step_ < 0 ? 0 : last_trigger_step_;
    if (step - base >= options_.checkpoint_steps) return true;
  }
  if (options_.checkpoint_secs > 0) {
    const double elapsed = MicrosToSeconds(options_.clock->NowMicros() - last_trigger_micros_);
    if (elapsed >= options_.checkpoint_secs) return true;
  }
  return false;
}

Status AsyncCheckpointer::Snapshot(const std::vector<TensorView>& tensors, const CopyFn& copy) {
  const int64_t start = Clock::Real()->NowMicros();
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes;
  if (total > snapshot_capacity_ || !snapshot_) {
    snapshot_.reset(new uint8_t[total ? total : 1]);
    snapshot_capacity_ = total;
  }
  snapshot_views_ = tensors;
  size_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    snapshot_views_[i].data = snapshot_.get() + off;
    EDL_RETURN_IF_ERROR(
        copy(i, snapshot_.get() + off).WithContext("snapshot of tensor '" + tensors[i].name + "'"));
    off += tensors[i].bytes;
  }
  MutexLock lock(&mu_);
  last_snapshot_seconds_ = MicrosToSeconds(Clock::Real()->NowMicros() - start);
  return Status::OK();
}

bool AsyncCheckpointer::MaybeSave(const CheckpointMeta& meta,
                                  const std::vector<TensorView>& tensors, const CopyFn& copy) {
  if (!Due(meta.step)) return false;
  {
    MutexLock lock(&mu_);
    if (pending_ || writing_) {
      ++saves_skipped_;
      return false;
    }
  }
  Status s = Snapshot(tensors, copy);
  if (!s.ok()) {
    LOG(ERROR) << "checkpoint at step " << meta.step << " not taken: " << s.ToString();
    MutexLock lock(&mu_);
    last_status_ = s;
    RecordFailure(s, meta.step);
    return false;
  }
  last_trigger_step_ = meta.step;
  last_trigger_micros_ = options_.clock->NowMicros();
  {
    MutexLock lock(&mu_);
    pending_meta_ = meta;
    pending_ = true;
  }
  cv_.notify_all();
  return true;
}

Status AsyncCheckpointer::SaveNow(const CheckpointMeta& meta,
                                  const std::vector<TensorView>& tensors, const CopyFn& copy) {
  Status idle = WaitIdle(options_.wait_timeout);
  if (idle.IsTimeout()) return idle;
  EDL_RETURN_IF_ERROR(Snapshot(tensors, copy));
  last_trigger_step_ = meta.step;
  last_trigger_micros_ = options_.clock->NowMicros();
  const int64_t start = Clock::Real()->NowMicros();
  int64_t id = 0;
  Status s = store_->Save(meta, snapshot_views_, &id);
  RecordResult(s, meta.step, id, MicrosToSeconds(Clock::Real()->NowMicros() - start));
  return s;
}

Status AsyncCheckpointer::WaitIdle(std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  if (!cv_.wait_for(lock.native(), timeout,
                    [this]() REQUIRES(mu_) { return !pending_ && !writing_; })) {
    return Status::Timeout("checkpoint save still in flight after " +
                           std::to_string(timeout.count()) + " ms; is the checkpoint disk stuck?");
  }
  return last_status_;
}

void AsyncCheckpointer::WriterLoop() {
  // The writer yields the CPU to training: nice +10 for this thread only (Linux per-thread nice).
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10) != 0) {
    PLOG(WARNING) << "could not lower the checkpoint writer's priority";
  }
  MutexLock lock(&mu_);
  for (;;) {
    cv_.wait(lock.native(), [this]() REQUIRES(mu_) { return stop_ || pending_; });
    if (!pending_) return;  // stop_ with nothing to write
    CheckpointMeta meta = pending_meta_;
    pending_ = false;
    writing_ = true;
    lock.Unlock();
    const int64_t start = Clock::Real()->NowMicros();
    int64_t id = 0;
    Status s = store_->Save(meta, snapshot_views_, &id);
    RecordResult(s, meta.step, id, MicrosToSeconds(Clock::Real()->NowMicros() - start));
    lock.Lock();
    writing_ = false;
    cv_.notify_all();
  }
}

void AsyncCheckpointer::RecordResult(const Status& s, int64_t step, int64_t id, double seconds) {
  if (s.ok()) {
    LOG(INFO) << "checkpoint " << id << " (step " << step << ") saved in " << seconds << " s";
  } else {
    LOG(ERROR) << "checkpoint at step " << step << " failed: " << s.ToString();
  }
  MutexLock lock(&mu_);
  last_status_ = s;
  last_write_seconds_ = seconds;
  if (s.ok()) {
    ++saves_completed_;
    last_saved_step_ = step;
    last_saved_id_ = id;
  } else {
    RecordFailure(s, step);
  }
}

void AsyncCheckpointer::RecordFailure(const Status& s, int64_t step) {
  ++saves_failed_;
  last_failure_ = s;
  last_failed_step_ = step;
}

bool AsyncCheckpointer::busy() const {
  MutexLock lock(&mu_);
  return pending_ || writing_;
}
Status AsyncCheckpointer::last_status() const {
  MutexLock lock(&mu_);
  return last_status_;
}
int64_t AsyncCheckpointer::saves_completed() const {
  MutexLock lock(&mu_);
  return saves_completed_;
}
int64_t AsyncCheckpointer::saves_skipped() const {
  MutexLock lock(&mu_);
  return saves_skipped_;
}
int64_t AsyncCheckpointer::saves_failed() const {
  MutexLock lock(&mu_);
  return saves_failed_;
}
Status AsyncCheckpointer::last_failure() const {
  MutexLock lock(&mu_);
  return last_failure_;
}
int64_t AsyncCheckpointer::last_failed_step() const {
  MutexLock lock(&mu_);
  return last_failed_step_;
}
int64_t AsyncCheckpointer::last_saved_step() const {
  MutexLock lock(&mu_);
  return last_saved_step_;
}
int64_t AsyncCheckpointer::last_saved_id() const {
  MutexLock lock(&mu_);
  return last_saved_id_;
}
double AsyncCheckpointer::last_snapshot_seconds() const {
  MutexLock lock(&mu_);
  return last_snapshot_seconds_;
}
double AsyncCheckpointer::last_write_seconds() const {
  MutexLock lock(&mu_);
  return last_write_seconds_;
}

}  // namespace edl::ckpt
