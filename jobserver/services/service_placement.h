// ServicePlacer: where the server runs the teachers of each service (docs/DISTILLATION.md,
// "Teachers run by the clients"; PROTOCOL.md, "Services: teachers run by clients"). `edl ctl scale
// SERVICE N` sets a service's desired teacher count; the placer keeps that many teachers placed on
// the nodes whose client offers the service (its own --service NAME = COMMAND: the command never
// travels), at most `teacher_slots` teachers per node, spreading a service over the nodes that run
// fewest teachers. A teacher that ends (reported by its client) or whose node is lost is replaced;
// one that ended soon after its start holds further starts of that service on that node back with a
// doubling delay (a broken teacher command does not spin). Shrinking stops the newest teachers
// first.
//
// The placer only decides; the server sends the orders and tells it what happened, so it is
// tested without a network. Teacher names are `<node>-t<seq>`, seq growing over the server's life
// (and across restarts: the counter is kept).
//
// Durable part (jobserver/state/STATE.md, "Keys": `services`): the desired counts, the replacement
// counts, the name counter and the placed teachers. A restarted server (or a standby taking over)
// restores them: each restored teacher counts as placed while its node has not re-attached (for
// a grace period), so a node that reconnects first does not get extra teachers started in place
// of another node's; a node that re-attaches without reporting one of its restored teachers, or
// does not re-attach in time, loses it and it is replaced.
//
// Thread-safety: none; used from the server's io_context thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"

namespace edl::jobserver {

// What a server keeps of its services (ServicePlacer::Snapshot / Restore; STATE.md "Keys").
struct ServicesState {
  struct Teacher {
    std::string name, service, node;
  };
  std::map<std::string, int> desired;       // by service
  std::map<std::string, int64_t> restarts;  // replacements per service
  uint64_t next_seq = 1;                    // teacher names use seqs below this
  std::vector<Teacher> teachers;            // placed, not being stopped
  bool empty() const {
    return desired.empty() && restarts.empty() && teachers.empty() && next_seq == 1;
  }
};

// Most services and teachers a stored value may hold (a value above them is Corruption).
constexpr size_t kMaxStoredServices = 1024;
constexpr size_t kMaxStoredTeachers = 65536;

// The value's encoding (JSON with the state format version) and its hostile-bytes decoder:
// Corruption naming `key`, the field and the fix for anything out of range (a bad name, a count
// above proto::kMaxServiceMembers, a repeated teacher).
std::string EncodeServices(const ServicesState& s);
Status DecodeServices(const std::string& key, const std::string& value, ServicesState* out);

class ServicePlacer {
 public:
  struct Order {
    std::string node;
    bool start = true;  // false: stop
    std::string service, name;
  };

  // A client connected, offering `services` with `slots` teachers at once; `running` are the
  // [service, name] teachers it still runs (after a reconnect): they are adopted, as placed.
  void NodeUp(const std::string& node, const std::vector<std::string>& services, int slots,
              const std::vector<std::pair<std::string, std::string>>& running, int64_t now_us);
  // The node's client is gone: so are its teachers (the next Reconcile replaces them elsewhere).
  void NodeDown(const std::string& node);
  // Desired teacher count of `service`, 0..kMaxServiceMembers. NotFound (naming the nodes' offers)
  // when `require_offer` and no connected node offers it and it has no desired count yet (a
  // scaling script sets it regardless: a client offering it may connect later).
  Status SetDesired(const std::string& service, int n, bool require_offer = true);
  bool Knows(const std::string& service) const;
  // The node reported that its teacher `name` ended (`why`). Ignored unless placed there.
  void Exited(const std::string& node, const std::string& name, const std::string& why,
              int64_t now_us);
  // Cluster mode (`edl server --cluster`): the trainer slots no job holds, per node
  // (ClusterPolicy::FreeSlotsByNode). A teacher then takes one such slot: a node runs at most
  // min(its teacher slots, its free slots) teachers, so a desired count is an upper bound filled
  // from free capacity only. Teachers above a node's capacity (a job took the slots) are stopped,
  // newest first, and placed again where capacity is free. Never called: no such limit.
  void SetCapacity(const std::map<std::string, int>& free_slots);
  // Starts and stops that bring every service toward its desired count (placed teachers count as
  // soon as ordered; stopped ones no longer count).
  std::vector<Order> Reconcile(int64_t now_us);
  // {"<service>": {"desired": N, "placed": [{"name","node","since_s","stopping","awaiting_node"}],
  //  "restarts": R, "preempted": P (stopped to give a job their slot), "nodes": [node, ...]
  //  (offering it)}} for `edl ctl status`.
  nlohmann::json Summary(int64_t now_us) const;

  // ---- durable state
  void Snapshot(ServicesState* s) const;
  // Takes the state of an earlier server: its teachers are placed on their nodes, which are not
  // connected yet; each node has until now + grace_us to re-attach and report them (NodeUp).
  void Restore(const ServicesState& s, int64_t now_us, int64_t grace_us);
  // Whether the durable part changed since the last call (the server then writes it before it
  // sends any order).
  bool TakeChanged() {
    const bool c = changed_;
    changed_ = false;
    return c;
  }

 private:
  struct Placed {
    std::string service, node;
    int64_t started_us = 0;
    bool stopping = false;
    int64_t awaiting_until_us = 0;  // restored, its node not re-attached yet: dropped after this
  };
  void ExpireAwaiting(int64_t now_us);
  struct Node {
    std::set<std::string> services;
    int slots = 0;
    // service -> (consecutive quick failures, no start before this time)
    std::map<std::string, std::pair<int, int64_t>> hold;
  };
  int Used(const std::string& node) const;  // teachers placed on the node (stopping too)
  int Limit(const std::string& node, const Node& n) const;  // teachers the node may run now
  void Preempt(std::vector<Order>* orders);                 // stops teachers above capacity
  int Live(const std::string& service) const;               // placed and not stopping

  std::map<std::string, Node> nodes_;
  std::map<std::string, int> desired_;        // by service
  std::map<std::string, Placed> placed_;      // by teacher name
  std::map<std::string, int64_t> restarts_;   // replacements per service
  std::map<std::string, int64_t> preempted_;  // stopped for a job, per service (not kept)
  bool capped_ = false;                       // SetCapacity was called (cluster mode)
  std::map<std::string, int> capacity_;       // free trainer slots per node
  uint64_t next_seq_ = 1;
  // Reconcile runs on every server event: it works only after a change, or once a held-back
  // start may go ahead (a service short of teachers retries at least every second).
  bool dirty_ = false;
  int64_t retry_at_us_ = 0;
  bool changed_ = false;  // the durable part changed (TakeChanged)
};

}  // namespace edl::jobserver
