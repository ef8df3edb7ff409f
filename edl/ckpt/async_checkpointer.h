// AsyncCheckpointer: periodic checkpoints that do not make training wait for the disk.
//
// At a step boundary the training thread calls MaybeSave(). When a save is due (every
// `checkpoint_steps` steps or `checkpoint_secs` seconds since the last one) and no save is in
// flight, the state is copied ("snapshotted") into a host buffer the checkpointer owns and reuses,
// and a background thread writes it to the CheckpointStore while training continues. For a CUDA
// trainer the copy function is Trainable::CopyToHost (device -> host).
//
// Never two saves in flight: a save that falls due while the previous one is still writing is
// skipped at that boundary (training does not wait) and taken at the first boundary after the
// writer is free, since it stays due. On clean shutdown the caller calls SaveNow() for a final,
// synchronous save.
//
// Errors (a stale generation refused by fencing, a full disk) never throw: they are logged and
// kept; last_status() returns the latest save's outcome.
//
// Thread-safety: MaybeSave/SaveNow/WaitIdle are called from the one training thread; the
// accessors may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/base/thread_annotations.h"
#include "edl/ckpt/checkpoint_store.h"

namespace edl::ckpt {

struct AsyncCheckpointerOptions {
  // Save when at least this many steps passed since the last save. 0: no step trigger.
  int64_t checkpoint_steps = 0;
  // Save when at least this many seconds passed since the last save (or since construction).
  // 0: no time trigger.
  double checkpoint_secs = 0;
  // Time source for checkpoint_secs. Not owned; must outlive the checkpointer.
  Clock* clock = Clock::Real();
  // Bound on waiting for an in-flight save (SaveNow, the destructor).
  std::chrono::milliseconds wait_timeout{600000};
};

class AsyncCheckpointer {
 public:
  // Copies tensor `index` (as described by the TensorView passed alongside) into `dst`, which has
  // room for its `bytes` bytes. CPU state: a memcpy (see HostCopy); CUDA: Trainable::CopyToHost.
  using CopyFn = std::function<Status(size_t index, void* dst)>;

  // `store` is not owned and must outlive the checkpointer.
  AsyncCheckpointer(CheckpointStore* store, AsyncCheckpointerOptions options);
  // Waits (bounded by wait_timeout) for an in-flight save, then stops the writer thread.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // A CopyFn that memcpy's tensors[index].data (host memory the caller keeps valid for the call).
  static CopyFn HostCopy(const std::vector<TensorView>& tensors);

  // True when a save is due at step `step` (ignores whether one is in flight).
  bool Due(int64_t step) const;

  // At a step boundary: when due and idle, snapshots `tensors` (their data fields are ignored;
  // `copy` supplies the bytes) with `meta` and starts a background save; returns true then.
  // Returns false when not due, or due but a save is in flight (skipped, retried next boundary),
  // or the snapshot copy failed (kept in last_status()).
  bool MaybeSave(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                 const CopyFn& copy);

  // Final save on clean shutdown: waits for an in-flight save, then snapshots and saves
  // synchronously. Returns the save's Status (Timeout if the in-flight one did not finish).
  Status SaveNow(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                 const CopyFn& copy);

  // Waits until no save is in flight; Timeout after `timeout`. Returns last_status() otherwise.
  Status WaitIdle(std::chrono::milliseconds timeout);

  bool busy() const;
  Status last_status() const;
  int64_t saves_completed() const;
  int64_t saves_skipped() const;  // due at a boundary but a save was in flight
  // Saves that failed (refused by the fence, a full disk, a snapshot copy that failed), and the
  // newest such failure with the step it was for (OK / -1 when none failed).
  int64_t saves_failed() const;
  Status last_failure() const;
  int64_t last_failed_step() const;
  int64_t last_saved_step() const;       // step of the newest successful save, -1 if none
  int64_t last_saved_id() const;         // id the store gave it, 0 if none
  double last_snapshot_seconds() const;  // training-thread time of the last snapshot copy
  double last_write_seconds() const;     // background time of the last store write

 private:
  // Copies the tensors into snapshot_ (reallocated when too small). Training thread only.
  Status Snapshot(const std::vector<TensorView>& tensors, const CopyFn& copy);
  void WriterLoop();
  void RecordResult(const Status& s, int64_t step, int64_t id, double seconds);
  void RecordFailure(const Status& s, int64_t step) REQUIRES(mu_);

  CheckpointStore* const store_;  // not owned; outlives this (constructor contract)
  const AsyncCheckpointerOptions options_;

  // Training-thread state (the writer reads snapshot_ only while pending_/writing_ is set).
  std::unique_ptr<uint8_t[]> snapshot_;
  size_t snapshot_capacity_ = 0;
  std::vector<TensorView> snapshot_views_;  // point into snapshot_
  int64_t last_trigger_step_ = -1;
  int64_t last_trigger_micros_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool pending_ GUARDED_BY(mu_) = false;  // a snapshot waits for the writer
  bool writing_ GUARDED_BY(mu_) = false;
  CheckpointMeta pending_meta_ GUARDED_BY(mu_);
  Status last_status_ GUARDED_BY(mu_);
  int64_t saves_completed_ GUARDED_BY(mu_) = 0;
  int64_t saves_skipped_ GUARDED_BY(mu_) = 0;
  int64_t saves_failed_ GUARDED_BY(mu_) = 0;
  Status last_failure_ GUARDED_BY(mu_);
  int64_t last_failed_step_ GUARDED_BY(mu_) = -1;
  int64_t last_saved_step_ GUARDED_BY(mu_) = -1;
  int64_t last_saved_id_ GUARDED_BY(mu_) = 0;
  double last_snapshot_seconds_ GUARDED_BY(mu_) = 0;
  double last_write_seconds_ GUARDED_BY(mu_) = 0;

  std::thread writer_;  // started last in the constructor
};

}  // namespace edl::ckpt
