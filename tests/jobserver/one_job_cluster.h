// A one-job Cluster (what `edl server` without --cluster decides with) driven the way the server
// drives it, through the calls the one-job tests make: a node registers as a client's hello makes
// it register, reports are routed by trainer id (the node from the id, as the client that sends
// them), and the job's state is read back. Tests only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "edl/proto/names.h"
#include "jobserver/cluster.h"

namespace edl::test {

using jobserver::Action;
using jobserver::Cluster;
using jobserver::ClusterNode;
using jobserver::ClusterOptions;
using jobserver::ClusterState;
using jobserver::JobAction;
using jobserver::JobMembership;
using jobserver::MembershipOptions;

class OneJobCluster {
 public:
  // The job is `o.job_id`; a node silent `heartbeat_timeout_us` is lost.
  OneJobCluster(const MembershipOptions& o, Clock* clock,
                int64_t heartbeat_timeout_us = 5'000'000) {
    ClusterOptions co;
    co.heartbeat_timeout_us = heartbeat_timeout_us;
    co.one_job = o;
    cluster_ = std::make_unique<Cluster>(co, clock);
  }

  Cluster& cluster() { return *cluster_; }
  const JobMembership& job() const { return *cluster_->FindJob(cluster_->own_job()); }

  // ---- nodes, as the server registers them (AddNode without CheckAdmission: the tests check it
  // on their own)
  Status CheckAdmission(const std::string& name, const std::string& token) const {
    return cluster_->CheckAdmission(name, token);
  }
  Status AddNode(const std::string& name, const std::string& host, bool restart_mode,
                 const std::vector<int>& slots, const std::vector<std::string>& running = {},
                 const std::vector<int64_t>& generations = {}) {
    ClusterNode n;
    n.name = name;
    n.host = host;
    n.restart_mode = restart_mode;
    n.slots = slots;
    std::string session;
    bool known = false;
    return cluster_->AddNode(n, running, generations, &session, &known);
  }
  void NodeDisconnected(const std::string& name) { cluster_->NodeDisconnected(name); }
  void Heartbeat(const std::string& name) { cluster_->Heartbeat(name); }
  std::string SessionOf(const std::string& name) const {
    return cluster_->registry().SessionOf(name);
  }
  bool IsNodeConnected(const std::string& name) const {
    return cluster_->registry().IsConnected(name);
  }
  std::vector<std::string> NodeNames() const { return cluster_->registry().InOrder(); }
  int connected_nodes() const {
    int n = 0;
    for (const auto& [name, node] : cluster_->registry().nodes()) n += node.connected ? 1 : 0;
    return n;
  }

  // ---- reports, from the node the trainer id names
  void TrainerExited(const std::string& id, bool success, const std::string& how) {
    cluster_->TrainerExited(id, NodeOf(id), success, how);
  }
  void TrainerReady(const std::string& id, int64_t generation) {
    cluster_->TrainerReady(id, NodeOf(id), generation);
  }
  // A progress report of trainer `id` at `step`, as its client relays it.
  void Progress(const std::string& id, int64_t step) {
    proto::ProgressReport r;
    r.step = step;
    cluster_->Progress(cluster_->own_job(), id, r);
  }
  // Trainer `id` could not re-form `generation` (its trainer event).
  void ReformFailed(const std::string& id, int64_t generation) {
    Event(id, {{"event", "reform_failed"}, {"generation", generation}, {"error", "test"}});
  }
  // Trainer `id` could not complete a collective of `generation` (its trainer event).
  void CommFailed(const std::string& id, int64_t generation) {
    Event(id, {{"event", "comm_failed"}, {"generation", generation}});
  }
  // A joiner's first step (its trainer event).
  void JoinerFirstStep(const std::string& id) {
    Event(id, {{"event", "joiner_first_step"}, {"generation", current().generation}});
  }
  // Trainer `id`'s event `e`, decoded as the server's edge decodes it.
  void Event(const std::string& id, const nlohmann::json& e) {
    cluster_->TrainerEvent(cluster_->own_job(), id, NodeOf(id), proto::DecodeTrainerEvent(e));
  }
  bool PlacedOn(const std::string& id, const std::string& node) const {
    std::string job;
    return cluster_->Authorized(id, node, &job);
  }
  bool IsLiveTrainerOf(const std::string& id, const std::string& node) const {
    return cluster_->JobOfTrainer(id, node) == cluster_->own_job();
  }

  // ---- the job's scaling sources and ctl
  void SetDesired(int n, const std::string& reason) { cluster_->SetDesired(n, reason); }
  void AddDesired(int delta, const std::string& reason) { cluster_->AddDesired(delta, reason); }
  void KillTrainers(int k) { cluster_->KillTrainers(k); }
  void KillAllTrainers() { cluster_->KillAllTrainers(); }
  bool Stop(const std::string& by, std::vector<proto::MemberInfo>* leaving) {
    return cluster_->StopOwnJob(by, leaving);
  }
  void RaiseGenerationFloor(int64_t g) { cluster_->RaiseGenerationFloor(g); }
  void Tick() { cluster_->Tick(); }

  // Every action since the last call (the job's and the cluster's), in order.
  std::vector<Action> TakeActions() {
    std::vector<Action> out;
    for (JobAction& a : cluster_->TakeActions()) out.push_back(std::move(a.action));
    return out;
  }

  // ---- the job's state
  const proto::GenerationInfo& current() const { return job().current(); }
  bool has_pending() const { return job().has_pending(); }
  bool done() const { return job().done(); }
  bool recovering() const { return job().recovering(); }
  int64_t max_generation() const { return job().max_generation(); }
  int used_slots() const { return job().used_slots(); }
  nlohmann::json Summary() const { return job().Summary(); }

  void Snapshot(ClusterState* s) const { cluster_->Snapshot(s); }
  Status Restore(const ClusterState& s) { return cluster_->Restore(s); }

 private:
  static std::string NodeOf(const std::string& id) {
    proto::TrainerId t;
    return proto::TrainerId::Parse(id, &t) ? t.node : std::string();
  }

  std::unique_ptr<Cluster> cluster_;
};

}  // namespace edl::test
