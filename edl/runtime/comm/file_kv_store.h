// FileKvStore: a KvStore over files in one directory, for static mode (`edl launch`, no server):
// every rank of the job opens the same directory (local disk for one node, a shared mount for
// several). A key is one file whose name is the key with unsafe bytes %-escaped; Set writes a
// temporary file and renames it, so a reader never sees a partial value. Wait polls (1..10 ms).
//
// The directory must be fresh for each job run (stale keys from an earlier run would be read as
// current): `edl launch` makes one; otherwise callers put a run id into their key prefix.
// Thread-safe (no in-memory state besides the immutable path).
#pragma once

#include <chrono>
#include <string>

#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

class FileKvStore : public KvStore {
 public:
  // Does not touch the disk; the directory is created by the first Set.
  explicit FileKvStore(std::string dir) : dir_(std::move(dir)) {}

  Status Set(const std::string& key, const std::string& value) override;
  Status Get(const std::string& key, std::string* value) override;
  Status Wait(const std::string& key, std::chrono::milliseconds timeout,
              std::string* value) override;

  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(const std::string& key) const;

  const std::string dir_;
};

}  // namespace edl::runtime
