#include "edl/runtime/training_state.h"

#include <cstring>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace edl::runtime {

namespace {

constexpr uint64_t kSyncMagic = 0x45444C5359434E32ULL;  // "EDLSYNC2"
constexpr const char* kMetaKey = "training_state";

}  // namespace

// Bitwise, doubles too (the state must arrive exactly as sent): the header holds every field's
// bytes and nothing else varies.
bool TrainingState::operator==(const TrainingState& o) const {
  return EncodeSyncHeader(*this) == EncodeSyncHeader(o);
}

SyncHeader EncodeSyncHeader(const TrainingState& state) {
  SyncHeader h{};
  const uint64_t count = TrainingStateFieldCount();
  std::memcpy(h.data(), &kSyncMagic, 8);
  std::memcpy(h.data() + 8, &count, 8);
  size_t off = 16;
  ForEachTrainingStateField(state, [&](const char*, const auto& field) {
    static_assert(sizeof(field) == 8, "sync header fields are 8 bytes");
    std::memcpy(h.data() + off, &field, 8);
    off += 8;
  });
  return h;
}

Status DecodeSyncHeader(const SyncHeader& h, const std::string& from, TrainingState* state) {
  uint64_t magic = 0, count = 0;
  std::memcpy(&magic, h.data(), 8);
  std::memcpy(&count, h.data() + 8, 8);
  if (magic != kSyncMagic || count != TrainingStateFieldCount()) {
    return Status::Corruption("state sync header from " + from +
                              " is garbled or from another "
                              "edl build (every trainer of a job must run the same binary)");
  }
  TrainingState s;
  size_t off = 16;
  ForEachTrainingStateField(s, [&](const char*, auto& field) {
    std::memcpy(&field, h.data() + off, 8);
    off += 8;
  });
  *state = s;
  return Status::OK();
}

void EncodeCheckpointMeta(const TrainingState& state, ckpt::CheckpointMeta* meta) {
  nlohmann::json fields = nlohmann::json::object();
  ForEachTrainingStateField(state,
                            [&](const char* name, const auto& field) { fields[name] = field; });
  meta->step = state.step;
  meta->epoch = state.position.epoch;
  meta->cursor = state.position.cursor;
  meta->extra_json = nlohmann::json{{kMetaKey, fields}}.dump();
}

Status DecodeCheckpointMeta(const ckpt::CheckpointMeta& meta, TrainingState* state) {
  const std::string what = "checkpoint " + std::to_string(meta.id);
  const nlohmann::json extra = nlohmann::json::parse(meta.extra_json, nullptr, false);
  if (!extra.is_object() || !extra.contains(kMetaKey) || !extra[kMetaKey].is_object()) {
    return Status::Corruption(what + " has no \"" + kMetaKey +
                              "\" object in its metadata's "
                              "extra field (written by another edl version?); resume from a "
                              "checkpoint of this version or start with a fresh --checkpoint_dir");
  }
  const nlohmann::json& fields = extra[kMetaKey];
  TrainingState s;
  Status status;
  ForEachTrainingStateField(s, [&](const char* name, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!status.ok()) return;
    auto it = fields.find(name);
    const bool typed =
        it != fields.end() && (std::is_integral_v<T> ? it->is_number_integer() : it->is_number());
    if (!typed) {
      status = Status::Corruption(what + ": training state field \"" + std::string(name) +
                                  "\" is missing or not a number");
      return;
    }
    field = it->template get<T>();
  });
  EDL_RETURN_IF_ERROR(status);
  if (s.step != meta.step || s.position.epoch != meta.epoch || s.position.cursor != meta.cursor) {
    return Status::Corruption(what + ": training state (step " + std::to_string(s.step) +
                              ", epoch " + std::to_string(s.position.epoch) + ", cursor " +
                              std::to_string(s.position.cursor) + ") disagrees with the store's (" +
                              std::to_string(meta.step) + ", " + std::to_string(meta.epoch) + ", " +
                              std::to_string(meta.cursor) + ")");
  }
  *state = s;
  return Status::OK();
}

}  // namespace edl::runtime
