// CheckpointStore: durable training checkpoints for cold starts and whole-job failures.
//
// A checkpoint is a metadata record (step, epoch, data cursor, generation, world size, model/config
// fingerprint, wall time, one TensorRecord per tensor with its CRC-32C, free-form JSON for the
// runtime) plus the tensors' host bytes. Checkpoints get ascending ids; the newest is "latest".
//
// Guarantees of every implementation:
//  - Save is atomic: all tensors, the metadata and the latest pointer become visible together or
//    not at all; a crash (even SIGKILL) mid-save leaves the previous checkpoints whole.
//  - Fencing: inside the write, a save whose generation is older than the newest stored
//    checkpoint's is refused with FailedPrecondition naming both generations, which way the fence
//    points and the fix (CheckFence).
//  - Only the last `keep_checkpoints` checkpoints are kept; older ones are deleted and their disk
//    space returned.
//  - Reads verify: LoadLatest checks the fingerprint (a mismatch is an error naming both, never a
//    silent load) and every checksum; a corrupt latest falls back to the one before it.
//
// Implementations: OpenRocksDbStore (a RocksDB directory on local disk or NFS; see FORMAT.md) and
// NewMemoryStore (in-process, for tests of other components).
//
// Thread-safety: a CheckpointStore may be used from several threads; calls are serialised inside.
// The RocksDB store opens the database for each call and closes it before returning, so several
// processes (the rank 0 of successive generations, `edl ckpt ls`) can share one directory: a
// writer waits up to `lock_timeout` for another writer's LOCK, readers open read-only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/dtype.h"
#include "edl/base/status.h"

namespace edl::ckpt {

// "float32", "int64", ...; ParseDataType returns InvalidArgument for an unknown name.
const char* DataTypeName(DataType t);
Status ParseDataType(const std::string& name, DataType* out);

// One stored tensor's description. `bytes` is the byte size of its host image.
struct TensorRecord {
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // CRC-32C of the bytes (crc32c.h)
};

// A tensor to save: a view of `bytes` bytes of host memory the caller owns for the call.
struct TensorView {
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

struct CheckpointMeta {
  int64_t id = 0;    // assigned by Save (ascending from 1); ignored on input
  int64_t step = 0;  // optimizer steps completed
  int64_t epoch = 0;
  int64_t cursor = 0;      // global data cursor within the epoch
  int64_t generation = 0;  // generation of the writer (fencing)
  int world_size = 0;
  std::string fingerprint;       // model/config fingerprint (Trainable::Fingerprint)
  int64_t wall_time_micros = 0;  // set by Save when 0
  // A JSON object for the runtime: its TrainingState under "training_state"
  // (edl/runtime/training_state.h, EncodeCheckpointMeta; docs/ARCHITECTURE.md, "Training state").
  std::string extra_json = "{}";
  std::vector<TensorRecord> tensors;  // filled by Save from the TensorViews; ignored on input

  uint64_t TotalBytes() const;
  const TensorRecord* FindTensor(const std::string& name) const;
  // JSON with a format magic and version; DecodeJson checks both and every field's type.
  std::string EncodeJson() const;
  static Status DecodeJson(const std::string& json, CheckpointMeta* out);
};

// A checkpoint read back into host memory. data[i] holds meta.tensors[i].bytes bytes.
struct LoadedCheckpoint {
  CheckpointMeta meta;
  std::vector<std::unique_ptr<uint8_t[]>> data;
  // Bytes of the tensor called `name`, or nullptr.
  const uint8_t* Find(const std::string& name) const;
};

// Outcome of Verify: the names of tensors whose checksum (or storage) failed.
struct VerifyReport {
  int64_t id = 0;
  size_t tensors_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> corrupt;  // "name: reason"
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;

  // Saves one checkpoint atomically, computing each tensor's checksum. meta.id and meta.tensors
  // are ignored (derived). On success *id (if not null) is the new checkpoint's id.
  // FailedPrecondition: meta.generation is older than the newest stored checkpoint's.
  // Timeout: another writer held the store longer than the lock timeout.
  virtual Status Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                      int64_t* id) = 0;

  // Metadata of every stored checkpoint, ascending by id. NotFound when the store does not exist
  // (a cold start); OK with an empty list when it exists but holds none.
  virtual Status List(std::vector<CheckpointMeta>* out) = 0;

  // Streams the raw (unverified) bytes of checkpoint meta.id: for each tensor i, writes
  // meta.tensors[i].bytes bytes to dst_for(i) (skipped when it returns nullptr), then calls
  // done(i); a non-OK from done stops the read and is returned. An unreadable tensor returns
  // Corruption or IOError naming it. The callbacks may run concurrently on several threads, each
  // call for a distinct i (dst_for(i) before done(i)); they must be thread-safe in that sense.
  virtual Status ReadTensors(const CheckpointMeta& meta,
                             const std::function<void*(size_t)>& dst_for,
                             const std::function<Status(size_t)>& done) = 0;

  // Where the store lives, for messages ("rocksdb store /mnt/ckpt").
  virtual std::string Describe() const = 0;

  // ---- shared logic on top of the primitives above

  // Reads and verifies checkpoint `id` (NotFound if absent, Corruption naming the first bad
  // tensor).
  Status Read(int64_t id, LoadedCheckpoint* out);
  // Checks every tensor of checkpoint `id`; returns OK with report->corrupt listing the bad ones,
  // or an error when the checkpoint cannot be read at all.
  Status Verify(int64_t id, VerifyReport* report);
  // Loads the newest checkpoint whose bytes verify. NotFound: no store or no checkpoint (cold
  // start). FailedPrecondition: the latest was written for another fingerprint (both named).
  // A corrupt or unreadable latest is skipped with a warning; Corruption when none verifies.
  // An empty `fingerprint` accepts any.
  Status LoadLatest(const std::string& fingerprint, LoadedCheckpoint* out);
};

enum class SaveMethod {
  kSstIngest,       // tensors written to SST files with SstFileWriter, ingested at once (default)
  kWriteBatch,      // one synced WriteBatch (for benchmarks)
  kBlobWriteBatch,  // one synced WriteBatch with BlobDB blob files (for benchmarks)
};

struct RocksDbStoreOptions {
  // Directory of the store (created by the first Save). Local disk or an NFS mount.
  std::string dir;
  // Checkpoints kept; older ones are deleted after each successful save. >= 1.
  int keep_checkpoints = 3;
  // Bound on waiting for another process's write lock (LOCK file) before Timeout.
  std::chrono::milliseconds lock_timeout{60000};
  // How a save is written (kSstIngest is the fastest measured; see bench/checkpoint.sh).
  SaveMethod save_method = SaveMethod::kSstIngest;
  // Tensors are stored as values of at most this many bytes (chunks of >= 4 KiB get an SST block
  // each).
  size_t chunk_bytes = 4 << 20;
  // O_DIRECT for reads (load) and SST writes (save): bypasses the page cache.
  bool direct_reads = false;
  bool direct_writes = false;
  // Threads reading one checkpoint (each a contiguous share of the tensors), overlapping disk
  // reads with copying and checksum verification.
  int read_threads = 4;
};

// A store in options.dir. Opening touches nothing on disk; every call opens the database for its
// own duration (read-write for Save, read-only otherwise) and closes it cleanly.
std::unique_ptr<CheckpointStore> OpenRocksDbStore(const RocksDbStoreOptions& options);

// An in-process store with the same semantics (atomic saves, fencing, keep-K), for tests.
std::unique_ptr<CheckpointStore> NewMemoryStore(int keep_checkpoints = 3);

// The fence, for the stores' Save (one home for its rule and its message): OK when `writer` may
// save over `newest` (the newest stored checkpoint), else FailedPrecondition saying which way the
// fence points and the fix. `writer_since_wall_micros` is when the writer's store handle was
// made (wall clock): a newest checkpoint written after it came from a newer generation of the
// same job (this writer is stale); one written before it was already in the store when this
// writer started, so the store is ahead of this job's generations (a store of an earlier run whose
// server state was started afresh beside it). `store` names the store (Describe()).
Status CheckFence(const std::string& store, const CheckpointMeta& writer,
                  const CheckpointMeta& newest, int64_t writer_since_wall_micros);

}  // namespace edl::ckpt
