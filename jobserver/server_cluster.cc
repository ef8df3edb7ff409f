// The server's cluster mode (`edl server --cluster`): nodes join the cluster, jobs are submitted
// with `edl ctl submit`, jobserver/cluster.h decides; this file turns its actions into frames and
// answers the cluster's ctl commands. README, "Many jobs on one cluster".
#include <glog/logging.h>

#include "edl/net/auth.h"
#include "edl/proto/frame.h"
#include "edl/proto/messages.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

using nlohmann::json;
using std::chrono::milliseconds;

Status Server::AttachClusterNode(const std::shared_ptr<Peer>& peer, const proto::Hello& hello,
                                 std::string* session) {
  if (hello.node.size() > proto::kMaxNodeNameBytes) return scheduler_.CheckAdmission(hello.node, "");
  auto known = cluster_sessions_.find(hello.node);
  if (known != cluster_sessions_.end() && !cluster_->HasNode(hello.node)) {
    cluster_sessions_.erase(known);  // the node was lost meanwhile: a first join again
    known = cluster_sessions_.end();
  }
  if (known != cluster_sessions_.end() &&
      (hello.node_token.empty() || !net::MacEqual(hello.node_token, known->second))) {
    return Status::Unavailable("node name '" + hello.node + "' belongs to another client of the cluster "
                               "and this one did not present that node's session token; retrying. Give "
                               "each client a unique --node_name");
  }
  if (hello.job_types.empty()) {
    return Status::InvalidArgument("node " + hello.node + " offers no job type to this cluster server: add "
                                   "`job_type = NAME = COMMAND...` to its client configuration");
  }
  const std::string token = known != cluster_sessions_.end() ? known->second : net::NewNonce();
  auto old = nodes_.find(hello.node);
  if (old != nodes_.end()) {
    std::shared_ptr<Peer> prev = old->second;
    nodes_.erase(old);
    cluster_->NodeDisconnected(hello.node);
    LOG(WARNING) << "node " << hello.node << " re-attached from " << peer->conn->peer()
                 << "; closing its old connection from " << prev->conn->peer();
    prev->conn->Close(Status::Aborted("replaced by a new connection of node " + hello.node));
  }
  ClusterNode n;
  n.name = hello.node;
  n.host = hello.host;
  n.restart_mode = hello.mode == "restart";
  n.slots = hello.slots;
  for (const proto::JobTypeDecl& t : hello.job_types) {
    n.types.push_back({t.name, std::set<std::string>(t.settable.begin(), t.settable.end())});
  }
  EDL_RETURN_IF_ERROR(cluster_->AddNode(n, hello.trainers, hello.trainer_generations));
  cluster_sessions_[hello.node] = token;
  peer->state = Peer::State::kClient;
  peer->node = hello.node;
  peer->conn->SetIdleTimeout(milliseconds(options_.scheduler.heartbeat_timeout_us / 1000));
  nodes_[hello.node] = peer;
  *session = token;
  Record({{"type", "node_joined"}, {"node", hello.node}, {"host", hello.host}, {"slots", hello.slots.size()},
          {"job_types", n.types.size()}});
  return Status::OK();
}

void Server::SendJobsTo(const std::shared_ptr<Peer>& peer) {
  for (const std::string& job : cluster_->JobsFor(peer->node)) {
    const Scheduler* s = cluster_->FindJob(job);
    if (s == nullptr || s->current().generation == 0) continue;
    TellJob(peer, job);
    json j;
    proto::GenerationUpdate::Full(s->current()).EncodeTo(&j);
    peer->conn->Send(j);
    peer->job_generation[job] = s->current().generation;
  }
}

void Server::TellJob(const std::shared_ptr<Peer>& peer, const std::string& job) {
  if (peer->job_generation.count(job)) return;
  const JobSpec* spec = cluster_->FindSpec(job);
  if (spec == nullptr) return;
  proto::JobInfo info;
  info.job_id = job;
  info.job_type = spec->job.type;
  info.flags = spec->flags;
  json j;
  info.EncodeTo(&j);
  peer->conn->Send(j);
  peer->job_generation[job] = 0;
}

Status Server::OpenClusterState() {
  state_ = std::make_unique<StateStore>();
  bool created = false;
  EDL_RETURN_IF_ERROR(state_->Open(options_.state_dir, &created));
  cluster_state_ = std::make_unique<ClusterStateWriter>(state_.get());
  ClusterState st;
  bool found = false;
  EDL_RETURN_IF_ERROR(cluster_state_->Load(&st, &found));
  if (!found) {
    LOG(INFO) << "no cluster state in --state_dir " << options_.state_dir << (created ? " (a new state directory)" : "")
              << ": starting with no jobs";
    Record({{"type", "new_cluster"}, {"state_dir", options_.state_dir}});
  } else {
    LOG(INFO) << "resuming the cluster from --state_dir " << options_.state_dir << ": " << st.jobs.size()
              << " live job(s), " << st.nodes.size() << " node(s), " << st.ended.size() << " ended job(s)";
    EDL_RETURN_IF_ERROR(cluster_->Restore(st));
    RestoreServices(st.services);
    for (const auto& [name, n] : st.nodes) cluster_sessions_[name] = n.node.session;
  }
  return Persist() ? Status::OK()
                   : Status::IOError("cannot write the cluster state to --state_dir " + options_.state_dir);
}

Status Server::SaveClusterState() {
  ClusterState st;
  cluster_->Snapshot(&st);
  placer_.Snapshot(&st.services);
  for (auto& [name, n] : st.nodes) {
    auto it = cluster_sessions_.find(name);
    if (it != cluster_sessions_.end()) n.node.session = it->second;
  }
  return cluster_state_->Save(st);
}

void Server::DispatchCluster() {
  std::vector<JobAction> actions = cluster_->TakeActions();
  // Kept (synced) before any of it reaches a client: a restarted server resumes from here.
  if (!actions.empty() && !Persist()) return;
  for (JobAction& ja : actions) {
    Action& a = ja.action;
    auto node = nodes_.find(a.node);
    switch (a.kind) {
      case Action::Kind::kPrepare:
        if (node == nodes_.end()) break;
        TellJob(node->second, ja.job);
        {
          json j;
          a.prepare.EncodeTo(&j);
          node->second->conn->Send(j);
        }
        break;
      case Action::Kind::kCommit: {
        PushJobGeneration(ja.job, a);
        kv_.CollectGarbage(a.next.generation, ja.job);
        auto& progress = job_progress_[ja.job];
        const Scheduler* s = cluster_->FindJob(ja.job);
        for (auto it = progress.begin(); it != progress.end();) {
          it = s != nullptr && s->IsLiveTrainer(it->first) ? std::next(it) : progress.erase(it);
        }
        status_dirty_ = true;
        break;
      }
      case Action::Kind::kKill:
        SendKill(a);
        break;
      case Action::Kind::kDone:
        LOG(INFO) << "job " << ja.job << " finished: every member exited 0";
        break;
      case Action::Kind::kEvent:
        if (ja.job.empty()) {
          const std::string type = a.event.value("type", "");
          if (type == "job_finished" || type == "job_cancelled") {
            const std::string name = a.event.value("job_name", "");
            job_events_.erase(name);  // closes its log
            job_progress_.erase(name);
            for (auto& [n, peer] : nodes_) peer->job_generation.erase(name);
          }
          Record(std::move(a.event));
        } else {
          RecordJob(ja.job, std::move(a.event));
        }
        break;
    }
  }
}

void Server::PushJobGeneration(const std::string& job, const Action& a) {
  std::set<std::string> targets;  // the nodes of the old and new members, and those told the job
  for (const proto::MemberInfo& m : a.prev.members) targets.insert(m.node);
  for (const proto::MemberInfo& m : a.next.members) targets.insert(m.node);
  for (auto& [name, peer] : nodes_) {
    if (peer->job_generation.count(job)) targets.insert(name);
  }
  for (const std::string& name : targets) {
    auto it = nodes_.find(name);
    if (it == nodes_.end()) continue;
    const std::shared_ptr<Peer>& peer = it->second;
    TellJob(peer, job);
    int64_t& held = peer->job_generation[job];
    if (held >= a.next.generation) continue;
    json j;
    if (held == a.prev.generation && held > 0) {
      proto::GenerationUpdate::Between(a.prev, a.next).EncodeTo(&j);
    } else {
      proto::GenerationUpdate::Full(a.next).EncodeTo(&j);
    }
    peer->conn->Send(j);
    held = a.next.generation;
  }
}

void Server::RecordJob(const std::string& job, json event) {
  auto it = job_events_.find(job);
  if (it == job_events_.end()) {
    auto log = std::make_unique<EventsLog>();
    Status s = log->Open(options_.events_dir, job, clock_, &metrics_);  // #30
    if (!s.ok()) {
      LOG(ERROR) << "events log of job " << job << ": " << s.ToString();
      return;
    }
    it = job_events_.emplace(job, std::move(log)).first;
  }
  json rec = it->second->Append(std::move(event));
  NotifyWatchers(json{{"event", rec}});
}

Status Server::OnClusterCtl(const std::shared_ptr<Peer>& peer, const proto::CtlRequest& r) {
  if (r.command == "jobs") return Status::OK();  // the reply's body lists them
  if (r.command == "submit") {
    JobSpec spec;
    EDL_RETURN_IF_ERROR(DecodeJobSpec(r.spec, &spec));
    if (spec.job.name == options_.scheduler.job_id) {
      return Status::InvalidArgument("job name " + spec.job.name + " is the server's own --job_id (its "
                                     "cluster-wide records use it); pick another name");
    }
    EDL_RETURN_IF_ERROR(cluster_->Submit(spec));
    LOG(INFO) << "ctl " << peer->conn->peer() << ": submitted job " << spec.job.name << " (type "
              << spec.job.type << ", " << spec.job.min_trainers << ".." << spec.job.max_trainers
              << " trainers, priority " << spec.job.priority << ")";
    RecordJob(spec.job.name, {{"type", "submitted"}, {"spec", EncodeJobSpec(spec)}});
    return Status::OK();
  }
  if (r.job.empty()) return Status::InvalidArgument("'" + r.command + "' on a cluster names a job: `edl ctl " + r.command + " NAME ...`");
  if (r.command == "cancel") {
    LOG(INFO) << "ctl " << peer->conn->peer() << ": cancel " << r.job;
    return cluster_->Cancel(r.job);
  }
  LOG(INFO) << "ctl " << peer->conn->peer() << ": scale " << r.job << " " << r.n;
  return cluster_->Scale(r.job, static_cast<int>(r.n));
}

json Server::ClusterStatusBody() const {
  const ClusterPolicy& policy = cluster_->policy();
  json s = cluster_->JobsJson();
  std::string running;
  double total_ips = 0;
  for (json& j : s["jobs"]) {
    const std::string name = j["name"].get<std::string>();
    const Scheduler* sched = cluster_->FindJob(name);
    auto p = job_progress_.find(name);
    const json progress = sched != nullptr && p != job_progress_.end() ? ProgressSummary(sched->current(), p->second)
                                                                       : json::object();
    const double ips = progress.value("images_per_sec", 0.0);
    j["images_per_sec"] = ips;
    j["step"] = progress.value("step", 0);
    j["epoch"] = progress.value("epoch", 0);
    j["loss"] = progress.value("loss", 0.0);
    total_ips += ips;
    running += (running.empty() ? "" : "|") + name + ":" + std::to_string(j.value("trainers", 0));
  }
  double busy = 0, gpu = 0;
  int cores = 0, gpus = 0;
  for (const auto& [node, st] : node_stats_) {
    busy += st.cpu_busy;
    cores += st.cpu_cores;
    if (st.gpu_util >= 0) {
      gpu += st.gpu_util;
      ++gpus;
    }
  }
  s["cpu_utils"] = cores > 0 ? json(100.0 * busy / cores) : json("n/a");
  s["gpu_utils"] = gpus > 0 ? json(gpu / gpus) : json("n/a");
  s["cluster"] = true;
  s["submitted_jobs"] = cluster_->submitted_jobs();
  s["pending_jobs"] = policy.pending_jobs();
  s["running_trainers"] = running;
  s["total_slots"] = policy.total_slots();
  s["used_slots"] = policy.used_slots();
  s["nodes"] = static_cast<int>(nodes_.size());
  s["images_per_sec"] = total_ips;
  s["port"] = port_;
  s["events_log"] = events_.path();
  return s;
}

void Server::RecordJobsProgress() {
  for (const auto& [job, reports] : job_progress_) {
    const Scheduler* s = cluster_->FindJob(job);
    auto log = job_events_.find(job);
    if (s == nullptr || log == job_events_.end()) continue;
    json rec = ProgressSummary(s->current(), reports);
    if (rec.value("reporting", 0) == 0) continue;
    rec["type"] = "progress";
    rec["generation"] = s->current().generation;
    rec["world_size"] = s->current().world_size();
    log->second->Append(std::move(rec));  // not to watchers: they get the status it comes from
  }
}

}  // namespace edl::jobserver
