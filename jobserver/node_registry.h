// NodeRegistry: the cluster's nodes, the one home of node identity and liveness for every server
// (one job or many; docs/ARCHITECTURE.md "The job server"). A node is what one `edl client`
// registers: a name (proto::CheckNodeName, the same rule in every mode), the host its trainers
// bind, its slots, its mode (in place or restart), the job types its own configuration offers (a
// many-jobs server needs at least one), its session token, and when it was last heard from.
//
// Identity: a node name is not an identity, the session token is. The first registration of a
// name gets a fresh token (the server sends it in the welcome); a later registration under the
// same name must present it, and then replaces the node's connection (the old one may be half
// dead). A name stays taken while its node is known (connected, or disconnected and not yet lost).
//
// Liveness: one last-heard time per node and one timeout. TakeLost() hands out, and forgets (with
// their tokens), the nodes not heard from within it; the Cluster then fails their trainers.
//
// Like the Cluster that owns it, it is pure: no sockets, no threads, time from an injected Clock.
// Thread-safety: none; the server's io_context thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobserver/policy/job_spec.h"
#include "jobserver/state/cluster_state.h"

namespace edl::jobserver {

// What a client says about its node when it registers.
struct ClusterNode {
  std::string name, host;
  bool restart_mode = false;
  std::vector<int> slots;
  std::vector<JobTypeOffer> types;  // may be empty on a one-job server
};

class NodeRegistry {
 public:
  struct Node {
    ClusterNode info;
    std::string session;  // its token (proto::kSessionTokenBytes hex)
    bool connected = false;
    int64_t last_heard_us = 0;
    int order = 0;  // registration order: placement fills nodes in this order
    std::optional<proto::NodeStats> stats;  // the latest report while connected
  };

  // `heartbeat_timeout_us`: a node silent this long is lost. `clock` is not owned.
  NodeRegistry(int64_t heartbeat_timeout_us, Clock* clock);

  // Whether a client presenting `session` (empty at a first join) may register as node `name` now:
  // InvalidArgument for a name that breaks the node name rule; OK for a name nobody holds or for
  // the node's own token; Unavailable (retryable) while another client's token holds the name.
  Status CheckAdmission(const std::string& name, const std::string& session) const;
  // Registers `node` (after CheckAdmission and after the server dropped the node's old connection):
  // a first join issues a token, a re-attach keeps the token, the slots, the mode and the types the
  // node joined with (a differing offer is logged; it takes effect once the node is lost) and takes
  // the new host. InvalidArgument for no slots, too many, repeated or out-of-range ones, or (with
  // `require_types`) no job type; AlreadyExists while the name is connected. *known: a re-attach.
  Status Register(const ClusterNode& node, bool require_types, std::string* session, bool* known);
  void Disconnected(const std::string& name);
  void Heard(const std::string& name);
  void SetStats(const std::string& name, const proto::NodeStats& stats);
  // Forgets the nodes not heard from within the timeout and returns their names, by name.
  std::vector<std::string> TakeLost();
  std::string LostWhy() const;  // the reason TakeLost's nodes are lost, for events and logs

  const Node* Find(const std::string& name) const;
  bool Has(const std::string& name) const { return nodes_.count(name) > 0; }
  bool IsConnected(const std::string& name) const;
  std::string SessionOf(const std::string& name) const;  // empty when unknown
  const std::map<std::string, Node>& nodes() const { return nodes_; }
  // Names in registration order.
  std::vector<std::string> InOrder() const;
  int64_t heartbeat_timeout_us() const { return heartbeat_timeout_us_; }

  // ---- durable state (jobserver/state/STATE.md "Keys")
  void Snapshot(std::map<std::string, ClusterNodeState>* out) const;
  // Known but disconnected, each with one heartbeat timeout of grace on top of the usual one
  // (clients reconnect with backoff). Corruption naming the node when a stored one breaks a rule.
  Status Restore(const std::map<std::string, ClusterNodeState>& nodes);

 private:
  const int64_t heartbeat_timeout_us_;
  Clock* const clock_;  // not owned
  std::map<std::string, Node> nodes_;
  int next_order_ = 0;
};

}  // namespace edl::jobserver
