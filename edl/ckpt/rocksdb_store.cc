// The RocksDB CheckpointStore. Disk layout in FORMAT.md. Each call opens the database for its own
// duration: read-write (waiting up to lock_timeout for the LOCK file) for Save, read-only for the
// rest, so successive writers in different processes and concurrent readers share a directory.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <glog/logging.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "edl/base/clock.h"
#include "edl/base/thread_annotations.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/ckpt/crc32c.h"

namespace edl::ckpt {
namespace {

namespace fs = std::filesystem;

// ---- key layout (FORMAT.md)

constexpr char kLatestKey[] = "latest";
constexpr char kMetaPrefix[] = "meta/";
constexpr char kDataPrefix[] = "data/";  // every tensor chunk key (DataPrefix(id) below)
constexpr char kMetaEnd[] = "meta0";     // '0' == '/' + 1: just past every "meta/..." key
constexpr char kIngestDir[] = "ingest";

std::string MetaKey(int64_t id) {
  char buf[32];
  snprintf(buf, sizeof(buf), "meta/%016lld", static_cast<long long>(id));
  return buf;
}
std::string DataPrefix(int64_t id) {
  char buf[32];
  snprintf(buf, sizeof(buf), "data/%016lld/", static_cast<long long>(id));
  return buf;
}
std::string DataEnd(int64_t id) {  // just past every key of DataPrefix(id)
  char buf[32];
  snprintf(buf, sizeof(buf), "data/%016lld0", static_cast<long long>(id));
  return buf;
}
std::string ChunkKey(int64_t id, size_t tensor, size_t chunk) {
  char buf[64];
  snprintf(buf, sizeof(buf), "data/%016lld/%06zu/%08zu", static_cast<long long>(id), tensor, chunk);
  return buf;
}
size_t NumChunks(uint64_t bytes, size_t chunk) {
  return bytes == 0 ? 1 : static_cast<size_t>((bytes + chunk - 1) / chunk);
}

Status FromRocks(const std::string& context, const rocksdb::Status& s) {
  if (s.ok()) return Status::OK();
  const std::string msg = context + ": " + s.ToString();
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsIOError()) return Status::IOError(msg);
  if (s.IsTimedOut()) return Status::Timeout(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  return Status::Internal(msg);
}

bool IsLockHeld(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  std::string m = s.ToString();
  std::transform(m.begin(), m.end(), m.begin(), ::tolower);
  return m.find("lock") != std::string::npos;
}

// A file the MANIFEST lists is gone: deleted by a writer after we read that MANIFEST.
bool IsVanishedFile(const rocksdb::Status& s) {
  if (!s.IsCorruption() && !s.IsIOError() && !s.IsPathNotFound()) return false;
  std::string m = s.ToString();
  std::transform(m.begin(), m.end(), m.begin(), ::tolower);
  return m.find("no such file") != std::string::npos || m.find("can't access") != std::string::npos;
}

// What a writer changes before it deletes a file (a prune, a compaction): CURRENT's contents and
// the size of the MANIFEST it names ("" parts where there is none).
std::string ManifestState(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "CURRENT", std::ios::binary);
  std::string current(256, '\0');
  in.read(current.data(), static_cast<std::streamsize>(current.size()));
  current.resize(static_cast<size_t>(in.gcount()));
  while (!current.empty() && (current.back() == '\n' || current.back() == '\r')) current.pop_back();
  std::error_code ec;
  const uintmax_t size = current.empty() || current.find('/') != std::string::npos
                             ? 0
                             : fs::file_size(fs::path(dir) / current, ec);
  return current + ":" + (ec ? std::string("missing") : std::to_string(size));
}

// Applies `batch` and makes it durable without the WAL: the write goes to the memtable only and a
// flush turns it into a table file, recorded by one MANIFEST edit. Every change of the store is
// then a MANIFEST edit, so a read-only opener, which reads the MANIFEST and the WAL files at two
// different moments, never combines a newer WAL with an older MANIFEST (that mix showed a store
// with no checkpoint, or a listed checkpoint without its files). It sees some earlier state whole.
Status CommitBatch(rocksdb::DB* db, rocksdb::WriteBatch* batch, const std::string& what) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  rocksdb::Status s = db->Write(wo, batch);
  if (s.ok()) {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    s = db->Flush(fo);
  }
  return FromRocks(what, s);
}

// Closes the database cleanly on scope exit.
struct DbCloser {
  void operator()(rocksdb::DB* db) const {
    if (db == nullptr) return;
    rocksdb::Status s = db->Close();
    if (!s.ok()) LOG(WARNING) << "closing checkpoint store: " << s.ToString();
    delete db;
  }
};
using DbPtr = std::unique_ptr<rocksdb::DB, DbCloser>;

class RocksDbStore : public CheckpointStore {
 public:
  explicit RocksDbStore(RocksDbStoreOptions o)
      : o_(std::move(o)), since_(Clock::Real()->WallMicros()) {
    if (o_.keep_checkpoints < 1) o_.keep_checkpoints = 1;
    if (o_.chunk_bytes < 4096) o_.chunk_bytes = 4096;
  }

  Status Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
              int64_t* id) override;
  Status List(std::vector<CheckpointMeta>* out) override;
  Status ReadTensors(const CheckpointMeta& meta, const std::function<void*(size_t)>& dst_for,
                     const std::function<Status(size_t)>& done) override;
  std::string Describe() const override { return "checkpoint store " + o_.dir; }

 private:
  rocksdb::Options DbOptions() const;
  // The write path, one Save at a time: RocksDB allows one opener for writing, and the files a
  // save stages in the ingest directory are its own (OpenForWrite removes what is left there).
  Status OpenForWrite(DbPtr* db) REQUIRES(write_mu_);
  Status OpenForRead(DbPtr* db);
  Status ListOpen(rocksdb::DB* db, std::vector<CheckpointMeta>* out);
  Status WriteSst(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                  std::vector<std::string>* files, CheckpointMeta* stored) REQUIRES(write_mu_);
  Status WriteBatch(rocksdb::DB* db, const CheckpointMeta& meta,
                    const std::vector<TensorView>& tensors, CheckpointMeta* stored)
      REQUIRES(write_mu_);
  Status Prune(rocksdb::DB* db) REQUIRES(write_mu_);
  Status ReadRange(rocksdb::DB* db, const CheckpointMeta& meta, size_t begin, size_t end,
                   const std::function<void*(size_t)>& dst_for,
                   const std::function<Status(size_t)>& done, const std::atomic<bool>& cancel);

  RocksDbStoreOptions o_;
  const int64_t since_;  // wall clock when this handle was made: the writer's start (CheckFence)
  Mutex write_mu_;
};

rocksdb::Options RocksDbStore::DbOptions() const {
  rocksdb::Options options;
  options.compression = rocksdb::kNoCompression;
  options.disable_auto_compactions = true;  // data SSTs stay whole so pruning drops files
  options.keep_log_file_num = 2;
  options.max_open_files = -1;  // every table file open from the open on (OpenForRead)
  options.max_manifest_file_size = 16 << 20;
  options.use_direct_reads = o_.direct_reads;
  options.use_direct_io_for_flush_and_compaction = o_.direct_writes;
  rocksdb::BlockBasedTableOptions table;
  // Small blocks: a chunk of 4 KiB or more is a block of its own, so a block checksum failure
  // names the right tensor; only tensors under 4 KiB share blocks.
  table.block_size = 4096;
  table.checksum = rocksdb::kXXH3;
  table.no_block_cache = true;  // tensors are read once; no point caching them
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  if (o_.save_method != SaveMethod::kSstIngest) {
    options.write_buffer_size = 1ull << 30;  // a whole checkpoint fits one memtable
    options.max_write_buffer_number = 3;
  }
  if (o_.save_method == SaveMethod::kBlobWriteBatch) {
    options.enable_blob_files = true;
    options.min_blob_size = 64 << 10;
    options.blob_file_size = 1ull << 30;
  }
  return options;
}

Status RocksDbStore::OpenForWrite(DbPtr* out) {
  std::error_code ec;
  fs::create_directories(fs::path(o_.dir) / kIngestDir, ec);
  if (ec) {
    return Status::IOError("cannot create checkpoint directory " + o_.dir + ": " + ec.message() +
                           "; check --checkpoint_dir and its permissions");
  }
  rocksdb::Options options = DbOptions();
  options.create_if_missing = true;
  const int64_t deadline = Clock::Real()->NowMicros() + o_.lock_timeout.count() * 1000;
  for (int attempt = 0;; ++attempt) {
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(options, o_.dir, &db);
    if (s.ok()) {
      out->reset(db);
      break;
    }
    if (!IsLockHeld(s)) return FromRocks("opening " + Describe() + " for writing", s);
    if (Clock::Real()->NowMicros() >= deadline) {
      return Status::Timeout(Describe() + " is locked by another writer (" + s.ToString() +
                             ") for more than " + std::to_string(o_.lock_timeout.count()) +
                             " ms; is a stale trainer still running? stop it and retry");
    }
    if (attempt == 0) LOG(INFO) << Describe() << " is locked by another writer; waiting";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Leftovers of a save that was killed before its ingestion: never part of the database.
  for (const auto& entry : fs::directory_iterator(fs::path(o_.dir) / kIngestDir, ec)) {
    fs::remove(entry.path(), ec);
  }
  return Status::OK();
}

Status RocksDbStore::OpenForRead(DbPtr* out) {
  std::error_code ec;
  if (!fs::exists(fs::path(o_.dir) / "CURRENT", ec)) {
    return Status::NotFound(Describe() +
                            " does not exist (no checkpoint was ever saved there; "
                            "a trainer starts from fresh state)");
  }
  // A writer in another process may delete files between our read of its MANIFEST and our open
  // of the files it lists (a prune or its compaction): "Can't access 000258.sst". The next open
  // reads the new MANIFEST, so that one error is retried, for up to lock_timeout as a writer's
  // LOCK is. A writer records every deletion in the MANIFEST before it deletes: a file missing
  // while CURRENT and its MANIFEST stayed as they were is damage (a table file deleted by hand,
  // CURRENT naming a MANIFEST that is gone), told at once rather than after the wait. Once open,
  // every table file is held open (max_open_files -1), so later deletions do not reach the reads.
  const int64_t deadline = Clock::Real()->NowMicros() + o_.lock_timeout.count() * 1000;
  for (int attempt = 0;; ++attempt) {
    const std::string before = ManifestState(o_.dir);
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(DbOptions(), o_.dir, &db);
    if (s.ok()) {
      out->reset(db);
      return Status::OK();
    }
    if (IsVanishedFile(s) && ManifestState(o_.dir) == before) {
      return Status::Corruption(
          Describe() + " is damaged: " + s.ToString() +
          ", and no writer changed the store "
          "meanwhile (a file was deleted or lost outside EDL). Move the directory aside "
          "(trainers then start from fresh state) or restore it from a copy");
    }
    if (!IsVanishedFile(s) || Clock::Real()->NowMicros() >= deadline) {
      return FromRocks("opening " + Describe() + " read-only", s);
    }
    if (attempt == 0) {
      LOG(INFO) << Describe() << ": a file vanished while opening read-only (" << s.ToString()
                << "); a writer is pruning it, retrying";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status RocksDbStore::ListOpen(rocksdb::DB* db, std::vector<CheckpointMeta>* out) {
  out->clear();
  rocksdb::ReadOptions ro;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->Seek(kMetaPrefix); it->Valid() && it->key().starts_with(kMetaPrefix); it->Next()) {
    CheckpointMeta m;
    Status s = CheckpointMeta::DecodeJson(it->value().ToString(), &m);
    if (!s.ok()) {
      LOG(WARNING) << Describe() << ": skipping unreadable metadata " << it->key().ToString()
                   << ": " << s.ToString();
      continue;
    }
    out->push_back(std::move(m));
  }
  return FromRocks("listing " + Describe(), it->status());
}

Status RocksDbStore::List(std::vector<CheckpointMeta>* out) {
  DbPtr db;
  EDL_RETURN_IF_ERROR(OpenForRead(&db));
  return ListOpen(db.get(), out);
}

// Fills stored->tensors (with checksums) while writing every chunk of `tensors`, calling
// put(key, value) for each in key order.
template <typename Put>
Status PutTensors(int64_t id, size_t chunk, const std::vector<TensorView>& tensors,
                  CheckpointMeta* stored, Put&& put) {
  stored->tensors.clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& v = tensors[i];
    const auto* p = static_cast<const char*>(v.data);
    uint32_t crc = 0;
    const size_t n = NumChunks(v.bytes, chunk);
    for (size_t c = 0; c < n; ++c) {
      const size_t off = c * chunk;
      const size_t len = std::min<size_t>(chunk, v.bytes - std::min<size_t>(off, v.bytes));
      crc = Crc32cExtend(crc, p + off, len);
      EDL_RETURN_IF_ERROR(put(ChunkKey(id, i, c), rocksdb::Slice(p + off, len)));
    }
    stored->tensors.push_back({v.name, v.dtype, v.shape, v.bytes, crc});
  }
  return Status::OK();
}

Status RocksDbStore::WriteSst(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                              std::vector<std::string>* files, CheckpointMeta* stored) {
  const rocksdb::Options options = DbOptions();
  rocksdb::EnvOptions env_options(options);
  env_options.use_direct_writes = o_.direct_writes;
  const std::string base = (fs::path(o_.dir) / kIngestDir).string() + "/" + std::to_string(meta.id);
  const std::string what = Describe() + ": writing checkpoint " + std::to_string(meta.id);
  {
    rocksdb::SstFileWriter data(env_options, options);
    files->push_back(base + "-data.sst");
    EDL_RETURN_IF_ERROR(FromRocks(what, data.Open(files->back())));
    EDL_RETURN_IF_ERROR(PutTensors(meta.id, o_.chunk_bytes, tensors, stored,
                                   [&](const std::string& k, const rocksdb::Slice& v) {
                                     return FromRocks(what, data.Put(k, v));
                                   }));
    if (tensors.empty()) {
      files->pop_back();
    } else {
      EDL_RETURN_IF_ERROR(FromRocks(what, data.Finish()));
    }
  }
  rocksdb::SstFileWriter index(env_options, options);
  files->push_back(base + "-meta.sst");
  EDL_RETURN_IF_ERROR(FromRocks(what, index.Open(files->back())));
  EDL_RETURN_IF_ERROR(FromRocks(what, index.Put(kLatestKey, std::to_string(meta.id))));
  EDL_RETURN_IF_ERROR(FromRocks(what, index.Put(MetaKey(meta.id), stored->EncodeJson())));
  return FromRocks(what, index.Finish());
}

Status RocksDbStore::WriteBatch(rocksdb::DB* db, const CheckpointMeta& meta,
                                const std::vector<TensorView>& tensors, CheckpointMeta* stored) {
  const std::string what = Describe() + ": writing checkpoint " + std::to_string(meta.id);
  rocksdb::WriteBatch batch;
  EDL_RETURN_IF_ERROR(PutTensors(meta.id, o_.chunk_bytes, tensors, stored,
                                 [&](const std::string& k, const rocksdb::Slice& v) {
                                   return FromRocks(what, batch.Put(k, v));
                                 }));
  EDL_RETURN_IF_ERROR(FromRocks(what, batch.Put(kLatestKey, std::to_string(meta.id))));
  EDL_RETURN_IF_ERROR(FromRocks(what, batch.Put(MetaKey(meta.id), stored->EncodeJson())));
  return CommitBatch(db, &batch, what);
}

Status RocksDbStore::Save(const CheckpointMeta& meta, const std::vector<TensorView>& tensors,
                          int64_t* id) {
  MutexLock lock(&write_mu_);
  DbPtr db;
  EDL_RETURN_IF_ERROR(OpenForWrite(&db));
  // Fencing, under the database LOCK: nobody else can write between this check and the ingest.
  std::vector<CheckpointMeta> existing;
  EDL_RETURN_IF_ERROR(ListOpen(db.get(), &existing));
  CheckpointMeta stored = meta;
  stored.id = 1;
  if (!existing.empty()) {
    const CheckpointMeta& newest = existing.back();
    EDL_RETURN_IF_ERROR(CheckFence(Describe(), meta, newest, since_));
    stored.id = newest.id + 1;
  }
  if (stored.wall_time_micros == 0) stored.wall_time_micros = Clock::Real()->WallMicros();
  if (o_.save_method == SaveMethod::kSstIngest) {
    std::vector<std::string> files;
    Status s = WriteSst(stored, tensors, &files, &stored);
    if (s.ok()) {
      rocksdb::IngestExternalFileOptions ingest;
      ingest.move_files = true;  // hard links: the bytes are written once
      s = FromRocks(Describe() + ": ingesting checkpoint " + std::to_string(stored.id),
                    db->IngestExternalFile(files, ingest));
    }
    std::error_code ec;
    for (const auto& f : files) fs::remove(f, ec);
    EDL_RETURN_IF_ERROR(s);
  } else {
    EDL_RETURN_IF_ERROR(WriteBatch(db.get(), stored, tensors, &stored));
  }
  if (id != nullptr) *id = stored.id;
  Status s = Prune(db.get());
  if (!s.ok())
    LOG(WARNING) << "checkpoint " << stored.id << " saved, but pruning failed: " << s.ToString();
  return Status::OK();
}

// Deletes all but the newest keep_checkpoints checkpoints and returns their disk space. The
// metadata goes first, in one flushed write (CommitBatch): from then on the store no longer lists
// them, so a writer killed at any later point never leaves a listed checkpoint without its tensors.
// Then every data key below the oldest kept checkpoint goes (ids only grow, so none of them belongs
// to a listed checkpoint): those just unlisted, and any a killed writer left behind. In the SST
// layout each checkpoint's tensors are whole files, dropped by DeleteFilesInRange; anything left in
// the range (WriteBatch layouts) is removed by a range delete and a compaction.
Status RocksDbStore::Prune(rocksdb::DB* db) {
  std::vector<CheckpointMeta> all;
  EDL_RETURN_IF_ERROR(ListOpen(db, &all));
  if (all.empty()) return Status::OK();
  const size_t keep = static_cast<size_t>(o_.keep_checkpoints);
  const size_t drop = all.size() > keep ? all.size() - keep : 0;
  if (drop > 0) {
    rocksdb::WriteBatch unlist;
    for (size_t i = 0; i < drop; ++i) unlist.Delete(MetaKey(all[i].id));
    EDL_RETURN_IF_ERROR(CommitBatch(db, &unlist, "pruning " + Describe()));
  }
  const std::string begin = kDataPrefix, end = DataPrefix(all[drop].id);
  rocksdb::Slice b(begin), e(end);
  auto any_data = [&] {
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &e;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    it->Seek(b);
    return it->Valid();
  };
  rocksdb::CompactRangeOptions cro;
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  if (any_data()) {
    EDL_RETURN_IF_ERROR(FromRocks("pruning " + Describe(),
                                  rocksdb::DeleteFilesInRange(db, db->DefaultColumnFamily(), &b, &e,
                                                              /*include_end=*/false)));
    if (any_data()) {
      rocksdb::WriteBatch rest;
      rest.DeleteRange(begin, end);
      EDL_RETURN_IF_ERROR(CommitBatch(db, &rest, "pruning " + Describe()));
    }
    EDL_RETURN_IF_ERROR(FromRocks("compacting " + Describe(), db->CompactRange(cro, &b, &e)));
  }
  if (drop == 0) return Status::OK();
  // Merge the small metadata files (one per save) and drop the deleted keys for good.
  rocksdb::Slice mb(kLatestKey), me(kMetaEnd);
  return FromRocks("compacting " + Describe(), db->CompactRange(cro, &mb, &me));
}

// Reads tensors [begin, end) of `meta` with one iterator (one reader thread's share).
Status RocksDbStore::ReadRange(rocksdb::DB* db, const CheckpointMeta& meta, size_t begin,
                               size_t end, const std::function<void*(size_t)>& dst_for,
                               const std::function<Status(size_t)>& done,
                               const std::atomic<bool>& cancel) {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  const std::string upper_key = DataEnd(meta.id);
  rocksdb::Slice upper(upper_key);
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (size_t i = begin; i < end && !cancel.load(); ++i) {
    const TensorRecord& t = meta.tensors[i];
    const std::string what =
        Describe() + " checkpoint " + std::to_string(meta.id) + " tensor '" + t.name + "'";
    auto* dst = static_cast<char*>(dst_for(i));
    if (dst == nullptr) continue;
    const size_t n = NumChunks(t.bytes, o_.chunk_bytes);
    it->Seek(ChunkKey(meta.id, i, 0));
    for (size_t c = 0; c < n; ++c, it->Next()) {
      if (!it->Valid()) {
        EDL_RETURN_IF_ERROR(FromRocks(what, it->status()));
        return Status::Corruption(what + ": chunk " + std::to_string(c) + " is missing");
      }
      const size_t off = c * o_.chunk_bytes;
      const size_t len = std::min<size_t>(o_.chunk_bytes, t.bytes - std::min<size_t>(off, t.bytes));
      if (it->key() != ChunkKey(meta.id, i, c) || it->value().size() != len) {
        return Status::Corruption(what + ": chunk " + std::to_string(c) + " is missing or has " +
                                  std::to_string(it->value().size()) + " bytes, expected " +
                                  std::to_string(len));
      }
      std::memcpy(dst + off, it->value().data(), len);
    }
    EDL_RETURN_IF_ERROR(done(i));
  }
  return Status::OK();
}

Status RocksDbStore::ReadTensors(const CheckpointMeta& meta,
                                 const std::function<void*(size_t)>& dst_for,
                                 const std::function<Status(size_t)>& done) {
  DbPtr db;
  EDL_RETURN_IF_ERROR(OpenForRead(&db));
  // Split the tensors into read_threads contiguous ranges of about equal bytes; each range is
  // read by its own thread so disk reads overlap with copying and checksumming.
  const size_t threads =
      std::max<size_t>(1, std::min<size_t>(o_.read_threads, meta.tensors.size()));
  std::vector<size_t> bounds = {0};
  const uint64_t share = meta.TotalBytes() / threads + 1;
  uint64_t acc = 0;
  for (size_t i = 0; i < meta.tensors.size(); ++i) {
    acc += meta.tensors[i].bytes;
    if (acc >= share * bounds.size() && bounds.size() < threads) bounds.push_back(i + 1);
  }
  bounds.push_back(meta.tensors.size());
  std::atomic<bool> cancel{false};
  std::vector<Status> results(bounds.size() - 1);
  std::vector<std::thread> pool;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    auto work = [&, k] {
      results[k] = ReadRange(db.get(), meta, bounds[k], bounds[k + 1], dst_for, done, cancel);
      if (!results[k].ok()) cancel = true;
    };
    if (k + 2 == bounds.size()) {
      work();  // the last range on the calling thread
    } else {
      pool.emplace_back(work);
    }
  }
  for (auto& t : pool) t.join();
  for (const Status& s : results) EDL_RETURN_IF_ERROR(s);
  return Status::OK();
}

}  // namespace

std::unique_ptr<CheckpointStore> OpenRocksDbStore(const RocksDbStoreOptions& options) {
  return std::make_unique<RocksDbStore>(options);
}

}  // namespace edl::ckpt
