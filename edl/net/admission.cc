#include "edl/net/admission.h"

#include <sys/resource.h>

#include <algorithm>

namespace edl::net {

AdmissionControl::Limits AdmissionControl::FromFileLimit() {
  Limits l;
  rlimit r{};
  size_t files = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) files = r.rlim_cur;
  l.max_total = std::clamp<size_t>(files / 4, 8, 128);
  l.max_per_source = std::max<size_t>(4, l.max_total / 4);
  return l;
}

uint64_t AdmissionControl::Admit(uint64_t id, const std::string& source) {
  uint64_t evict = 0;
  auto src = per_source_.find(source);
  if (src != per_source_.end() && src->second >= limits_.max_per_source) {
    for (const Entry& e : order_) {
      if (e.source == source) {
        evict = e.id;
        break;
      }
    }
  } else if (order_.size() >= limits_.max_total && !order_.empty()) {
    evict = order_.front().id;
  }
  if (evict != 0) Remove(evict);
  order_.push_back(Entry{id, source});
  by_id_[id] = std::prev(order_.end());
  ++per_source_[source];
  return evict;
}

void AdmissionControl::Remove(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  auto src = per_source_.find(it->second->source);
  if (src != per_source_.end() && --src->second == 0) per_source_.erase(src);
  order_.erase(it->second);
  by_id_.erase(it);
}

size_t AdmissionControl::pending_from(const std::string& source) const {
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second;
}

bool LogLimiter::Allow(Clock::time_point now, size_t* suppressed) {
  if (now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace edl::net
