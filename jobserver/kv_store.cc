#include "jobserver/kv_store.h"

#include <cstdlib>

namespace edl::jobserver {

void KvStore::Set(const std::string& key, const std::string& value) {
  values_[key] = value;
  auto range = waiters_.equal_range(key);
  std::vector<Reply> wake;
  for (auto it = range.first; it != range.second; ++it) wake.push_back(std::move(it->second.reply));
  waiters_.erase(range.first, range.second);
  for (Reply& r : wake) r(Status::OK(), value);
}

Status KvStore::Get(const std::string& key, std::string* value) const {
  auto it = values_.find(key);
  if (it == values_.end()) return Status::NotFound("kv key '" + key + "' is not set");
  *value = it->second;
  return Status::OK();
}

void KvStore::Wait(const std::string& key, int64_t deadline_us, Reply reply) {
  auto it = values_.find(key);
  if (it != values_.end()) {
    reply(Status::OK(), it->second);
    return;
  }
  waiters_.emplace(key, Waiter{key, deadline_us, std::move(reply)});
}

void KvStore::Expire(int64_t now_us) {
  std::vector<std::pair<std::string, Reply>> late;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.deadline_us <= now_us) {
      late.emplace_back(it->first, std::move(it->second.reply));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [key, r] : late) {
    r(Status::Timeout("kv key '" + key + "' was not set before the wait's deadline"), "");
  }
}

size_t KvStore::CollectGarbage(int64_t current_generation) {
  size_t erased = 0;
  for (auto it = values_.begin(); it != values_.end();) {
    const std::string& k = it->first;
    const size_t slash = k.find('/');
    bool old = false;
    if (slash != std::string::npos && slash + 1 < k.size() && k[slash + 1] == 'g') {
      char* end = nullptr;
      const long long g = std::strtoll(k.c_str() + slash + 2, &end, 10);
      old = end != k.c_str() + slash + 2 && *end == '/' && g < current_generation - 2;
    }
    if (old) {
      it = values_.erase(it);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

}  // namespace edl::jobserver
