// MemoryKvStore: an in-process KvStore (a map under a mutex) for tests that run several ranks as
// threads of one process. Thread-safe; Wait blocks on a condition variable (no polling).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

class MemoryKvStore : public KvStore {
 public:
  MemoryKvStore() = default;
  MemoryKvStore(const MemoryKvStore&) = delete;
  MemoryKvStore& operator=(const MemoryKvStore&) = delete;

  Status Set(const std::string& key, const std::string& value) override;
  Status Get(const std::string& key, std::string* value) override;
  Status Wait(const std::string& key, std::chrono::milliseconds timeout,
              std::string* value) override;

  // Number of keys stored (for tests).
  size_t size() const;

 private:
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_ GUARDED_BY(mu_);
};

}  // namespace edl::runtime
