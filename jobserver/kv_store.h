// KvStore: the server's rendezvous key-value store (set, get, wait-with-timeout). Keys arrive
// already scoped by job ("<job>/<key>"); a key whose own part has the rendezvous shape
// "gen/<N>/..." (edl/proto/rendezvous_key.h, the scheme the runtime writes) belongs to generation
// N and is dropped once the job is more than two generations past it.
//
// Every resource a peer can make it hold is bounded (KvLimits): bytes per value, keys and bytes in
// all, waiters per owner (one connection) and in all. A request over a bound is refused with
// FailedPrecondition naming the bound and the flag that raises it; nothing already stored is
// touched. A connection's waiters go with it (CancelOwner).
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
#include "edl/proto/messages.h"

namespace edl::jobserver {

struct KvLimits {
  size_t max_value_bytes = proto::kMaxValueBytes;  // one value
  size_t max_keys = 65536;                         // keys held at once
  size_t max_total_bytes = size_t{256} << 20;      // keys + values held at once
  size_t max_waiters_per_owner = 4096;             // pending waits of one connection
  size_t max_waiters = 65536;                      // pending waits in all
};

class KvStore {
 public:
  using Reply = std::function<void(const Status&, const std::string& value)>;
  using Owner = uint64_t;  // who waits (the server uses one id per connection)

  explicit KvStore(KvLimits limits = KvLimits()) : limits_(limits) {}

  // FailedPrecondition when the value, or the store with it, would exceed a limit.
  Status Set(const std::string& key, const std::string& value);
  // NotFound naming the key when absent.
  Status Get(const std::string& key, std::string* value) const;
  // Replies at once when the key exists, else when it is set, or with Timeout at `deadline_us`.
  // FailedPrecondition (and no reply) when `owner` or the store already has the most waiters.
  Status Wait(const std::string& key, int64_t deadline_us, Owner owner, Reply reply);
  // Drops `owner`'s waiters without replying (its connection closed). Returns how many.
  size_t CancelOwner(Owner owner);
  // Replies Timeout to every waiter whose deadline is at or before `now_us`.
  void Expire(int64_t now_us);
  // Erases keys "<job>/gen/<N>/..." with N < current_generation - 2, of job `job` only when it is
  // not empty (each job of a cluster numbers its own generations). Returns how many.
  size_t CollectGarbage(int64_t current_generation, const std::string& job = "");
  size_t size() const { return values_.size(); }
  size_t bytes() const { return bytes_; }
  size_t waiters() const { return waiters_.size(); }
  const KvLimits& limits() const { return limits_; }

 private:
  struct Waiter {
    Owner owner;
    int64_t deadline_us;
    Reply reply;
  };
  void Forget(Owner owner);  // one waiter of `owner` gone

  const KvLimits limits_;
  std::map<std::string, std::string> values_;
  size_t bytes_ = 0;                            // sum of key and value sizes in values_
  std::multimap<std::string, Waiter> waiters_;  // by key
  std::map<Owner, size_t> waiters_of_;          // owner -> its waiters in waiters_
};

}  // namespace edl::jobserver
