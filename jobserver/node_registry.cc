#include "jobserver/node_registry.h"

#include <algorithm>
#include <set>

#include <glog/logging.h>

#include "edl/net/auth.h"

namespace edl::jobserver {

NodeRegistry::NodeRegistry(int64_t heartbeat_timeout_us, Clock* clock)
    : heartbeat_timeout_us_(heartbeat_timeout_us), clock_(clock) {}

Status NodeRegistry::CheckAdmission(const std::string& name, const std::string& session) const {
  EDL_RETURN_IF_ERROR(proto::CheckNodeName(name));
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return Status::OK();
  if (!session.empty() && net::MacEqual(session, it->second.session)) return Status::OK();
  return Status::Unavailable(
      "node name '" + name + "' belongs to another client (" +
      (it->second.connected ? "connected from " + it->second.info.host
                            : "disconnected; its name is held until it re-attaches or is lost") +
      ") and this one did not present that node's session token; retrying. If this is a second "
      "client, give it a unique --node_name; if it is the same node restarted, keep its "
      "--state_dir");
}

Status NodeRegistry::Register(const ClusterNode& node, bool require_types, std::string* session,
                              bool* known) {
  EDL_RETURN_IF_ERROR(proto::CheckNodeName(node.name));
  if (node.slots.empty()) {
    return Status::InvalidArgument("node " + node.name +
                                   " offers no slots: start its client with "
                                   "--gpus 0,1,.. or --slots N");
  }
  if (node.slots.size() > proto::kMaxSlotsPerNode) {
    return Status::InvalidArgument("node " + node.name + " offers " +
                                   std::to_string(node.slots.size()) + " slots; the limit is " +
                                   std::to_string(proto::kMaxSlotsPerNode));
  }
  std::set<int> distinct;
  for (int s : node.slots) {
    if (s < 0 || s > proto::kMaxSlot || !distinct.insert(s).second) {
      return Status::InvalidArgument("node " + node.name + " offers slot " + std::to_string(s) +
                                     " twice or out of 0.." + std::to_string(proto::kMaxSlot));
    }
  }
  if (require_types && node.types.empty()) {
    return Status::InvalidArgument("node " + node.name +
                                   " offers no job type to this cluster server: add "
                                   "`job_type = NAME = COMMAND...` to its client configuration");
  }
  const int64_t now = clock_->NowMicros();
  auto it = nodes_.find(node.name);
  *known = it != nodes_.end();
  if (*known && it->second.connected) {
    return Status::AlreadyExists("node name '" + node.name + "' is already connected (from " +
                                 it->second.info.host + "); give each client a unique --node_name");
  }
  // Two clients on one machine double-book its slots (two trainers on one GPU or core): a node
  // that advertises the host of another connected node and offers one of its slots is refused.
  // Loopback is the one-machine setup (every node on this machine, on purpose).
  if (!proto::IsLoopbackHost(node.host)) {
    for (const auto& [name, other] : nodes_) {
      if (name == node.name || !other.connected || other.info.host != node.host) continue;
      std::string shared;
      for (int s : node.slots) {
        if (std::find(other.info.slots.begin(), other.info.slots.end(), s) ==
            other.info.slots.end())
          continue;
        shared += (shared.empty() ? "" : ",") + std::to_string(s);
      }
      if (shared.empty()) continue;
      return Status::AlreadyExists(
          "node " + node.name + " offers slots " + shared + " of host " + node.host +
          ", which node " + name +
          " on the same host offers already: " + proto::kOneClientPerMachineFix);
    }
  }
  if (!*known) {
    Node n;
    n.info = node;
    n.session = net::NewNonce();
    n.order = next_order_++;
    it = nodes_.emplace(node.name, std::move(n)).first;
  } else {
    ClusterNode& was = it->second.info;
    if (was.slots != node.slots || was.restart_mode != node.restart_mode) {
      LOG(WARNING) << "node " << node.name << " re-attached offering " << node.slots.size()
                   << " slots (" << proto::NameOf(proto::NodeModeOf(node.restart_mode))
                   << " mode); it keeps the " << was.slots.size()
                   << " it joined with until it is lost (stop its client past the heartbeat "
                      "timeout to change them)";
    }
    was.host = node.host;
  }
  it->second.connected = true;
  it->second.last_heard_us = now;
  *session = it->second.session;
  return Status::OK();
}

void NodeRegistry::Disconnected(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  it->second.connected = false;
  it->second.stats.reset();
}

void NodeRegistry::Heard(const std::string& name) {
  auto it = nodes_.find(name);
  if (it != nodes_.end()) it->second.last_heard_us = clock_->NowMicros();
}

void NodeRegistry::SetStats(const std::string& name, const proto::NodeStats& stats) {
  auto it = nodes_.find(name);
  if (it != nodes_.end() && it->second.connected) it->second.stats = stats;
}

std::vector<std::string> NodeRegistry::TakeLost() {
  const int64_t now = clock_->NowMicros();
  std::vector<std::string> lost;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (now - it->second.last_heard_us > heartbeat_timeout_us_) {
      lost.push_back(it->first);
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
  return lost;
}

std::string NodeRegistry::LostWhy() const {
  return "no heartbeat for " + std::to_string(heartbeat_timeout_us_ / 1000) + " ms";
}

const NodeRegistry::Node* NodeRegistry::Find(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

bool NodeRegistry::IsConnected(const std::string& name) const {
  const Node* n = Find(name);
  return n != nullptr && n->connected;
}

std::string NodeRegistry::SessionOf(const std::string& name) const {
  const Node* n = Find(name);
  return n == nullptr ? std::string() : n->session;
}

std::vector<std::string> NodeRegistry::InOrder() const {
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [name, n] : nodes_) order.emplace_back(n.order, name);
  std::sort(order.begin(), order.end());
  std::vector<std::string> out;
  out.reserve(order.size());
  for (auto& [o, name] : order) out.push_back(std::move(name));
  return out;
}

void NodeRegistry::Snapshot(std::map<std::string, ClusterNodeState>* out) const {
  out->clear();
  for (const auto& [name, n] : nodes_) {
    ClusterNodeState& s = (*out)[name];
    s.node.name = name;
    s.node.host = n.info.host;
    s.node.restart_mode = n.info.restart_mode;
    s.node.slots = n.info.slots;
    s.node.order = n.order;
    s.node.session = n.session;
    s.types = n.info.types;
  }
}

Status NodeRegistry::Restore(const std::map<std::string, ClusterNodeState>& nodes) {
  const int64_t now = clock_->NowMicros();
  nodes_.clear();
  for (const auto& [name, s] : nodes) {
    if (Status st = proto::CheckNodeName(name); !st.ok()) {
      return Status::Corruption("saved node: " + st.message() +
                                ". Move the state aside or restore it from a backup");
    }
    Node n;
    n.info = {name, s.node.host, s.node.restart_mode, s.node.slots, s.types};
    n.session = s.node.session;
    n.connected = false;
    n.last_heard_us = now + heartbeat_timeout_us_;  // one timeout of grace on top of the usual one
    n.order = s.node.order;
    next_order_ = std::max(next_order_, n.order + 1);
    nodes_.emplace(name, std::move(n));
  }
  return Status::OK();
}

}  // namespace edl::jobserver
