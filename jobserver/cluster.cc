#include "jobserver/cluster.h"

#include <algorithm>

#include <glog/logging.h>

namespace edl::jobserver {

using nlohmann::json;

Cluster::Cluster(ClusterOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock), policy_(options_.policy, clock) {}

// ---- nodes

Status Cluster::AddNode(const ClusterNode& node, const std::vector<std::string>& running,
                       const std::vector<int64_t>& generations) {
  const int64_t now = clock_->NowMicros();
  auto it = nodes_.find(node.name);
  std::vector<std::string> stale;
  if (it == nodes_.end()) {
    PolicyNode pn;
    pn.name = node.name;
    pn.slots = static_cast<int>(node.slots.size());
    for (const JobTypeOffer& t : node.types) pn.job_types.insert(t.name);
    EDL_RETURN_IF_ERROR(policy_.AddNode(pn));
    Node n;
    n.info = node;
    n.last_heard_us = now;
    n.order = next_node_order_++;
    nodes_.emplace(node.name, std::move(n));
    stale = running;  // a node new to the cluster runs nothing of its jobs
  } else {
    // A re-attach: the node keeps its slots and the types it offered when it joined.
    Node& n = it->second;
    n.connected = true;
    n.last_heard_us = now;
    std::map<std::string, std::vector<std::string>> by_job;
    std::map<std::string, std::vector<int64_t>> gens_by_job;
    const bool gens = generations.size() == running.size();
    for (size_t i = 0; i < running.size(); ++i) {
      const std::string job = JobOfTrainer(running[i], node.name);
      if (job.empty()) {
        stale.push_back(running[i]);
      } else {
        by_job[job].push_back(running[i]);
        if (gens) gens_by_job[job].push_back(generations[i]);
      }
    }
    for (auto& [name, job] : jobs_) {
      auto slots = job.slots.find(node.name);
      if (slots == job.slots.end() || slots->second.empty()) continue;
      Status s = job.scheduler->AddNode(node.name, n.info.host, n.info.restart_mode, slots->second,
                                        by_job[name], "", gens_by_job[name]);
      if (!s.ok()) LOG(WARNING) << "job " << name << ": re-attaching node " << node.name << ": " << s.ToString();
    }
  }
  if (!stale.empty()) {
    Action a;
    a.kind = Action::Kind::kKill;
    a.node = node.name;
    a.trainer_ids = stale;
    actions_.push_back({"", a});
    Record({{"type", "stale_trainers"}, {"node", node.name}, {"trainer_ids", stale}});
  }
  AfterPolicy();
  return Status::OK();
}

void Cluster::NodeDisconnected(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  it->second.connected = false;
  for (auto& [job_name, job] : jobs_) job.scheduler->NodeDisconnected(name);
}

void Cluster::Heartbeat(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  it->second.last_heard_us = clock_->NowMicros();
  for (auto& [job_name, job] : jobs_) job.scheduler->Heartbeat(name);
}

// ---- jobs

Status Cluster::Submit(const JobSpec& spec) {
  EDL_RETURN_IF_ERROR(CheckJobSpec(spec, Offers(), options_.policy.known_types, options_.checkpoint_root));
  if (jobs_.count(spec.job.name)) {
    return Status::AlreadyExists("job " + spec.job.name + " is already submitted; pick another name "
                                 "or `edl ctl cancel " + spec.job.name + "` first");
  }
  JobSubmission sub = spec.job;
  sub.deadline_us = spec.deadline_s > 0 ? clock_->NowMicros() + spec.deadline_s * 1'000'000 : 0;
  Job job;
  job.spec = spec;
  // MASTER_PORT (restart-mode programs) is base + generation % 1000: jobs numbering the same
  // generations on one host get disjoint ranges.
  job.port_index = submitted_ % kJobPortRanges;
  job.scheduler = NewScheduler(spec.job.name, job.port_index);
  // A name used before numbers its generations above the ended job's, so a checkpoint store the
  // two share keeps accepting saves (edl/ckpt/FORMAT.md).
  for (const json& e : finished_) {
    if (e.value("name", "") == spec.job.name) job.scheduler->RaiseGenerationFloor(e.value("generation", int64_t{0}));
  }
  jobs_.emplace(spec.job.name, std::move(job));
  Status s = policy_.Submit(sub);
  if (!s.ok()) {
    jobs_.erase(spec.job.name);
    return s;
  }
  ++submitted_;
  AfterPolicy();
  return Status::OK();
}

std::unique_ptr<Scheduler> Cluster::NewScheduler(const std::string& name, int port_index) {
  SchedulerOptions so = options_.job_defaults;
  so.job_id = name;
  so.min_trainers = 1;  // the policy holds the job's bounds; the scheduler follows its grants
  so.max_trainers = 0;
  so.initial_trainers = 0;
  so.shared_trainer_seq = &trainer_seq_;
  so.master_port_base = options_.job_defaults.master_port_base + 1000 * port_index;
  return std::make_unique<Scheduler>(so, clock_);
}

Status Cluster::Cancel(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return Status::NotFound("no live job named " + name + "; see `edl ctl jobs`");
  EDL_RETURN_IF_ERROR(policy_.Cancel(name));
  // One stop decision, the same as `edl ctl stop` of a single job (Scheduler::Stop): the job's stop
  // generation (no members, reason "stop", not a failure); in-place trainers leave it at an agreed
  // step, rank 0 saving a final checkpoint first, and exit 0; restart-mode ones are stopped by their
  // clients (TERM). A job with no members (pending) has nothing to stop.
  std::vector<proto::MemberInfo> leaving;
  it->second.scheduler->Stop("cancel", &leaving);
  Collect(name, &it->second);
  Forget(name, "cancelled");
  AfterPolicy();
  return Status::OK();
}

Status Cluster::Scale(const std::string& name, int n) {
  if (!jobs_.count(name)) return Status::NotFound("no live job named " + name + "; see `edl ctl jobs`");
  EDL_RETURN_IF_ERROR(policy_.Scale(name, n));
  AfterPolicy();
  return Status::OK();
}

// ---- reports

std::string Cluster::JobOfTrainer(const std::string& trainer_id, const std::string& node) const {
  for (const auto& [name, job] : jobs_) {
    if (job.scheduler->IsLiveTrainerOf(trainer_id, node)) return name;
  }
  return "";
}

void Cluster::TrainerExited(const std::string& trainer_id, const std::string& node, bool success,
                            const std::string& how) {
  const std::string name = JobOfTrainer(trainer_id, node);
  if (name.empty()) return;  // a leaving trainer, or one of an ended job: expected
  jobs_.at(name).scheduler->TrainerExited(trainer_id, success, how);
  AfterPolicy();
}

void Cluster::TrainerReady(const std::string& trainer_id, const std::string& node, int64_t generation) {
  const std::string name = JobOfTrainer(trainer_id, node);
  if (name.empty()) return;
  jobs_.at(name).scheduler->TrainerReady(trainer_id, generation);
  AfterPolicy();
}

void Cluster::Tick() {
  const int64_t now = clock_->NowMicros();
  std::vector<std::string> lost;
  for (const auto& [name, n] : nodes_) {
    if (now - n.last_heard_us > options_.job_defaults.heartbeat_timeout_us) lost.push_back(name);
  }
  for (const std::string& name : lost) {
    const std::string why =
        "no heartbeat for " + std::to_string(options_.job_defaults.heartbeat_timeout_us / 1000) + " ms";
    // Each job first loses the node's trainers as failures; the policy then repairs the jobs.
    for (auto& [job_name, job] : jobs_) {
      job.scheduler->NodeLost(name, why);
      job.slots.erase(name);
    }
    nodes_.erase(name);
    Status s = policy_.NodeLost(name);
    if (!s.ok()) LOG(WARNING) << "cluster: node " << name << ": " << s.ToString();
  }
  policy_.Tick();
  for (auto& [name, job] : jobs_) job.scheduler->Tick();
  AfterPolicy();
}

std::vector<JobAction> Cluster::TakeActions() {
  std::vector<JobAction> out;
  out.swap(actions_);
  return out;
}

// ---- decisions

void Cluster::AfterPolicy() {
  for (int round = 0; round < 100; ++round) {  // a finish re-plans; bounded by the jobs anyway
    for (const PolicyEvent& e : policy_.TakeEvents()) {
      json rec = e.ToJson();
      rec["type"] = "policy";
      Record(std::move(rec));
      if (!e.job.empty()) reasons_[e.job] = e.kind;
    }
    std::vector<std::string> done;
    for (bool grow : {false, true}) {  // every job gives up slots before any takes them
      for (auto& [name, job] : jobs_) {
        auto r = reasons_.find(name);
        ApplyPlacement(name, &job, r == reasons_.end() ? "policy" : r->second, grow);
      }
    }
    for (auto& [name, job] : jobs_) {
      Collect(name, &job);
      if (job.scheduler->done()) done.push_back(name);
    }
    reasons_.clear();
    if (done.empty()) return;
    for (const std::string& name : done) {
      Forget(name, "finished");
      Status s = policy_.Finish(name);
      if (!s.ok()) LOG(WARNING) << "cluster: finishing job " << name << ": " << s.ToString();
    }
  }
}

void Cluster::ApplyPlacement(const std::string& name, Job* job, const std::string& reason, bool grow) {
  const PolicyJob* pj = policy_.Find(name);
  const Placement empty;
  const Placement& want = pj != nullptr ? pj->placement : empty;
  // Rank of the job's member on each (node, slot); slots without one are given up first.
  std::map<std::pair<std::string, int>, int> rank;
  for (const proto::MemberInfo& m : job->scheduler->current().members) rank[{m.node, m.slot}] = m.rank;
  std::set<std::string> names;
  for (const auto& [node, slots] : job->slots) names.insert(node);
  for (const auto& [node, k] : want) names.insert(node);
  bool changed = false;
  for (const std::string& node_name : names) {
    auto n = nodes_.find(node_name);
    if (n == nodes_.end()) continue;  // lost: the scheduler dropped it already
    auto w = want.find(node_name);
    const size_t k = w == want.end() ? 0 : static_cast<size_t>(w->second);
    std::vector<int>& mine = job->slots[node_name];
    if (!grow && mine.size() > k) {
      // Kept: the slots of the lowest ranks; given up: the highest ranks', then slots without a member.
      std::sort(mine.begin(), mine.end(), [&](int a, int b) {
        auto ra = rank.find({node_name, a}), rb = rank.find({node_name, b});
        const bool ha = ra != rank.end(), hb = rb != rank.end();
        if (ha != hb) return ha;
        return ha ? ra->second < rb->second : a < b;
      });
      for (size_t i = k; i < mine.size(); ++i) n->second.owner.erase(mine[i]);
      mine.resize(k);
      changed = true;
    }
    for (int s : n->second.info.slots) {
      if (!grow || mine.size() >= k) break;
      if (n->second.owner.count(s)) continue;
      n->second.owner[s] = name;
      mine.push_back(s);
      changed = true;
    }
    std::sort(mine.begin(), mine.end());
    if (mine.empty()) job->slots.erase(node_name);
  }
  if (!changed) return;
  std::vector<SlotGrant> grants;
  for (const auto& [node_name, slots] : job->slots) {
    const Node& n = nodes_.at(node_name);
    grants.push_back({node_name, n.info.host, n.info.restart_mode, slots});
  }
  job->scheduler->SetAllocation(grants, reason);
}

void Cluster::Forget(const std::string& name, const std::string& state) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  for (const auto& [node_name, slots] : it->second.slots) {
    auto n = nodes_.find(node_name);
    if (n == nodes_.end()) continue;
    for (int s : slots) n->second.owner.erase(s);
  }
  finished_.push_back({{"name", name}, {"type", it->second.spec.job.type}, {"state", state},
                       {"generation", it->second.scheduler->current().generation}});
  while (finished_.size() > options_.max_finished_kept) finished_.pop_front();
  Record({{"type", "job_" + state}, {"job_name", name}});
  jobs_.erase(it);
}

void Cluster::Collect(const std::string& name, Job* job) {
  for (Action& a : job->scheduler->TakeActions()) actions_.push_back({name, std::move(a)});
}

void Cluster::Record(json event) {
  Action a;
  a.kind = Action::Kind::kEvent;
  a.event = std::move(event);
  actions_.push_back({"", std::move(a)});
}

// ---- state

const Scheduler* Cluster::FindJob(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.scheduler.get();
}

const JobSpec* Cluster::FindSpec(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second.spec;
}

std::vector<std::string> Cluster::JobNames() const {
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [name, job] : jobs_) {
    const PolicyJob* pj = policy_.Find(name);
    order.emplace_back(pj != nullptr ? pj->seq : 0, name);
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> out;
  for (auto& [seq, name] : order) out.push_back(name);
  return out;
}

std::map<std::string, JobTypeOffer> Cluster::Offers() const {
  std::map<std::string, JobTypeOffer> out;
  for (const auto& [name, n] : nodes_) {
    for (const JobTypeOffer& t : n.info.types) {
      auto [it, fresh] = out.emplace(t.name, t);
      if (fresh) continue;
      std::set<std::string> both;  // settable only where every node offering the type says so
      for (const std::string& f : t.settable) {
        if (it->second.settable.count(f)) both.insert(f);
      }
      it->second.settable = std::move(both);
    }
  }
  return out;
}

std::vector<std::string> Cluster::JobsFor(const std::string& node) const {
  std::vector<std::string> out;
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return out;
  for (const auto& [name, job] : jobs_) {
    for (const JobTypeOffer& t : n->second.info.types) {
      if (t.name == job.spec.job.type) out.push_back(name);
    }
  }
  return out;
}

json Cluster::JobsJson() const {
  json live = json::array();
  for (const std::string& name : JobNames()) {
    const Job& job = jobs_.at(name);
    const PolicyJob* pj = policy_.Find(name);
    const JobSubmission& s = job.spec.job;
    json j = {{"name", name},
              {"type", s.type},
              {"min", s.min_trainers},
              {"max", s.max_trainers},
              {"priority", s.priority},
              {"mode", s.elastic ? "elastic" : "restart"},
              {"state", pj != nullptr && pj->state == JobPhase::kRunning ? "running" : "pending"},
              {"trainers", job.scheduler->current().world_size()},
              {"target", pj != nullptr ? pj->size : 0},
              {"generation", job.scheduler->current().generation},
              {"flags", job.spec.flags}};
    if (pj != nullptr && !pj->pending_reason.empty()) j["pending_reason"] = pj->pending_reason;
    live.push_back(std::move(j));
  }
  return {{"jobs", live}, {"ended", json(std::vector<json>(finished_.begin(), finished_.end()))}};
}

// ---- durable state

void Cluster::Snapshot(ClusterState* s) const {
  const int64_t now = clock_->NowMicros();
  s->trainer_seq = trainer_seq_;
  s->submitted = submitted_;
  s->nodes.clear();
  for (const auto& [name, n] : nodes_) {
    ClusterNodeState& ns = s->nodes[name];
    ns.node.name = name;
    ns.node.host = n.info.host;
    ns.node.restart_mode = n.info.restart_mode;
    ns.node.slots = n.info.slots;
    ns.node.order = n.order;
    ns.types = n.info.types;
  }
  s->jobs.clear();
  for (const auto& [name, job] : jobs_) {
    ClusterJobState& js = s->jobs[name];
    js.spec = job.spec;
    js.port_index = job.port_index;
    js.slots = job.slots;
    if (const PolicyJob* pj = policy_.Find(name)) {
      js.seq = pj->seq;
      js.cap = pj->cap;
      js.running = pj->state == JobPhase::kRunning;
      js.deadline_left_us =
        pj->spec.deadline_us > 0 ? std::clamp<int64_t>(pj->spec.deadline_us - now, 1, kMaxDeadlineLeftUs) : 0;
      js.deadline_reported = pj->deadline_reported;
    }
    job.scheduler->Snapshot(&js.sched);
    js.sched.nodes.clear();  // they follow from js.slots and the cluster's nodes
  }
  s->ended.clear();
  for (const json& e : finished_) {
    s->ended.push_back({e.value("name", ""), e.value("type", ""), e.value("state", ""),
                        e.value("generation", int64_t{0})});
  }
}

Status Cluster::Restore(const ClusterState& s) {
  const int64_t now = clock_->NowMicros();
  auto corrupt = [](const std::string& why) {
    return Status::Corruption("saved cluster state: " + why + ". Move --state_dir aside (the server then starts "
                              "with no jobs) or restore it from a backup");
  };
  trainer_seq_ = s.trainer_seq;
  submitted_ = s.submitted;
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [name, ns] : s.nodes) order.emplace_back(ns.node.order, name);
  std::sort(order.begin(), order.end());
  std::vector<PolicyNode> policy_nodes;
  for (const auto& [ord, name] : order) {
    const ClusterNodeState& ns = s.nodes.at(name);
    Node n;
    n.info = {name, ns.node.host, ns.node.restart_mode, ns.node.slots, ns.types};
    n.connected = false;
    // Clients reconnect with backoff: one heartbeat timeout of grace on top of the usual one.
    n.last_heard_us = now + options_.job_defaults.heartbeat_timeout_us;
    n.order = ord;
    next_node_order_ = std::max(next_node_order_, ord + 1);
    PolicyNode pn{name, static_cast<int>(ns.node.slots.size()), {}};
    for (const JobTypeOffer& t : ns.types) pn.job_types.insert(t.name);
    policy_nodes.push_back(std::move(pn));
    nodes_.emplace(name, std::move(n));
  }
  std::vector<PolicyJob> policy_jobs;
  for (const auto& [name, js] : s.jobs) {
    Job job;
    job.spec = js.spec;
    job.port_index = js.port_index;
    job.slots = js.slots;
    PolicyJob pj;
    pj.spec = js.spec.job;
    pj.spec.deadline_us = js.deadline_left_us > 0 ? now + js.deadline_left_us : 0;
    pj.deadline_reported = js.deadline_reported;
    pj.state = js.running ? JobPhase::kRunning : JobPhase::kPending;
    pj.cap = js.cap;
    pj.seq = js.seq;
    JobState st = js.sched;
    for (const auto& [node_name, slots] : js.slots) {
      auto n = nodes_.find(node_name);
      if (n == nodes_.end()) return corrupt("job " + name + " holds slots on unknown node " + node_name);
      for (int slot : slots) {
        const std::vector<int>& offered = n->second.info.slots;
        if (std::find(offered.begin(), offered.end(), slot) == offered.end() || n->second.owner.count(slot)) {
          return corrupt("job " + name + " holds slot " + std::to_string(slot) + " of node " + node_name +
                         ", which the node does not offer or another job holds");
        }
        n->second.owner[slot] = name;
      }
      pj.placement[node_name] = static_cast<int>(slots.size());
      NodeState& ns = st.nodes[node_name];
      ns.name = node_name;
      ns.host = n->second.info.host;
      ns.restart_mode = n->second.info.restart_mode;
      ns.slots = slots;
      ns.order = n->second.order;
    }
    job.scheduler = NewScheduler(name, job.port_index);
    job.scheduler->Restore(st);
    policy_jobs.push_back(std::move(pj));
    jobs_.emplace(name, std::move(job));
  }
  EDL_RETURN_IF_ERROR(policy_.Restore(policy_nodes, policy_jobs));
  for (const EndedJob& e : s.ended) {
    finished_.push_back({{"name", e.name}, {"type", e.type}, {"state", e.state}, {"generation", e.generation}});
  }
  for (auto& [name, job] : jobs_) Collect(name, &job);  // each job's "restored" record
  Record({{"type", "restored"}, {"jobs", jobs_.size()}, {"nodes", nodes_.size()}, {"ended", finished_.size()}});
  return Status::OK();
}

}  // namespace edl::jobserver
