#include "edl/runtime/comm/memory_kv_store.h"

namespace edl::runtime {

Status MemoryKvStore::Set(const std::string& key, const std::string& value) {
  {
    MutexLock lock(&mu_);
    map_[key] = value;
  }
  cv_.notify_all();
  return Status::OK();
}

Status MemoryKvStore::Get(const std::string& key, std::string* value) {
  MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return Status::NotFound("rendezvous key '" + key + "' is not set");
  *value = it->second;
  return Status::OK();
}

Status MemoryKvStore::Wait(const std::string& key, std::chrono::milliseconds timeout,
                           std::string* value) {
  MutexLock lock(&mu_);
  if (!cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) { return map_.count(key) > 0; })) {
    return Status::Timeout("rendezvous key '" + key + "' did not appear within " +
                           std::to_string(timeout.count()) + " ms; is every peer running?");
  }
  *value = map_[key];
  return Status::OK();
}

size_t MemoryKvStore::size() const {
  MutexLock lock(&mu_);
  return map_.size();
}

}  // namespace edl::runtime
