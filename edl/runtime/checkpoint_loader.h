// CheckpointLoader: the runtime's StateLoader over edl/ckpt (docs/ARCHITECTURE.md, "Checkpoint
// store").
//
//  - Load (cold start, on rank 0 only, when no trainer holds state): the newest checkpoint that
//    verifies and whose fingerprint matches, copied into the Trainable and the TrainingState
//    (decoded by edl/runtime/training_state.h before any tensor is touched).
//  - AfterStep (rank 0 of the current generation, after each committed step): an AsyncCheckpointer
//    snapshot when --checkpoint_steps / --checkpoint_secs say a save is due; the disk write runs in
//    the background. Each save carries the writer's generation, so a stale rank 0 of an older
//    generation is fenced off by the store.
//  - Finish (rank 0, clean completion): a final synchronous save.
//
// Fingerprint = Trainable::Fingerprint() + ";" + `config_fingerprint` (e.g. seed and dataset size,
// which must match for the data cursor to mean the same samples).
//
// Thread-safety: as StateLoader: called from the training thread only.
#pragma once

#include <memory>
#include <string>

#include "edl/ckpt/async_checkpointer.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/runtime/elastic_trainer.h"

namespace edl::runtime {

struct CheckpointLoaderOptions {
  ckpt::AsyncCheckpointerOptions save;  // when to save: checkpoint_steps / checkpoint_secs
  std::string config_fingerprint;       // appended to the Trainable's fingerprint
  bool final_save = true;               // Finish() saves synchronously
};

class CheckpointLoader : public StateLoader {
 public:
  // `store` is owned.
  CheckpointLoader(std::unique_ptr<ckpt::CheckpointStore> store, CheckpointLoaderOptions options);
  ~CheckpointLoader() override;

  Status Load(Trainable* trainable, TrainingState* state) override;
  Status AfterStep(Trainable* trainable, const TrainingState& state,
                   const StepContext& ctx) override;
  Status Finish(Trainable* trainable, const TrainingState& state, const StepContext& ctx) override;
  // A "checkpoint_saved" event when saves finished since the last call (how many, and the newest
  // one's snapshot plus write time), and a "checkpoint_failed" one when saves failed
  // (CheckpointFailedEvent).
  std::vector<nlohmann::json> TakeEvents() override;

  ckpt::CheckpointStore* store() { return store_.get(); }
  const ckpt::AsyncCheckpointer& checkpointer() const { return checkpointer_; }

 private:
  std::string Fingerprint(Trainable* trainable) const;
  ckpt::CheckpointMeta Meta(Trainable* trainable, const TrainingState& state,
                            const StepContext& ctx) const;
  // Tensor descriptions (data unused: the copy function reads from the Trainable).
  std::vector<ckpt::TensorView> Views(Trainable* trainable,
                                      std::vector<StateTensor>* tensors) const;

  const std::unique_ptr<ckpt::CheckpointStore> store_;
  const CheckpointLoaderOptions options_;
  ckpt::AsyncCheckpointer checkpointer_;  // uses store_; declared after it
  int64_t last_saved_step_ = -1;
  int64_t reported_failures_ = 0;  // saves_failed() at the last TakeEvents
  int64_t saves_reported_ = 0;     // saves_completed() at the last TakeEvents
};

// The trainer event of failed checkpoint saves (the events log's record, docs/WATCHING.md, "The
// events log"):
//   event "checkpoint_failed"; step: the step of the newest failed save; refused: true when the
//   store's generation fence refused it (FailedPrecondition; `error` says which way the fence
//   points and the fix), false for any other failure (disk full, I/O, a lock held too long);
//   code: the Status code name; error: its message (at most 1024 bytes); failed: saves failed
//   since the previous such event; failed_total: since the trainer started; store: the store.
nlohmann::json CheckpointFailedEvent(const Status& failure, int64_t step, int64_t failed,
                                     int64_t failed_total, const std::string& store);

// A CheckpointLoader over a RocksDB store (`store.dir`, keeping `store.keep_checkpoints`).
std::unique_ptr<CheckpointLoader> NewRocksDbCheckpointLoader(const ckpt::RocksDbStoreOptions& store,
                                                             CheckpointLoaderOptions options);

}  // namespace edl::runtime
