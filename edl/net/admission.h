// AdmissionControl: bounds the connections a server holds for peers that have not authenticated
// yet, in total and per source address, so idle or slow pre-auth peers cannot use up the file
// descriptors and memory that authenticated clients and `edl ctl` need. When a new connection
// would exceed a bound, the oldest pre-auth connection (from the same source when the per-source
// bound is hit) is evicted: an honest handshake takes one round trip, so a flood of idle
// connections pushes out its own members, not the peer that is about to authenticate.
//
// LogLimiter: at most `burst` log lines per `window`; the next allowed line says how many were
// suppressed, so a flood of rejected peers cannot fill the disk through the log.
//
// Thread-safety: none; used from one io_context thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

namespace edl::net {

class AdmissionControl {
 public:
  struct Limits {
    size_t max_total = 128;      // pre-auth connections in all
    size_t max_per_source = 32;  // pre-auth connections from one address
  };
  // Limits that leave most of the open-file limit (RLIMIT_NOFILE) to authenticated peers: a
  // quarter of it, at least 8, at most 128 in all; a quarter of that per source (at least 4).
  static Limits FromFileLimit();

  explicit AdmissionControl(Limits limits = FromFileLimit()) : limits_(limits) {}

  // Registers pre-auth connection `id` (non-zero, unique) from `source`. Returns the id of the
  // older pre-auth connection the caller must close to make room, or 0.
  uint64_t Admit(uint64_t id, const std::string& source);
  // `id` authenticated or closed: it no longer counts. No-op for unknown ids.
  void Remove(uint64_t id);

  size_t pending() const { return order_.size(); }
  size_t pending_from(const std::string& source) const;
  const Limits& limits() const { return limits_; }

 private:
  struct Entry {
    uint64_t id;
    std::string source;
  };
  Limits limits_;
  std::list<Entry> order_;  // oldest first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> by_id_;
  std::unordered_map<std::string, size_t> per_source_;
};

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogLimiter(size_t burst, Clock::duration window) : burst_(burst), window_(window) {}
  // True when a line may be logged now; *suppressed is the number of lines dropped since the
  // last allowed one.
  bool Allow(Clock::time_point now, size_t* suppressed);

 private:
  const size_t burst_;
  const Clock::duration window_;
  Clock::time_point window_start_{};
  size_t in_window_ = 0;
  size_t suppressed_ = 0;
};

// Whether to log the n-th of a per-peer series of refusals: the 1st..10th, then every power of
// two, so that a flood cannot flood the log.
inline bool LogThis(int64_t n) { return n <= 10 || (n & (n - 1)) == 0; }

}  // namespace edl::net
