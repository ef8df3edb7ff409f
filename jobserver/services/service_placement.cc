#include "jobserver/services/service_placement.h"

#include <algorithm>
#include <limits>

#include <glog/logging.h>

#include "edl/proto/service_messages.h"

namespace edl::jobserver {

namespace {
using nlohmann::json;
constexpr int64_t kQuickExitUs = 10'000'000;  // a teacher that ends sooner failed to start
constexpr int64_t kHoldBaseUs = 500'000;
constexpr int64_t kHoldMaxUs = 30'000'000;
}  // namespace

void ServicePlacer::NodeUp(const std::string& node, const std::vector<std::string>& services,
                           int slots,
                           const std::vector<std::pair<std::string, std::string>>& running,
                           int64_t now_us) {
  NodeDown(node);
  dirty_ = true;
  const std::set<std::string> offered(services.begin(), services.end());
  std::set<std::string> reported;
  for (const auto& [service, name] : running) {
    if (!offered.count(service)) continue;  // not ours to adopt
    auto it = placed_.find(name);
    if (it == placed_.end()) {  // a teacher this server did not place (its state was lost): adopted
      placed_[name] = Placed{service, node, now_us, false, 0};
      changed_ = true;
      reported.insert(name);
      LOG(INFO) << "service " << service << ": adopted teacher " << name
                << " still running on node " << node;
    } else if (it->second.awaiting_until_us != 0 && it->second.node == node &&
               it->second.service == service) {
      it->second.awaiting_until_us = 0;  // placed by the previous server: kept as it runs
      it->second.started_us = now_us;
      reported.insert(name);
      LOG(INFO) << "service " << service << ": teacher " << name
                << " placed before the restart runs on node " << node << "; kept";
    }
  }
  // The restored teachers of this node it did not report are gone: replaced by the next Reconcile.
  for (auto it = placed_.begin(); it != placed_.end();) {
    if (it->second.node == node && it->second.awaiting_until_us != 0 &&
        !reported.count(it->first)) {
      LOG(WARNING) << "service " << it->second.service << ": teacher " << it->first
                   << " no longer runs on node " << node
                   << " (re-attached without it); replacing it";
      it = placed_.erase(it);
      changed_ = true;
    } else {
      ++it;
    }
  }
  if (services.empty()) return;
  Node& n = nodes_[node];
  n.services = offered;
  n.slots = slots;
}

void ServicePlacer::NodeDown(const std::string& node) {
  if (nodes_.erase(node) == 0) return;
  dirty_ = true;
  for (auto it = placed_.begin(); it != placed_.end();) {
    if (it->second.node == node) {
      LOG(WARNING) << "service " << it->second.service << ": teacher " << it->first
                   << " lost with node " << node;
      it = placed_.erase(it);
      changed_ = true;
    } else {
      ++it;
    }
  }
}

bool ServicePlacer::Knows(const std::string& service) const {
  if (desired_.count(service)) return true;
  for (const auto& [name, n] : nodes_) {
    if (n.services.count(service)) return true;
  }
  return false;
}

Status ServicePlacer::SetDesired(const std::string& service, int n, bool require_offer) {
  if (n < 0 || static_cast<size_t>(n) > proto::kMaxServiceMembers) {
    return Status::InvalidArgument("a service runs 0.." +
                                   std::to_string(proto::kMaxServiceMembers) + " teachers");
  }
  if (!Knows(service) && require_offer) {
    std::set<std::string> offered;
    for (const auto& [name, node] : nodes_)
      offered.insert(node.services.begin(), node.services.end());
    std::string list;
    for (const std::string& s : offered) list += (list.empty() ? "" : ", ") + s;
    return Status::NotFound("no connected client offers service '" + service +
                            "' (offered: " + (list.empty() ? "none" : list) +
                            "); start a client with --service " + service + " = 'edl teacher ...'");
  }
  if (desired_.count(service) == 0 && desired_.size() >= kMaxStoredServices) {
    return Status::InvalidArgument("at most " + std::to_string(kMaxStoredServices) +
                                   " services have a desired count");
  }
  if (desired_.count(service) == 0 || desired_[service] != n) changed_ = true;
  desired_[service] = n;
  dirty_ = true;
  LOG(INFO) << "service " << service << ": desired teachers " << n;
  return Status::OK();
}

void ServicePlacer::Exited(const std::string& node, const std::string& name, const std::string& why,
                           int64_t now_us) {
  auto it = placed_.find(name);
  if (it == placed_.end() || it->second.node != node) return;
  const Placed p = it->second;
  placed_.erase(it);
  dirty_ = true;
  changed_ = true;
  auto n = nodes_.find(node);
  if (p.stopping || n == nodes_.end()) {
    LOG(INFO) << "service " << p.service << ": teacher " << name << " on node " << node
              << " stopped (" << why << ")";
    return;
  }
  auto& [fails, until] = n->second.hold[p.service];
  fails = now_us - p.started_us < kQuickExitUs ? fails + 1 : 0;
  until = fails == 0 ? 0 : now_us + std::min(kHoldMaxUs, kHoldBaseUs << std::min(fails - 1, 10));
  ++restarts_[p.service];
  LOG(WARNING) << "service " << p.service << ": teacher " << name << " on node " << node
               << " ended (" << why << "); replacing it"
               << (fails == 0
                       ? ""
                       : " (quick failure " + std::to_string(fails) + ", holding that node back)");
}

int ServicePlacer::Used(const std::string& node) const {
  int used = 0;
  for (const auto& [name, p] : placed_) used += p.node == node;
  return used;
}

int ServicePlacer::Live(const std::string& service) const {
  int live = 0;
  for (const auto& [name, p] : placed_) live += p.service == service && !p.stopping;
  return live;
}

void ServicePlacer::SetCapacity(const std::map<std::string, int>& free_slots) {
  if (capped_ && capacity_ == free_slots) return;
  capped_ = true;
  capacity_ = free_slots;
  dirty_ = true;
}

int ServicePlacer::Limit(const std::string& node, const Node& n) const {
  if (!capped_) return n.slots;
  auto it = capacity_.find(node);
  return std::min(n.slots, it == capacity_.end() ? 0 : std::max(0, it->second));
}

void ServicePlacer::Preempt(std::vector<Order>* orders) {
  if (!capped_) return;
  for (const auto& [node, n] : nodes_) {
    const int limit = Limit(node, n);
    int live = 0;
    for (const auto& [name, p] : placed_) live += p.node == node && !p.stopping;
    while (live > limit) {  // the newest first
      std::string newest;
      int64_t newest_us = -1;
      for (const auto& [name, p] : placed_) {
        if (p.node == node && !p.stopping && p.started_us >= newest_us)
          newest = name, newest_us = p.started_us;
      }
      Placed& p = placed_[newest];
      p.stopping = true;
      orders->push_back({node, false, p.service, newest});
      ++preempted_[p.service];
      changed_ = true;
      --live;
      LOG(INFO) << "service " << p.service << ": teacher " << newest << " on node " << node
                << " gives its slot to a job (the node has " << limit
                << " slot(s) free for teachers)";
    }
  }
}

void ServicePlacer::ExpireAwaiting(int64_t now_us) {
  for (auto it = placed_.begin(); it != placed_.end();) {
    if (it->second.awaiting_until_us != 0 && it->second.awaiting_until_us <= now_us) {
      LOG(WARNING) << "service " << it->second.service << ": node " << it->second.node
                   << " did not re-attach "
                   << "after the server restart; teacher " << it->first << " is replaced";
      it = placed_.erase(it);
      changed_ = dirty_ = true;
    } else {
      ++it;
    }
  }
}

std::vector<ServicePlacer::Order> ServicePlacer::Reconcile(int64_t now_us) {
  std::vector<Order> orders;
  ExpireAwaiting(now_us);
  if (!dirty_ && (retry_at_us_ == 0 || now_us < retry_at_us_)) return orders;
  dirty_ = false;
  retry_at_us_ = 0;
  Preempt(&orders);
  for (const auto& [service, want] : desired_) {
    int live = Live(service);
    while (live < want) {
      // The node offering the service with the fewest teachers of it, then the fewest in all.
      const std::string* best = nullptr;
      std::pair<int, int> best_key{std::numeric_limits<int>::max(), 0};
      for (const auto& [name, n] : nodes_) {
        if (!n.services.count(service) || Used(name) >= Limit(name, n)) continue;
        auto h = n.hold.find(service);
        if (h != n.hold.end() && h->second.second > now_us) continue;
        int mine = 0;
        for (const auto& [t, p] : placed_)
          mine += p.node == name && p.service == service && !p.stopping;
        const std::pair<int, int> key{mine, Used(name)};
        if (best == nullptr || key < best_key) best = &name, best_key = key;
      }
      if (best ==
          nullptr) {  // no free slot offers it now: try again after the next change, or soon
        int64_t retry = now_us + 1'000'000;
        for (const auto& [name, n] : nodes_) {
          auto h = n.hold.find(service);
          if (h != n.hold.end() && h->second.second > now_us)
            retry = std::min(retry, h->second.second);
        }
        retry_at_us_ = retry_at_us_ == 0 ? retry : std::min(retry_at_us_, retry);
        break;
      }
      std::string name;
      do {  // adopted teachers of an earlier server may hold low numbers
        name = *best + "-t" + std::to_string(next_seq_++);
      } while (placed_.count(name));
      placed_[name] = Placed{service, *best, now_us, false, 0};
      orders.push_back({*best, true, service, name});
      changed_ = true;
      ++live;
    }
    // One still awaiting its node first (forgotten: no stop could reach it, and one that runs is
    // adopted and stopped when its node comes back), then the newest.
    while (live > want) {
      std::string newest;
      std::pair<bool, int64_t> newest_key{false, -1};
      for (const auto& [name, p] : placed_) {
        const std::pair<bool, int64_t> key{p.awaiting_until_us != 0, p.started_us};
        if (p.service == service && !p.stopping && key >= newest_key)
          newest = name, newest_key = key;
      }
      Placed& p = placed_[newest];
      changed_ = true;
      --live;
      if (p.awaiting_until_us != 0) {
        placed_.erase(newest);
        continue;
      }
      p.stopping = true;
      orders.push_back({p.node, false, service, newest});
    }
  }
  return orders;
}

json ServicePlacer::Summary(int64_t now_us) const {
  json out = json::object();
  std::set<std::string> services;
  for (const auto& [s, n] : desired_) services.insert(s);
  for (const auto& [name, n] : nodes_) services.insert(n.services.begin(), n.services.end());
  for (const std::string& s : services) {
    json placed = json::array(), nodes = json::array();
    for (const auto& [name, p] : placed_) {
      if (p.service != s) continue;
      placed.push_back({{"name", name},
                        {"node", p.node},
                        {"stopping", p.stopping},
                        {"awaiting_node", p.awaiting_until_us != 0},
                        {"since_s", static_cast<double>(now_us - p.started_us) / 1e6}});
    }
    for (const auto& [name, n] : nodes_) {
      if (n.services.count(s)) nodes.push_back(name);
    }
    auto d = desired_.find(s);
    auto r = restarts_.find(s);
    auto pe = preempted_.find(s);
    out[s] = {{"desired", d == desired_.end() ? json(nullptr) : json(d->second)},
              {"placed", placed},
              {"nodes", nodes},
              {"restarts", r == restarts_.end() ? 0 : r->second},
              {"preempted", pe == preempted_.end() ? 0 : pe->second}};
  }
  return out;
}

void ServicePlacer::Snapshot(ServicesState* s) const {
  s->desired = desired_;
  s->restarts = restarts_;
  s->next_seq = next_seq_;
  s->teachers.clear();
  for (const auto& [name, p] : placed_) {
    if (!p.stopping) s->teachers.push_back({name, p.service, p.node});
  }
}

void ServicePlacer::Restore(const ServicesState& s, int64_t now_us, int64_t grace_us) {
  desired_ = s.desired;
  restarts_ = s.restarts;
  next_seq_ = std::max(next_seq_, s.next_seq);
  for (const ServicesState::Teacher& t : s.teachers) {
    placed_[t.name] =
        Placed{t.service, t.node, now_us, false, now_us + std::max<int64_t>(1, grace_us)};
  }
  dirty_ = true;
  for (const auto& [service, n] : desired_) {
    LOG(INFO) << "service " << service << ": desired teachers " << n
              << " (kept by the previous server)";
  }
}

}  // namespace edl::jobserver
