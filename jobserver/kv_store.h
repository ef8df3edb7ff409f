// KvStore: the server's rendezvous key-value store (set, get, wait-with-timeout). Keys arrive
// already scoped by job ("<job>/<key>"); a key whose own part starts with "g<N>/" belongs to
// generation N and is dropped once the job is more than two generations past it.
//
// Thread-safety: none; used from the server's io_context thread. Waiters are callbacks run on
// that thread, either from Set (value arrived) or from Expire (deadline passed).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::jobserver {

class KvStore {
 public:
  using Reply = std::function<void(const Status&, const std::string& value)>;

  void Set(const std::string& key, const std::string& value);
  // NotFound naming the key when absent.
  Status Get(const std::string& key, std::string* value) const;
  // Replies at once when the key exists, else when it is set, or with Timeout at `deadline_us`.
  void Wait(const std::string& key, int64_t deadline_us, Reply reply);
  // Replies Timeout to every waiter whose deadline is at or before `now_us`.
  void Expire(int64_t now_us);
  // Erases keys "<job>/g<N>/..." with N < current_generation - 2. Returns how many.
  size_t CollectGarbage(int64_t current_generation);
  size_t size() const { return values_.size(); }
  size_t waiters() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::string key;
    int64_t deadline_us;
    Reply reply;
  };
  std::map<std::string, std::string> values_;
  std::multimap<std::string, Waiter> waiters_;  // by key
};

}  // namespace edl::jobserver
