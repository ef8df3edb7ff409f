#include "edl/ckpt/checkpoint_store.h"

#include <algorithm>
#include <limits>
#include <new>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <glog/logging.h>

#include "edl/base/thread_annotations.h"
#include "edl/ckpt/crc32c.h"

namespace edl::ckpt {
namespace {

constexpr const char* kMetaMagic = "edl-checkpoint";
constexpr int kMetaVersion = 1;

// Integer fields must be JSON integers within T's range: nlohmann's get<int>() of a float such as
// 1e300 is undefined behaviour (found by tests/fuzz/ckpt_meta_fuzzer.cc). Throws std::out_of_range,
// which DecodeJson turns into Corruption.
template <typename T>
T IntValue(const nlohmann::json& v, const char* key) {
  using L = std::numeric_limits<T>;
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(L::max())) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (L::is_signed && x >= static_cast<int64_t>(L::min())) return static_cast<T>(x);
  }
  throw std::out_of_range(std::string("field '") + key + "' is not an integer in range");
}
template <typename T>
T IntField(const nlohmann::json& j, const char* key) {
  return IntValue<T>(j.at(key), key);
}

struct DataTypeEntry {
  DataType type;
  const char* name;
};
constexpr DataTypeEntry kDataTypes[] = {
    {DataType::kFloat32, "float32"},   {DataType::kFloat64, "float64"},
    {DataType::kInt64, "int64"},       {DataType::kInt32, "int32"},
    {DataType::kBFloat16, "bfloat16"}, {DataType::kFloat16, "float16"},
    {DataType::kUInt8, "uint8"},
};

std::string Hex32(uint32_t v) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

const char* DataTypeName(DataType t) {
  for (const auto& e : kDataTypes) {
    if (e.type == t) return e.name;
  }
  return "unknown";
}

Status ParseDataType(const std::string& name, DataType* out) {
  for (const auto& e : kDataTypes) {
    if (name == e.name) {
      *out = e.type;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown tensor dtype '" + name + "'");
}

// ---- CheckpointMeta

uint64_t CheckpointMeta::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes;
  return total;
}

const TensorRecord* CheckpointMeta::FindTensor(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string CheckpointMeta::EncodeJson() const {
  nlohmann::json j;
  j["format"] = kMetaMagic;
  j["version"] = kMetaVersion;
  j["id"] = id;
  j["step"] = step;
  j["epoch"] = epoch;
  j["cursor"] = cursor;
  j["generation"] = generation;
  j["world_size"] = world_size;
  j["fingerprint"] = fingerprint;
  j["wall_time_micros"] = wall_time_micros;
  j["extra"] = extra_json;  // kept as text so it round-trips byte for byte
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : tensors) {
    ts.push_back({{"name", t.name},
                  {"dtype", DataTypeName(t.dtype)},
                  {"shape", t.shape},
                  {"bytes", t.bytes},
                  {"crc32c", Hex32(t.crc32c)}});
  }
  j["tensors"] = std::move(ts);
  return j.dump();
}

Status CheckpointMeta::DecodeJson(const std::string& json, CheckpointMeta* out) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object() || j.value("format", "") != kMetaMagic) {
      return Status::Corruption("checkpoint metadata lacks the '" + std::string(kMetaMagic) +
                                "' magic; not an EDL checkpoint store?");
    }
    const int version = IntField<int>(j, "version");
    if (version != kMetaVersion) {
      return Status::Corruption("checkpoint metadata version " + std::to_string(version) +
                                " is not supported (this edl reads version " +
                                std::to_string(kMetaVersion) + "); use a matching edl build");
    }
    CheckpointMeta m;
    m.id = IntField<int64_t>(j, "id");
    m.step = IntField<int64_t>(j, "step");
    m.epoch = IntField<int64_t>(j, "epoch");
    m.cursor = IntField<int64_t>(j, "cursor");
    m.generation = IntField<int64_t>(j, "generation");
    m.world_size = IntField<int>(j, "world_size");
    m.fingerprint = j.at("fingerprint").get<std::string>();
    m.wall_time_micros = IntField<int64_t>(j, "wall_time_micros");
    m.extra_json = j.at("extra").get<std::string>();
    for (const auto& jt : j.at("tensors")) {
      TensorRecord t;
      t.name = jt.at("name").get<std::string>();
      EDL_RETURN_IF_ERROR(ParseDataType(jt.at("dtype").get<std::string>(), &t.dtype)
                              .WithContext("checkpoint metadata, tensor " + t.name));
      const auto& shape = jt.at("shape");
      if (!shape.is_array()) throw std::out_of_range("field 'shape' is not an array");
      for (const auto& d : shape) t.shape.push_back(IntValue<int64_t>(d, "shape"));
      t.bytes = IntField<uint64_t>(jt, "bytes");
      t.crc32c = static_cast<uint32_t>(std::stoul(jt.at("crc32c").get<std::string>(), nullptr, 16));
      m.tensors.push_back(std::move(t));
    }
    *out = std::move(m);
    return Status::OK();
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("checkpoint metadata is not valid: ") + e.what());
  }
}

const uint8_t* LoadedCheckpoint::Find(const std::string& name) const {
  for (size_t i = 0; i < meta.tensors.size() && i < data.size(); ++i) {
    if (meta.tensors[i].name == name) return data[i].get();
  }
  return nullptr;
}

// ---- shared read logic

namespace {

Status FindMeta(CheckpointStore* store, int64_t id, CheckpointMeta* out) {
  std::vector<CheckpointMeta> all;
  EDL_RETURN_IF_ERROR(store->List(&all));
  for (auto& m : all) {
    if (m.id == id) {
      *out = std::move(m);
      return Status::OK();
    }
  }
  return Status::NotFound("checkpoint " + std::to_string(id) + " is not in " + store->Describe() +
                          "; `edl ckpt ls` lists the stored ones");
}

Status CheckTensor(const CheckpointMeta& meta, size_t i, const void* data) {
  const TensorRecord& t = meta.tensors[i];
  const uint32_t crc = Crc32c(data, t.bytes);
  if (crc == t.crc32c) return Status::OK();
  return Status::Corruption("checkpoint " + std::to_string(meta.id) + " tensor '" + t.name +
                            "': checksum " + Hex32(crc) + " != stored " + Hex32(t.crc32c));
}

// Buffers for the tensors of one read. The metadata's `bytes` is not trusted for an allocation:
// a buffer is reserved without touching its pages and never throws, and the store copies into it
// only what it holds (it checks every stored value's size against `bytes` first, ReadTensors), so
// memory in use stays bounded by the data actually stored. A `bytes` no allocation can satisfy is
// damaged metadata: Corruption naming the tensor.
class TensorBuffers {
 public:
  explicit TensorBuffers(const CheckpointMeta& meta) : meta_(meta), bufs_(meta.tensors.size()) {}

  // No tensor of a real model is larger than any accelerator's memory: a `bytes` above this is
  // damaged metadata, refused before anything is allocated (a sanitizer's allocator aborts on
  // such a request even with std::nothrow).
  static constexpr uint64_t kMaxTensorBytes = uint64_t{256} << 30;

  // For ReadTensors' dst_for: nullptr (the tensor is skipped) when the allocation fails.
  void* Allocate(size_t i) {
    const uint64_t bytes = std::max<uint64_t>(meta_.tensors[i].bytes, 1);
    if (bytes <= kMaxTensorBytes && bytes <= std::numeric_limits<size_t>::max()) {
      bufs_[i].reset(new (std::nothrow) uint8_t[static_cast<size_t>(bytes)]);
    }
    if (bufs_[i] == nullptr) {
      MutexLock lock(&mu_);
      if (failed_.ok()) {
        failed_ = Status::Corruption(
            "checkpoint " + std::to_string(meta_.id) + " tensor '" + meta_.tensors[i].name +
            "': its metadata says " + std::to_string(meta_.tensors[i].bytes) +
            " bytes, more than can be allocated; the metadata is damaged (`edl ckpt verify`)");
      }
    }
    return bufs_[i].get();
  }
  Status status() {
    MutexLock lock(&mu_);
    return failed_;
  }
  std::unique_ptr<uint8_t[]>& operator[](size_t i) { return bufs_[i]; }
  std::vector<std::unique_ptr<uint8_t[]>> Release() { return std::move(bufs_); }

 private:
  const CheckpointMeta& meta_;
  std::vector<std::unique_ptr<uint8_t[]>> bufs_;
  Mutex mu_;  // dst_for runs on several reader threads
  Status failed_ GUARDED_BY(mu_);
};

// Reads checkpoint `meta` into *out, verifying every tensor.
Status ReadVerified(CheckpointStore* store, const CheckpointMeta& meta, LoadedCheckpoint* out) {
  TensorBuffers bufs(meta);
  auto dst_for = [&](size_t i) -> void* { return bufs.Allocate(i); };
  auto done = [&](size_t i) { return CheckTensor(meta, i, bufs[i].get()); };
  Status s = store->ReadTensors(meta, dst_for, done);
  EDL_RETURN_IF_ERROR(bufs.status());
  EDL_RETURN_IF_ERROR(s);
  LoadedCheckpoint loaded;
  loaded.meta = meta;
  loaded.data = bufs.Release();
  *out = std::move(loaded);
  return Status::OK();
}

}  // namespace

Status CheckFence(const std::string& store, const CheckpointMeta& writer,
                  const CheckpointMeta& newest, int64_t writer_since_wall_micros) {
  if (writer.generation >= newest.generation) return Status::OK();
  const std::string head = "save of step " + std::to_string(writer.step) + " from generation " +
                           std::to_string(writer.generation) + " refused: " + store +
                           " holds checkpoint " + std::to_string(newest.id) + " (step " +
                           std::to_string(newest.step) + ") from generation " +
                           std::to_string(newest.generation);
  if (newest.wall_time_micros >= writer_since_wall_micros) {
    return Status::FailedPrecondition(
        head +
        ", saved by a newer generation after this writer started: this writer is stale "
        "(only rank 0 of the current generation may save). Stop this trainer: it should "
        "have left when generation " +
        std::to_string(newest.generation) + " began");
  }
  return Status::FailedPrecondition(
      head +
      ", which was there before this writer started: the store is ahead of this job, whose "
      "generations start lower (its server began with fresh state, e.g. a new run or state "
      "directory beside an existing checkpoint store), so no save of this job lands there. "
      "Fix: give the server the store (edl server --checkpoint_dir DIR; the scripts pass "
      "the trainers' --checkpoint_dir, or set EDL_SERVER_ARGS) so it numbers generations "
      "above the store's, or move the store aside to start afresh");
}

Status CheckpointStore::Read(int64_t id, LoadedCheckpoint* out) {
  CheckpointMeta meta;
  EDL_RETURN_IF_ERROR(FindMeta(this, id, &meta));
  return ReadVerified(this, meta, out);
}

Status CheckpointStore::Verify(int64_t id, VerifyReport* report) {
  CheckpointMeta meta;
  EDL_RETURN_IF_ERROR(FindMeta(this, id, &meta));
  *report = VerifyReport();
  report->id = id;
  // One buffer per tensor in flight (callbacks may run on several threads), freed once checked.
  TensorBuffers bufs(meta);
  struct {
    Mutex mu;
    VerifyReport* report PT_GUARDED_BY(mu);
  } tally{{}, report};
  auto dst_for = [&](size_t i) -> void* { return bufs.Allocate(i); };
  auto done = [&](size_t i) {
    Status s = CheckTensor(meta, i, bufs[i].get());
    bufs[i].reset();
    MutexLock lock(&tally.mu);
    if (!s.ok()) tally.report->corrupt.push_back(meta.tensors[i].name + ": " + s.message());
    tally.report->tensors_checked++;
    tally.report->bytes_checked += meta.tensors[i].bytes;
    return Status::OK();
  };
  Status s = ReadTensors(meta, dst_for, done);
  if (!bufs.status().ok()) report->corrupt.push_back(bufs.status().message());
  if (!s.ok() && (s.IsCorruption() || s.code() == Status::Code::kIOError)) {
    // The storage layer refused a tensor (e.g. a RocksDB block checksum); the message names it.
    report->corrupt.push_back(s.message());
    return Status::OK();
  }
  return s;
}

Status CheckpointStore::LoadLatest(const std::string& fingerprint, LoadedCheckpoint* out) {
  // A writer in another process may save and prune between our List and our read of a
  // checkpoint (and a read-only open racing with its close may see the meta of a checkpoint whose
  // files it already dropped). A read that fails while the store has changed since our List is
  // that race, not corruption: start over from a fresh list, a bounded number of times (each
  // start-over follows a newer save). A failure in a store that has not changed is corruption.
  constexpr int kMaxRelists = 16;
  std::vector<CheckpointMeta> all;
  EDL_RETURN_IF_ERROR(List(&all));
  for (int relist = 0;; ++relist) {
    if (all.empty()) {
      return Status::NotFound(Describe() +
                              " holds no checkpoint yet (cold start with fresh state)");
    }
    const CheckpointMeta& latest = all.back();
    if (!fingerprint.empty() && latest.fingerprint != fingerprint) {
      return Status::FailedPrecondition(
          Describe() + ": latest checkpoint " + std::to_string(latest.id) +
          " was written for fingerprint '" + latest.fingerprint + "' but this trainer's is '" +
          fingerprint +
          "' (another model, shapes or config); point --checkpoint_dir at this "
          "job's store or start from fresh state with an empty directory");
    }
    std::string failures;
    bool changed = false;  // a read failed and the store's list had changed since ours
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (!fingerprint.empty() && it->fingerprint != fingerprint) continue;
      Status s = ReadVerified(this, *it, out);
      if (s.ok()) {
        if (it != all.rbegin()) {
          LOG(WARNING) << Describe() << ": loaded checkpoint " << it->id << " (step " << it->step
                       << ") instead of the latest because newer ones failed:" << failures;
        }
        return s;
      }
      if (!s.IsCorruption() && s.code() != Status::Code::kIOError) return s;
      std::vector<CheckpointMeta> now;
      if (relist < kMaxRelists && List(&now).ok() &&
          (now.empty() || now.back().id != all.back().id)) {
        LOG(INFO) << Describe() << ": checkpoint " << it->id << " could not be read while a writer "
                  << "saved and pruned (" << s.ToString() << "); loading the newest again";
        all = std::move(now);  // the fresh list: the next round needs no List of its own
        changed = true;
        break;
      }
      LOG(WARNING) << Describe() << ": checkpoint " << it->id << " does not verify, trying the "
                   << "one before it: " << s.ToString();
      failures += " [" + s.ToString() + "]";
    }
    if (!changed) {
      return Status::Corruption(Describe() + ": no checkpoint verifies:" + failures +
                                "; run `edl ckpt verify` for details");
    }
  }
}

}  // namespace edl::ckpt
