#include "jobserver/cluster.h"

#include <algorithm>

#include <glog/logging.h>

#include "edl/proto/frame.h"
#include "jobserver/events/events.h"

namespace edl::jobserver {

using nlohmann::json;

namespace {
// Most stale trainers remembered per cluster until their exits are reported (their late reports
// are then refused and logged, harmlessly).
constexpr size_t kMaxStaleKept = 65536;
}  // namespace

Cluster::Cluster(ClusterOptions options, Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      own_job_(options_.one_job ? options_.one_job->job_id : std::string()),
      slots_go_(options_.one_job ? SlotsGo::kToTheOneJob : SlotsGo::kByPolicy),
      registry_(options_.heartbeat_timeout_us, clock),
      policy_(options_.policy, clock) {
  if (options_.one_job) {  // the one job exists from the start
    Job job;
    job.spec.job.name = own_job_;
    job.spec.job.min_trainers = options_.one_job->min_trainers;
    job.spec.job.max_trainers = options_.one_job->max_trainers;
    job.membership = NewMembership(own_job_, 0);
    jobs_.emplace(own_job_, std::move(job));
  }
}

std::unique_ptr<JobMembership> Cluster::NewMembership(const std::string& name,
                                                      int port_index) const {
  MembershipOptions o = options_.job_defaults;
  if (name == own_job_) {
    o = *options_.one_job;  // sized by its own flags
  } else {
    o.min_trainers = 1;  // the policy holds the job's bounds; the membership follows its grants
    o.max_trainers = 0;
    o.initial_trainers = 0;
    o.master_port_base = options_.job_defaults.master_port_base + 1000 * port_index;
  }
  o.job_id = name;
  o.shared_trainer_seq = const_cast<uint64_t*>(&trainer_seq_);
  return std::make_unique<JobMembership>(o, clock_);
}

Cluster::Job* Cluster::Own() {
  auto it = own_job_.empty() ? jobs_.end() : jobs_.find(own_job_);
  return it != jobs_.end() ? &it->second : nullptr;
}

// ---- nodes

Status Cluster::AddNode(const ClusterNode& node, const std::vector<std::string>& running,
                        const std::vector<int64_t>& generations, std::string* session,
                        bool* known) {
  EDL_RETURN_IF_ERROR(registry_.Register(node, /*require_types=*/by_policy(), session, known));
  const NodeRegistry::Node* n = registry_.Find(node.name);
  events::NodeJoined joined{
      node.name, node.host, n->info.slots.size(), proto::NodeModeOf(n->info.restart_mode), {}};
  for (const JobTypeOffer& t : n->info.types) joined.job_types.push_back(t.name);
  Record(joined);
  // Each reported trainer goes to the job that placed it on this node (live or leaving); any other
  // is stale: a node new to the cluster runs nothing of its jobs (it was lost, so the others
  // re-formed without it; or the server started anew), and a trainer of a job that ended is done.
  std::map<std::string, std::vector<std::string>> by_job;
  std::map<std::string, std::vector<int64_t>> gens_by_job;
  const bool gens = generations.size() == running.size();
  std::vector<std::string> stale;
  for (size_t i = 0; i < running.size(); ++i) {
    std::string owner;
    for (const auto& [name, job] : jobs_) {
      if (*known && job.membership->PlacedOn(running[i], node.name)) owner = name;
    }
    if (owner.empty()) {
      stale.push_back(running[i]);
      continue;
    }
    by_job[owner].push_back(running[i]);
    if (gens) gens_by_job[owner].push_back(generations[i]);
  }
  if (!stale.empty()) {
    LOG(WARNING) << "node " << node.name << " runs " << stale.size() << " trainer(s) of no live job"
                 << (*known ? "" : " (the node had been dropped, or the server started anew)")
                 << ": killing them";
    Record(events::StaleTrainers{node.name, stale, std::nullopt});
    KillStale(node.name, std::move(stale));
  }
  if (!*known) {
    if (!by_policy()) {
      GrantEverySlot("node_joined");
    } else {
      PolicyNode pn{node.name, static_cast<int>(n->info.slots.size()), {}};
      for (const JobTypeOffer& t : n->info.types) pn.job_types.insert(t.name);
      if (Status s = policy_.AddNode(pn); !s.ok()) {
        LOG(ERROR) << "cluster policy refused node " << node.name << ": " << s.ToString();
      }
    }
  }
  for (auto& [name, job] :
       jobs_) {  // a re-attach: each job adopts its survivors (a new node runs none)
    if (*known && job.slots.count(node.name) > 0) {
      job.membership->NodeAttached(node.name, by_job[name], gens_by_job[name]);
    }
  }
  AfterPolicy();
  return Status::OK();
}

void Cluster::NodeDisconnected(const std::string& name) {
  registry_.Disconnected(name);
  for (auto& [job_name, job] : jobs_) job.membership->NodeDisconnected(name);
  AfterPolicy();  // a survivor's report may already have said its members are dead
}

void Cluster::KillStale(const std::string& node, std::vector<std::string> ids) {
  for (const std::string& id : ids) {
    if (stale_.size() >= kMaxStaleKept && stale_.count(id) == 0) stale_.erase(stale_.begin());
    stale_[id] = node;
  }
  Action a;
  a.kind = Action::Kind::kKill;
  a.node = node;
  a.trainer_ids = std::move(ids);
  actions_.push_back({"", std::move(a)});
}

// ---- jobs

Status Cluster::Submit(const JobSpec& spec) {
  if (!by_policy()) {
    return Status::FailedPrecondition(
        "'submit' needs a cluster server: start `edl server --cluster` (this one "
        "runs the single job " +
        own_job_ + ")");
  }
  EDL_RETURN_IF_ERROR(CheckJobSpec(
      spec,
      [this] {
        std::map<std::string, JobTypeOffer> offers;
        for (const auto& [name, n] : registry_.nodes()) {
          for (const JobTypeOffer& t : n.info.types) {
            auto [it, fresh] = offers.emplace(t.name, t);
            if (fresh) continue;
            std::set<std::string> both;  // settable only where every node offering the type says so
            for (const std::string& f : t.settable) {
              if (it->second.settable.count(f)) both.insert(f);
            }
            it->second.settable = std::move(both);
          }
        }
        return offers;
      }(),
      options_.policy.known_types, options_.checkpoint_root));
  if (jobs_.count(spec.job.name)) {
    return Status::AlreadyExists("job " + spec.job.name +
                                 " is already submitted; pick another name "
                                 "or `edl ctl cancel " +
                                 spec.job.name + "` first");
  }
  if (static_cast<size_t>(policy_.pending_jobs()) >= options_.max_pending_jobs) {
    return Status::Unavailable(
        std::to_string(policy_.pending_jobs()) +
        " jobs are pending, the most this server "
        "takes (--max_pending_jobs): submit again once some started, or cancel some");
  }
  JobSubmission sub = spec.job;
  sub.deadline_us = spec.deadline_s > 0 ? clock_->NowMicros() + spec.deadline_s * 1'000'000 : 0;
  Job job;
  job.spec = spec;
  // MASTER_PORT (restart-mode programs) is base + generation % 1000: jobs numbering the same
  // generations on one host get disjoint ranges.
  job.port_index = submitted_ % kJobPortRanges;
  job.membership = NewMembership(spec.job.name, job.port_index);
  // A name used before numbers its generations above the ended job's, so a checkpoint store the
  // two share keeps accepting saves (edl/ckpt/FORMAT.md).
  for (const EndedJob& e : finished_) {
    if (e.name == spec.job.name) job.membership->RaiseGenerationFloor(e.generation);
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

Status Cluster::Cancel(const std::string& name) {
  if (!by_policy()) {
    return Status::FailedPrecondition(
        "'cancel' needs a cluster server (`edl server --cluster`); this one runs the "
        "single job " +
        own_job_ + ": stop it with `edl ctl stop`");
  }
  auto it = jobs_.find(name);
  if (it == jobs_.end())
    return Status::NotFound("no live job named " + name + "; see `edl ctl jobs`");
  EDL_RETURN_IF_ERROR(policy_.Cancel(name));
  // One stop decision, the same as `edl ctl stop` of a one-job server (JobMembership::Stop): the
  // job's stop generation (no members, reason "stop", not a failure); in-place trainers leave it at
  // an agreed step, rank 0 saving a final checkpoint first, and exit 0; restart-mode ones are
  // stopped by their clients (TERM). A job with no members (pending) has nothing to stop.
  std::vector<proto::MemberInfo> leaving;
  it->second.membership->Stop("cancel", &leaving);
  Collect(name, &it->second);
  Forget(name, "cancelled");
  AfterPolicy();
  return Status::OK();
}

Status Cluster::Scale(const std::string& name, int n) {
  if (!by_policy()) {  // the one job's desired size
    if (!name.empty() && name != own_job_) {
      return Status::NotFound("no live job named " + name + "; this server runs the single job " +
                              own_job_);
    }
    if (Job* j = Own()) EDL_RETURN_IF_ERROR(j->membership->CheckSize(n));
    SetDesired(n, "ctl");
    return Status::OK();
  }
  if (name.empty())
    return Status::InvalidArgument(
        "'scale' on a cluster names a job: `edl ctl scale --job NAME N`");
  if (!jobs_.count(name))
    return Status::NotFound("no live job named " + name + "; see `edl ctl jobs`");
  EDL_RETURN_IF_ERROR(policy_.Scale(name, n));
  AfterPolicy();
  return Status::OK();
}

void Cluster::SetDesired(int n, const std::string& reason) {
  if (Job* j = Own()) j->membership->SetDesired(n, reason);
  AfterPolicy();
}

void Cluster::AddDesired(int delta, const std::string& reason) {
  if (Job* j = Own()) j->membership->AddDesired(delta, reason);
  AfterPolicy();
}

void Cluster::KillTrainers(int k) {
  if (Job* j = Own()) j->membership->KillTrainers(k);
  AfterPolicy();
}

void Cluster::KillAllTrainers() {
  if (Job* j = Own()) j->membership->KillAllTrainers();
  AfterPolicy();
}

bool Cluster::StopOwnJob(const std::string& by, std::vector<proto::MemberInfo>* leaving) {
  Job* j = Own();
  const bool stopped = j != nullptr && j->membership->Stop(by, leaving);
  AfterPolicy();
  return stopped;
}

void Cluster::RaiseGenerationFloor(int64_t g) {
  if (Job* j = Own()) j->membership->RaiseGenerationFloor(g);
}

// ---- reports

std::string Cluster::JobOfTrainer(const std::string& trainer_id, const std::string& node) const {
  for (const auto& [name, job] : jobs_) {
    if (job.membership->IsLiveTrainerOf(trainer_id, node)) return name;
  }
  return "";
}

bool Cluster::Authorized(const std::string& trainer_id, const std::string& node,
                         std::string* job) const {
  job->clear();
  for (const auto& [name, j] : jobs_) {
    if (!j.membership->PlacedOn(trainer_id, node)) continue;
    *job = name;  // a leaver's too: its last events (e.g. the final checkpoint of a stop) are its
                  // job's
    return true;
  }
  auto s = stale_.find(trainer_id);
  return s != stale_.end() && s->second == node;
}

void Cluster::TrainerExited(const std::string& trainer_id, const std::string& node, bool success,
                            const std::string& how, const std::string& error) {
  const std::string id =
      trainer_id;  // a copy: the caller's may live in a generation the exit replaces
  stale_.erase(id);
  for (auto& [name, job] : jobs_) {
    if (!job.membership->PlacedOn(id, node)) continue;
    const bool counts =
        !success && job.membership->IsLiveTrainer(id);  // a leaver's end is expected
    job.configs.erase(id);
    job.membership->TrainerExited(id, success, how);
    if (counts) NoteFailure(name, &job, how, error);
    break;
  }
  AfterPolicy();
}

void Cluster::NoteFailure(const std::string& name, Job* job, const std::string& how,
                          const std::string& error) {
  const std::string key = how + "\n" + error;
  job->failures_alike = key == job->failure_key ? job->failures_alike + 1 : 1;
  job->failure_key = key;
  job->failure_how = how;
  job->failure_error = error;
  if (job->failures_alike != kFailingAfter) return;
  job->failing_since_us = clock_->NowMicros();
  LOG(WARNING) << "job " << name << " is failing: " << kFailingAfter
               << " trainers in a row ended with " << how
               << (error.empty() ? "" : ", last log line: " + error)
               << "; the back-off grows until one makes progress";
  actions_.push_back({name, Action::Record(events::Failing{job->failures_alike, how, error})});
}

void Cluster::TrainerReady(const std::string& trainer_id, const std::string& node,
                           int64_t generation) {
  const std::string name = JobOfTrainer(trainer_id, node);
  if (name.empty()) return;
  jobs_.at(name).membership->TrainerReady(trainer_id, generation);
  AfterPolicy();
}

void Cluster::Progress(const std::string& job, const std::string& trainer_id,
                       const proto::ProgressReport& r) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || !it->second.membership->IsLiveTrainer(trainer_id)) return;
  Job& j = it->second;
  j.progress[trainer_id] = r;
  j.membership->TrainerStepped(trainer_id);
  if (r.step > j.last_step) {  // training moves: whatever kept failing no longer does
    j.last_step = r.step;
    j.last_progress_us = clock_->NowMicros();
    j.failures_alike = 0;
    j.failure_key.clear();
    j.failing_since_us = -1;
  }
  if (by_policy()) FeedGoodput(job, &j);
}

void Cluster::FeedGoodput(const std::string& name, Job* job) {
  const Measured m = MeasureOf(*job);
  if (m.rank0 != nullptr) {
    if (m.rank0->batch > 0) job->goodput.Batch(m.rank0->batch_policy, m.rank0->batch);
    if (m.rank0->noise_steps > 0) job->goodput.NoiseScale(m.rank0->noise_scale);
  }
  if (m.world >= 1 && m.compute_s_per_sample > 0) {
    job->goodput.Step(m.nodes, m.world, m.compute_s_per_sample, m.sync_s);
  }
  const PolicyJob* pj = policy_.Find(name);
  if (pj == nullptr || pj->state != JobPhase::kRunning) return;
  GoodputModel model;
  std::string missing;
  if (!job->goodput.Model(pj->spec.max_trainers, &model, &missing)) {
    // What the policy holds measured another batch: it goes, until this one is measured.
    if (pj->has_goodput) {
      (void)policy_.ReportGoodput(name, GoodputModel{});  // a withdrawal is never refused
      AfterPolicy();
    }
    return;
  }
  if (Status s = policy_.ReportGoodput(name, model); !s.ok()) {
    if (s.message() != job->goodput_refused) {
      LOG(WARNING) << "job " << name
                   << ": its goodput model was refused, it keeps its fair share: " << s.message();
    }
    job->goodput_refused = s.message();
    return;
  }
  job->goodput_refused.clear();
  AfterPolicy();  // a first model, or a larger world measured, may have resized jobs
}

namespace {

// The ";"-separated fields of two configuration fingerprints that differ, as "name: a vs b".
std::string ConfigDifference(const std::string& job, const std::string& joiner) {
  auto fields = [](const std::string& s) {
    std::map<std::string, std::string> out;
    size_t pos = 0, i = 0;
    while (pos <= s.size()) {
      const size_t end = std::min(s.find(';', pos), s.size());
      const std::string f = s.substr(pos, end - pos);
      const size_t eq = f.find('=');
      out[eq == std::string::npos ? "field " + std::to_string(i) : f.substr(0, eq)] =
          eq == std::string::npos ? f : f.substr(eq + 1);
      pos = end + 1;
      ++i;
    }
    return out;
  };
  const auto a = fields(job), b = fields(joiner);
  std::string diff;
  std::set<std::string> names;
  for (const auto& [k, v] : a) names.insert(k);
  for (const auto& [k, v] : b) names.insert(k);
  for (const std::string& k : names) {
    auto x = a.find(k), y = b.find(k);
    const std::string vx = x == a.end() ? "(none)" : x->second,
                      vy = y == b.end() ? "(none)" : y->second;
    if (vx != vy)
      diff += (diff.empty() ? "" : ", ") + k + ": the job's " + proto::Quote(vx, 48) +
              ", this trainer's " + proto::Quote(vy, 48);
  }
  return diff;
}

}  // namespace

void Cluster::TrainerEvent(const std::string& name, const std::string& trainer_id,
                           const std::string& node, const proto::TrainerEventBody& event) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  namespace ev = proto::ev;
  std::visit(Overloaded{
                 [&](const ev::JoinerFirstStep&) { job.membership->TrainerStepped(trainer_id); },
                 [&](const ev::ReformFailed& e) {
                   job.membership->ReformFailed(trainer_id, e.generation);
                   AfterPolicy();  // collects the commit, as for the other reports
                 },
                 [&](const ev::CommFailed& e) {
                   job.membership->CommFailed(trainer_id, e.generation);
                   AfterPolicy();
                 },
                 [&](const ev::CheckpointFailed& e) {
                   ++job.checkpoint_failures;
                   if (e.refused) ++job.checkpoint_refusals;
                   job.checkpoint_failed_step = e.step;
                   job.checkpoint_error = e.error.substr(0, proto::kMaxErrorLineBytes);
                 },
                 [&](const ev::StopCheckpoint& e) {
                   job.final_checkpoint_reported = true;
                   job.final_checkpoint_ok = e.ok;
                   job.final_checkpoint_error = e.error.substr(0, proto::kMaxErrorLineBytes);
                   if (job.final_checkpoint_error.empty())
                     job.final_checkpoint_error = job.checkpoint_error;  // the save's own
                 },
                 [&](const ev::Config& e) { OnConfig(&job, trainer_id, node, e.fingerprint); },
                 [](const ev::CheckpointSaved&) {},  // the metrics count them
                 [&](const ev::Stall& e) {
                   // A planned re-form's cost, for the goodput model (failures are not the
                   // policy's choice).
                   if (!e.failure) job.goodput.Reform(e.cost_s());
                 },
                 [](const ev::Other&) {},
                 [](const ev::Malformed&) {},  // the server drops them before they come here
             },
             event);
}

void Cluster::OnConfig(Job* job, const std::string& trainer_id, const std::string& node,
                       const std::string& config) {
  if (job->membership->IsMember(trainer_id) || job->config.empty()) {
    job->config = config;  // the members' configuration is the job's (a resumed job may change it)
    return;
  }
  if (config == job->config || !job->membership->IsLiveTrainerOf(trainer_id, node)) return;
  // A joiner started with another configuration would break the ring (another data size, batch
  // or model): refused before it is committed, naming what differs.
  job->membership->RefuseJoiner(trainer_id,
                                "its configuration differs from the job's (" +
                                    ConfigDifference(job->config, config) +
                                    "); start its client with the job's trainer command");
  AfterPolicy();
}

Cluster::FinalCheckpoint Cluster::FinalCheckpointOf(const std::string& name,
                                                    std::string* error) const {
  auto it = jobs_.find(name);
  if (it == jobs_.end() || !it->second.final_checkpoint_reported)
    return FinalCheckpoint::kNotReported;
  if (it->second.final_checkpoint_ok) return FinalCheckpoint::kSaved;
  *error = it->second.final_checkpoint_error;
  return FinalCheckpoint::kFailed;
}

void Cluster::Tick() {
  for (const std::string& name : registry_.TakeLost()) {
    const std::string why = registry_.LostWhy();
    // Each job first loses the node's trainers as failures; the policy then repairs the jobs.
    for (auto& [job_name, job] : jobs_) {
      if (job.slots.erase(name) > 0) job.membership->NodeLost(name, why);
    }
    owner_.erase(name);
    for (auto it = stale_.begin(); it != stale_.end();)
      it = it->second == name ? stale_.erase(it) : std::next(it);
    if (by_policy()) {
      if (Status s = policy_.NodeLost(name); !s.ok())
        LOG(WARNING) << "cluster: node " << name << ": " << s.ToString();
    }
  }
  if (by_policy()) policy_.Tick();
  for (auto& [name, job] : jobs_) job.membership->Tick();
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
      Record(events::Policy{e});
      if (!e.job.empty()) reasons_[e.job] = e.kind;
    }
    if (by_policy()) {
      for (bool grow : {false, true}) {  // every job gives up slots before any takes them
        for (auto& [name, job] : jobs_) {
          auto r = reasons_.find(name);
          ApplyPlacement(name, &job, r == reasons_.end() ? "policy" : r->second, grow);
        }
      }
    }
    std::vector<std::string> done;
    for (auto& [name, job] : jobs_) {
      Collect(name, &job);
      if (job.membership->done() && name != own_job_)
        done.push_back(name);  // the one job ends with the server
    }
    reasons_.clear();
    if (done.empty()) return;
    for (const std::string& name : done) {
      Forget(name, "finished");
      if (Status s = policy_.Finish(name); !s.ok())
        LOG(WARNING) << "cluster: finishing job " << name << ": " << s.ToString();
    }
  }
}

std::vector<SlotGrant> Cluster::Grants(const Job& job) const {
  std::vector<SlotGrant> grants;
  for (const auto& [node_name, slots] : job.slots) {
    const NodeRegistry::Node* n = registry_.Find(node_name);
    if (n == nullptr) continue;  // lost: its job dropped it already
    grants.push_back(
        {node_name, n->info.host, n->info.restart_mode, slots, n->connected, n->order});
  }
  return grants;
}

void Cluster::GrantEverySlot(const std::string& reason) {
  Job* job = Own();
  if (job == nullptr) return;
  job->slots.clear();
  for (const auto& [name, n] : registry_.nodes()) {
    job->slots[name] = n.info.slots;
    for (int s : n.info.slots) owner_[name][s] = own_job_;
  }
  job->membership->SetAllocation(Grants(*job), reason);
}

void Cluster::ApplyPlacement(const std::string& name, Job* job, const std::string& reason,
                             bool grow) {
  const PolicyJob* pj = policy_.Find(name);
  const Placement empty;
  const Placement& want = pj != nullptr ? pj->placement : empty;
  // Rank of the job's member on each (node, slot); slots without one are given up first.
  std::map<std::pair<std::string, int>, int> rank;
  for (const proto::MemberInfo& m : job->membership->current().members)
    rank[{m.node, m.slot}] = m.rank;
  std::set<std::string> names;
  for (const auto& [node, slots] : job->slots) names.insert(node);
  for (const auto& [node, k] : want) names.insert(node);
  bool changed = false;
  for (const std::string& node_name : names) {
    const NodeRegistry::Node* n = registry_.Find(node_name);
    if (n == nullptr) continue;  // lost: the job dropped it already
    std::map<int, std::string>& owner = owner_[node_name];
    auto w = want.find(node_name);
    const size_t k = w == want.end() ? 0 : static_cast<size_t>(w->second);
    std::vector<int>& mine = job->slots[node_name];
    if (!grow && mine.size() > k) {
      // Kept: the slots of the lowest ranks; given up: the highest ranks', then slots without a
      // member.
      std::sort(mine.begin(), mine.end(), [&](int a, int b) {
        auto ra = rank.find({node_name, a}), rb = rank.find({node_name, b});
        const bool ha = ra != rank.end(), hb = rb != rank.end();
        if (ha != hb) return ha;
        return ha ? ra->second < rb->second : a < b;
      });
      for (size_t i = k; i < mine.size(); ++i) owner.erase(mine[i]);
      mine.resize(k);
      changed = true;
    }
    for (int s : n->info.slots) {
      if (!grow || mine.size() >= k) break;
      if (owner.count(s)) continue;
      owner[s] = name;
      mine.push_back(s);
      changed = true;
    }
    std::sort(mine.begin(), mine.end());
    if (mine.empty()) job->slots.erase(node_name);
  }
  if (!changed) return;
  int total = 0;
  for (const auto& [node_name, slots] : job->slots) total += static_cast<int>(slots.size());
  job->membership->SetAllocation(Grants(*job), reason, total);
}

void Cluster::Forget(const std::string& name, const std::string& state) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  for (const auto& [node_name, slots] : it->second.slots) {
    auto o = owner_.find(node_name);
    if (o == owner_.end()) continue;
    for (int s : slots) o->second.erase(s);
  }
  finished_.push_back(
      {name, it->second.spec.job.type, state, it->second.membership->current().generation});
  while (finished_.size() > options_.max_finished_kept) finished_.pop_front();
  if (state == "cancelled") {
    Record(events::JobCancelled{name});
  } else {
    Record(events::JobFinished{name});
  }
  jobs_.erase(it);
}

void Cluster::Collect(const std::string& name, Job* job) {
  for (Action& a : job->membership->TakeActions()) {
    if (a.kind == Action::Kind::kCommit) {  // progress is kept for live trainers only
      for (auto it = job->progress.begin(); it != job->progress.end();) {
        it = job->membership->IsLiveTrainer(it->first) ? std::next(it) : job->progress.erase(it);
      }
    }
    actions_.push_back({name, std::move(a)});
  }
}

// ---- state

const JobMembership* Cluster::FindJob(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.membership.get();
}

const JobSpec* Cluster::FindSpec(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() || name == own_job_ ? nullptr : &it->second.spec;
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

std::vector<std::string> Cluster::JobsFor(const std::string& node) const {
  std::vector<std::string> out;
  const NodeRegistry::Node* n = registry_.Find(node);
  if (n == nullptr) return out;
  for (const auto& [name, job] : jobs_) {
    if (name == own_job_) {
      out.push_back(name);
      continue;
    }
    for (const JobTypeOffer& t : n->info.types) {
      if (t.name == job.spec.job.type) out.push_back(name);
    }
  }
  return out;
}

bool Cluster::Hosts(const std::string& node, const std::string& job) const {
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second.slots.count(node) > 0;
}

std::optional<std::map<std::string, int>> Cluster::TeacherCapacity() const {
  if (!by_policy()) return std::nullopt;  // every slot is the one job's
  return policy_.FreeSlotsByNode();
}

// ---- durable state

void Cluster::Snapshot(ClusterState* s) const {
  const int64_t now = clock_->NowMicros();
  s->one_job = own_job_;
  s->trainer_seq = trainer_seq_;
  s->submitted = submitted_;
  registry_.Snapshot(&s->nodes);
  s->jobs.clear();
  for (const auto& [name, job] : jobs_) {
    ClusterJobState& js = s->jobs[name];
    js.spec = job.spec;
    js.port_index = job.port_index;
    js.slots = job.slots;
    js.running = !job.slots.empty();
    if (const PolicyJob* pj = policy_.Find(name)) {
      js.seq = pj->seq;
      js.cap = pj->cap;
      js.running = pj->state == JobPhase::kRunning;
      js.deadline_left_us =
          pj->spec.deadline_us > 0
              ? std::clamp<int64_t>(pj->spec.deadline_us - now, 1, kMaxDeadlineLeftUs)
              : 0;
      js.deadline_reported = pj->deadline_reported;
    }
    job.membership->Snapshot(&js.sched);
    js.sched.config = job.config;
  }
  s->ended.assign(finished_.begin(), finished_.end());
}

Status Cluster::Restore(const ClusterState& s) {
  if (s.one_job != own_job_) {
    if (s.one_job.empty()) {
      return Status::FailedPrecondition(
          "the state store holds a cluster server's state (`edl server --cluster`): "
          "give each server its own --state_dir");
    }
    if (own_job_.empty()) {
      return Status::FailedPrecondition("the state store holds a single-job server's job " +
                                        s.one_job +
                                        ": give the cluster server its own --state_dir");
    }
    return Status::FailedPrecondition("the state store holds job " + s.one_job +
                                      " of another server; start this "
                                      "one with --job_id " +
                                      s.one_job + " to resume it, or give job " + own_job_ +
                                      " its own --state_dir");
  }
  auto corrupt = [](const std::string& why) {
    return Status::Corruption("saved cluster state: " + why +
                              ". Move the state aside (the server then starts "
                              "with no jobs) or restore it from a backup");
  };
  EDL_RETURN_IF_ERROR(registry_.Restore(s.nodes));
  trainer_seq_ = std::max(trainer_seq_, s.trainer_seq);
  submitted_ = s.submitted;
  std::vector<PolicyNode> policy_nodes;
  for (const std::string& name : registry_.InOrder()) {
    const NodeRegistry::Node* n = registry_.Find(name);
    PolicyNode pn{name, static_cast<int>(n->info.slots.size()), {}};
    for (const JobTypeOffer& t : n->info.types) pn.job_types.insert(t.name);
    policy_nodes.push_back(std::move(pn));
  }
  jobs_.clear();
  owner_.clear();
  std::vector<PolicyJob> policy_jobs;
  for (const auto& [name, js] : s.jobs) {
    Job job;
    job.spec = js.spec;
    job.spec.job.name = name;
    job.port_index = js.port_index;
    job.slots = js.slots;
    PolicyJob pj;
    pj.spec = js.spec.job;
    pj.spec.deadline_us = js.deadline_left_us > 0 ? clock_->NowMicros() + js.deadline_left_us : 0;
    pj.deadline_reported = js.deadline_reported;
    pj.state = js.running ? JobPhase::kRunning : JobPhase::kPending;
    pj.cap = js.cap;
    pj.seq = js.seq;
    for (const auto& [node_name, slots] : js.slots) {
      const NodeRegistry::Node* n = registry_.Find(node_name);
      if (n == nullptr) return corrupt("job " + name + " holds slots on unknown node " + node_name);
      std::map<int, std::string>& owner = owner_[node_name];
      for (int slot : slots) {
        const std::vector<int>& offered = n->info.slots;
        if (std::find(offered.begin(), offered.end(), slot) == offered.end() || owner.count(slot)) {
          return corrupt("job " + name + " holds slot " + std::to_string(slot) + " of node " +
                         node_name + ", which the node does not offer or another job holds");
        }
        owner[slot] = name;
      }
      pj.placement[node_name] = static_cast<int>(slots.size());
    }
    job.membership = NewMembership(name, job.port_index);
    job.membership->Restore(js.sched, Grants(job));
    job.config = js.sched.config;
    if (name != own_job_) policy_jobs.push_back(std::move(pj));
    jobs_.emplace(name, std::move(job));
  }
  if (!own_job_.empty() && !jobs_.count(own_job_))
    return corrupt("the server's job " + own_job_ + " is missing");
  if (by_policy()) EDL_RETURN_IF_ERROR(policy_.Restore(policy_nodes, policy_jobs));
  finished_.assign(s.ended.begin(), s.ended.end());
  if (!by_policy()) GrantEverySlot("restore");  // every node the state knows, its members' included
  for (auto& [name, job] : jobs_) Collect(name, &job);  // each job's "restored" record
  if (Own() == nullptr) {  // (a one-job server's log is its job's: the job's record says it all)
    Record(events::ClusterRestored{jobs_.size(), registry_.nodes().size(), finished_.size()});
  }
  return Status::OK();
}

}  // namespace edl::jobserver
