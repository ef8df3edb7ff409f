// The in-process CheckpointStore: same semantics as the RocksDB one (atomic saves, fencing,
// keep-K), no durability. For tests of components that take a CheckpointStore.
#include <cstring>
#include <map>
#include <mutex>

#include "edl/base/clock.h"
#include "edl/base/thread_annotations.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/ckpt/crc32c.h"

namespace edl::ckpt {
namespace {

class MemoryStore : public CheckpointStore {
 public:
  explicit MemoryStore(int keep)
      : keep_(keep < 1 ? 1 : keep), since_(Clock::Real()->WallMicros()) {}

  Status Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
              int64_t* id) override {
    Entry entry;
    entry.meta = meta;
    entry.meta.tensors.clear();
    if (entry.meta.wall_time_micros == 0) entry.meta.wall_time_micros = Clock::Real()->WallMicros();
    for (const TensorView& v : tensors) {
      entry.meta.tensors.push_back({v.name, v.dtype, v.shape, v.bytes, Crc32c(v.data, v.bytes)});
      entry.data.emplace_back(static_cast<const char*>(v.data), v.bytes);
    }
    MutexLock lock(&mu_);
    if (!entries_.empty()) {
      EDL_RETURN_IF_ERROR(CheckFence(Describe(), meta, entries_.rbegin()->second.meta, since_));
    }
    entry.meta.id = entries_.empty() ? 1 : entries_.rbegin()->first + 1;
    const int64_t new_id = entry.meta.id;
    entries_[new_id] = std::move(entry);
    while (entries_.size() > static_cast<size_t>(keep_)) entries_.erase(entries_.begin());
    if (id != nullptr) *id = new_id;
    return Status::OK();
  }

  Status List(std::vector<CheckpointMeta>* out) override {
    MutexLock lock(&mu_);
    out->clear();
    for (const auto& [id, e] : entries_) out->push_back(e.meta);
    return Status::OK();
  }

  Status ReadTensors(const CheckpointMeta& meta, const std::function<void*(size_t)>& dst_for,
                     const std::function<Status(size_t)>& done) override {
    MutexLock lock(&mu_);
    auto it = entries_.find(meta.id);
    if (it == entries_.end()) {
      return Status::NotFound("checkpoint " + std::to_string(meta.id) + " is not in " + Describe());
    }
    const Entry& e = it->second;
    for (size_t i = 0; i < e.data.size() && i < meta.tensors.size(); ++i) {
      void* dst = dst_for(i);
      if (dst == nullptr) continue;
      std::memcpy(dst, e.data[i].data(), std::min<size_t>(e.data[i].size(), meta.tensors[i].bytes));
      EDL_RETURN_IF_ERROR(done(i));
    }
    return Status::OK();
  }

  std::string Describe() const override { return "memory checkpoint store"; }

 private:
  struct Entry {
    CheckpointMeta meta;
    std::vector<std::string> data;  // data[i]: bytes of meta.tensors[i]
  };
  const int keep_;
  const int64_t since_;  // wall clock at construction (CheckFence)
  Mutex mu_;
  std::map<int64_t, Entry> entries_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<CheckpointStore> NewMemoryStore(int keep_checkpoints) {
  return std::make_unique<MemoryStore>(keep_checkpoints);
}

}  // namespace edl::ckpt
