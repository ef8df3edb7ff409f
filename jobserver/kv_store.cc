#include "jobserver/kv_store.h"

#include "edl/proto/rendezvous_key.h"

namespace edl::jobserver {

Status KvStore::Set(const std::string& key, const std::string& value) {
  if (value.size() > limits_.max_value_bytes) {
    return Status::FailedPrecondition(
        "kv value for '" + key + "' is " + std::to_string(value.size()) + " bytes; the limit is " +
        std::to_string(limits_.max_value_bytes) + " (server flag --kv_max_value_bytes)");
  }
  auto it = values_.find(key);
  const size_t old = it == values_.end() ? 0 : key.size() + it->second.size();
  if (it == values_.end() && values_.size() >= limits_.max_keys) {
    return Status::FailedPrecondition("kv store of the job holds " +
                                      std::to_string(values_.size()) +
                                      " keys, the limit (server flag --kv_max_keys); keys of "
                                      "generations older than the current one minus 2 are dropped");
  }
  if (bytes_ - old + key.size() + value.size() > limits_.max_total_bytes) {
    return Status::FailedPrecondition("kv store of the job holds " + std::to_string(bytes_) +
                                      " bytes; storing '" + key + "' would pass the limit of " +
                                      std::to_string(limits_.max_total_bytes) +
                                      " (server flag --kv_max_bytes)");
  }
  bytes_ = bytes_ - old + key.size() + value.size();
  if (it == values_.end()) {
    values_.emplace(key, value);
  } else {
    it->second = value;
  }
  auto range = waiters_.equal_range(key);
  std::vector<Reply> wake;
  for (auto w = range.first; w != range.second; ++w) {
    wake.push_back(std::move(w->second.reply));
    Forget(w->second.owner);
  }
  waiters_.erase(range.first, range.second);
  for (Reply& r : wake) r(Status::OK(), value);
  return Status::OK();
}

Status KvStore::Get(const std::string& key, std::string* value) const {
  auto it = values_.find(key);
  if (it == values_.end()) return Status::NotFound("kv key '" + key + "' is not set");
  *value = it->second;
  return Status::OK();
}

Status KvStore::Wait(const std::string& key, int64_t deadline_us, Owner owner, Reply reply) {
  auto it = values_.find(key);
  if (it != values_.end()) {
    reply(Status::OK(), it->second);
    return Status::OK();
  }
  size_t& mine = waiters_of_[owner];
  if (mine >= limits_.max_waiters_per_owner || waiters_.size() >= limits_.max_waiters) {
    const bool own = mine >= limits_.max_waiters_per_owner;
    if (mine == 0) waiters_of_.erase(owner);
    return Status::FailedPrecondition(
        own ? "this connection already has " + std::to_string(limits_.max_waiters_per_owner) +
                  " kv waits pending, the limit (server flag --kv_max_waiters_per_connection)"
            : "the server already has " + std::to_string(limits_.max_waiters) +
                  " kv waits pending, the limit (server flag --kv_max_waiters)");
  }
  ++mine;
  waiters_.emplace(key, Waiter{owner, deadline_us, std::move(reply)});
  return Status::OK();
}

void KvStore::Forget(Owner owner) {
  auto it = waiters_of_.find(owner);
  if (it != waiters_of_.end() && --it->second == 0) waiters_of_.erase(it);
}

size_t KvStore::CancelOwner(Owner owner) {
  if (waiters_of_.count(owner) == 0) return 0;
  size_t n = 0;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.owner == owner) {
      it = waiters_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  waiters_of_.erase(owner);
  return n;
}

void KvStore::Expire(int64_t now_us) {
  std::vector<std::pair<std::string, Reply>> late;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.deadline_us <= now_us) {
      late.emplace_back(it->first, std::move(it->second.reply));
      Forget(it->second.owner);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [key, r] : late) {
    r(Status::Timeout("kv key '" + key + "' was not set before the wait's deadline"), "");
  }
}

size_t KvStore::CollectGarbage(int64_t current_generation, const std::string& job) {
  size_t erased = 0;
  for (auto it = job.empty() ? values_.begin() : values_.lower_bound(job + "/");
       it != values_.end();) {
    const std::string& k = it->first;
    const size_t slash = k.find('/');                          // after the job scope
    if (!job.empty() && k.compare(0, slash, job) != 0) break;  // past the job's keys (sorted)
    const int64_t g = slash == std::string::npos
                          ? -1
                          : proto::GenerationOfKey(std::string_view(k).substr(slash + 1));
    if (g >= 0 && g < current_generation - 2) {
      bytes_ -= k.size() + it->second.size();
      it = values_.erase(it);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

}  // namespace edl::jobserver
