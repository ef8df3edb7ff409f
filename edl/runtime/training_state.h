// TrainingState: the training state besides the tensors, with its one field list and the two
// encodings built from it (docs/ARCHITECTURE.md, "Training state"):
//
//   - the state-sync header a re-form broadcasts from the root rank (EncodeSyncHeader /
//     DecodeSyncHeader: a magic word, the field count, then every field as 8 raw bytes; all ranks
//     of a job run the same build on the same architecture);
//   - the checkpoint metadata (EncodeCheckpointMeta / DecodeCheckpointMeta): every field by name
//     in CheckpointMeta::extra_json under "training_state" (edl/ckpt/FORMAT.md), plus the store's
//     own step / epoch / cursor columns, which `edl ckpt ls` shows.
//
// Both walk ForEachTrainingStateField(), so a field added to the struct and to that list reaches
// both encodings; a field added to the struct only fails to compile (the size check below), and a
// checkpoint without a field fails to load with an error naming it (never a silent 0).
//
// Thread-safety: plain value type and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "edl/base/status.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/runtime/data_plan.h"

namespace edl::runtime {

struct TrainingState {
  int64_t step = 0;               // committed optimizer steps
  DataPosition position;          // epoch and global cursor
  double last_lr = 0;             // rate of the last committed step
  int64_t last_global_batch = 0;  // global batch of the last committed step (0: none yet)
  double ramp_from_lr = 0;        // rate the post-re-form ramp starts from
  int64_t steps_since_reform = 0;

  bool operator==(const TrainingState& o) const;
  bool operator!=(const TrainingState& o) const { return !(*this == o); }
};

// THE field list: calls f(name, field) for every field, in encoding order. Every field is an
// int64_t or a double (8 bytes), which the sync header relies on. `State` is TrainingState or
// const TrainingState.
template <typename State, typename F>
constexpr void ForEachTrainingStateField(State& s, F&& f) {
  f("step", s.step);
  f("epoch", s.position.epoch);
  f("cursor", s.position.cursor);
  f("last_lr", s.last_lr);
  f("last_global_batch", s.last_global_batch);
  f("ramp_from_lr", s.ramp_from_lr);
  f("steps_since_reform", s.steps_since_reform);
}

constexpr size_t TrainingStateFieldCount() {
  TrainingState s;
  size_t n = 0;
  ForEachTrainingStateField(s, [&n](const char*, auto&) { ++n; });
  return n;
}
static_assert(
    sizeof(TrainingState) == 8 * TrainingStateFieldCount(),
    "a TrainingState field is missing from ForEachTrainingStateField (or is not 8 bytes)");

// ---- state-sync header (a fixed-size broadcast buffer)
inline constexpr size_t kSyncHeaderBytes = 16 + 8 * TrainingStateFieldCount();
using SyncHeader = std::array<unsigned char, kSyncHeaderBytes>;
SyncHeader EncodeSyncHeader(const TrainingState& state);
// Corruption when the magic word or the field count does not match (`from` names the sender).
Status DecodeSyncHeader(const SyncHeader& header, const std::string& from, TrainingState* state);

// ---- checkpoint metadata
// Sets meta->step / epoch / cursor and meta->extra_json = {"training_state": {...}}.
void EncodeCheckpointMeta(const TrainingState& state, ckpt::CheckpointMeta* meta);
// Corruption naming the checkpoint and the field when "training_state" or one of its fields is
// missing, of the wrong type, or disagrees with the store's step / epoch / cursor.
Status DecodeCheckpointMeta(const ckpt::CheckpointMeta& meta, TrainingState* state);

}  // namespace edl::runtime
