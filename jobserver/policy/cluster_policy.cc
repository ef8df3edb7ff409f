#include "jobserver/policy/cluster_policy.h"

#include <algorithm>
#include <queue>
#include <sstream>
#include <utility>

#include "edl/proto/names.h"

namespace edl::jobserver {

namespace {

// Empty when `s` is a valid name of `what` (proto::CheckName); otherwise the problem and the fix.
std::string NameProblem(const std::string& what, const std::string& s) {
  const Status st = proto::CheckName(what, s, kMaxPolicyNameBytes);
  return st.ok() ? std::string() : st.message();
}

std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string JoinSet(const std::set<std::string>& s) {
  return Join(std::vector<std::string>(s.begin(), s.end()), ",");
}

// a/wa < b/wb without division.
bool RatioLess(int64_t a, int64_t wa, int64_t b, int64_t wb) { return a * wb < b * wa; }

}  // namespace

nlohmann::json PolicyEvent::ToJson() const {
  nlohmann::json e = {{"time_us", time_us}, {"event", kind}, {"reason", reason}};
  if (!job.empty()) {
    e["job"] = job;
    e["from"] = from;
    e["to"] = to;
    e["placement"] = placement;
  }
  if (!node.empty()) e["node"] = node;
  return e;
}

ClusterPolicy::ClusterPolicy(ClusterPolicyOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock), known_types_(options_.known_types) {}

// ---------------------------------------------------------------- inputs

Status ClusterPolicy::AddNode(const PolicyNode& node) {
  if (std::string p = NameProblem("node name", node.name); !p.empty()) {
    return Status::InvalidArgument(p);
  }
  if (node.slots < 1 || node.slots > static_cast<int>(proto::kMaxSlotsPerNode)) {
    return Status::InvalidArgument("node " + node.name + " offers " + std::to_string(node.slots) +
                                   " slots: a node offers 1.." +
                                   std::to_string(static_cast<int>(proto::kMaxSlotsPerNode)));
  }
  if (node.job_types.empty()) {
    return Status::InvalidArgument("node " + node.name +
                                   " offers no job type: name at least one job_type in its client "
                                   "configuration");
  }
  if (node.job_types.size() > kMaxPolicyTypesPerNode) {
    return Status::InvalidArgument("node " + node.name + " offers " +
                                   std::to_string(node.job_types.size()) + " job types: at most " +
                                   std::to_string(kMaxPolicyTypesPerNode));
  }
  for (const auto& t : node.job_types) {
    if (std::string p = NameProblem("job type of node " + node.name, t); !p.empty()) {
      return Status::InvalidArgument(p);
    }
  }
  if (nodes_.count(node.name) > 0) {
    return Status::AlreadyExists("node " + node.name +
                                 " is already in the cluster: a node name joins once; pick another "
                                 "name or wait until the old node is lost");
  }
  if (nodes_.size() >= kMaxPolicyNodes) {
    return Status::Unavailable("the cluster has " + std::to_string(nodes_.size()) +
                               " nodes, the most it accepts; node " + node.name + " was refused");
  }
  BeginPass();
  Node& n = nodes_[node.name];
  n.slots = node.slots;
  n.types = node.job_types;
  n.order = next_node_order_++;
  known_types_.insert(node.job_types.begin(), node.job_types.end());
  for (auto& [name, job] : jobs_) job.goodput_curve.clear();  // node sizes may differ now
  EmitNodeEvent("node_added", node.name,
                std::to_string(node.slots) + " slots, job types " + JoinSet(node.job_types));
  RunPass();
  return Status::OK();
}

Status ClusterPolicy::NodeLost(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return Status::NotFound("node " + name + " is not in the cluster");
  AccrueService();
  const int64_t now = clock_->NowMicros();
  std::vector<std::string> hit;
  for (auto& [jname, job] : jobs_) {
    auto p = job.placement.find(name);
    if (p == job.placement.end()) continue;
    const int before = job.size;
    RemoveFrom(&job, name, p->second);
    job.last_change_us = now;
    hit.push_back(jname + ":" + std::to_string(before) + "->" + std::to_string(job.size));
    PolicyEvent e;
    e.time_us = now;
    e.kind = "shrink";
    e.job = jname;
    e.from = before;
    e.to = job.size;
    e.placement = job.placement;
    e.reason = "node " + name + " lost";
    events_.push_back(std::move(e));
  }
  nodes_.erase(it);
  for (auto& [jname, job] : jobs_) job.goodput_curve.clear();
  EmitNodeEvent("node_lost", name, hit.empty() ? "no trainers there" : "jobs " + Join(hit, ", "));
  // The shrink events above are logged; the pass below logs only what it changes after them.
  BeginPass();
  RunPass();
  return Status::OK();
}

Status ClusterPolicy::Submit(const JobSubmission& job) {
  if (std::string p = NameProblem("job name", job.name); !p.empty()) {
    return Status::InvalidArgument(p);
  }
  if (std::string p = NameProblem("job type of job " + job.name, job.type); !p.empty()) {
    return Status::InvalidArgument(p);
  }
  const std::string j = "job " + job.name + ": ";
  if (job.min_trainers < 1) {
    return Status::InvalidArgument(j + "min_trainers " + std::to_string(job.min_trainers) +
                                   " is below 1: a job needs at least one trainer");
  }
  if (job.max_trainers > kMaxJobTrainers) {
    return Status::InvalidArgument(j + "max_trainers " + std::to_string(job.max_trainers) +
                                   " is above the limit " + std::to_string(kMaxJobTrainers));
  }
  if (job.min_trainers > job.max_trainers) {
    return Status::InvalidArgument(j + "min_trainers " + std::to_string(job.min_trainers) +
                                   " > max_trainers " + std::to_string(job.max_trainers) +
                                   ": set min_trainers <= max_trainers");
  }
  if (!job.elastic && job.min_trainers != job.max_trainers) {
    return Status::InvalidArgument(
        j + "a restart-mode job runs at a fixed size, but min_trainers " +
        std::to_string(job.min_trainers) + " != max_trainers " + std::to_string(job.max_trainers) +
        ": set them equal, or submit it as elastic");
  }
  if (job.priority < 1 || job.priority > kMaxJobPriority) {
    return Status::InvalidArgument(j + "priority " + std::to_string(job.priority) +
                                   " is outside 1.." + std::to_string(kMaxJobPriority));
  }
  if (job.deadline_us < 0) {
    return Status::InvalidArgument(j + "deadline " + std::to_string(job.deadline_us) +
                                   " is negative: give a time ahead, or 0 for none");
  }
  if (job.deadline_us > 0 && job.deadline_us <= clock_->NowMicros()) {
    return Status::InvalidArgument(j +
                                   "the deadline has already passed: give a time ahead, or "
                                   "none");
  }
  if (known_types_.count(job.type) == 0) {
    return Status::InvalidArgument(
        j + "unknown job type '" + job.type + "': no node has declared it" +
        (known_types_.empty() ? std::string(" (no node has joined yet)")
                              : "; known types: " + JoinSet(known_types_)) +
        ". Add `job_type " + job.type + " = COMMAND` to a client's configuration");
  }
  if (jobs_.count(job.name) > 0) {
    return Status::AlreadyExists(j +
                                 "a job of that name is already pending or running: pick "
                                 "another name, or cancel the old job first");
  }
  if (jobs_.size() >= kMaxPolicyJobs) {
    return Status::Unavailable(j + "the cluster already holds " + std::to_string(jobs_.size()) +
                               " jobs, the most it accepts: wait for some to finish");
  }
  BeginPass();
  const int64_t now = clock_->NowMicros();
  PolicyJob& pj = jobs_[job.name];
  pj.spec = job;
  pj.cap = job.max_trainers;
  pj.submitted_us = now;
  pj.seq = next_seq_++;
  PolicyEvent e;
  e.time_us = now;
  e.kind = "submit";
  e.job = job.name;
  e.reason = "type " + job.type + ", " + (job.elastic ? "elastic " : "restart mode, ") +
             std::to_string(job.min_trainers) + ".." + std::to_string(job.max_trainers) +
             " trainers, priority " + std::to_string(job.priority) +
             (job.deadline_us > 0 ? ", deadline " + std::to_string(job.deadline_us) + " us" : "");
  events_.push_back(std::move(e));
  RunPass();
  return Status::OK();
}

Status ClusterPolicy::Scale(const std::string& name, int n) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return Status::NotFound("job " + name + " is not pending or running");
  PolicyJob& job = it->second;
  if (!job.spec.elastic) {
    return Status::FailedPrecondition("job " + name +
                                      " runs in restart mode at a fixed size; it cannot be scaled");
  }
  if (n < job.spec.min_trainers || n > job.spec.max_trainers) {
    return Status::InvalidArgument(
        "job " + name + ": scale to " + std::to_string(n) + " is outside its min..max " +
        std::to_string(job.spec.min_trainers) + ".." + std::to_string(job.spec.max_trainers));
  }
  BeginPass();
  PolicyEvent e;
  e.time_us = clock_->NowMicros();
  e.kind = "scale";
  e.job = name;
  e.from = e.to = job.size;
  e.placement = job.placement;
  e.reason = "requested " + std::to_string(n) + " trainers (was " + std::to_string(job.cap) + ")";
  events_.push_back(std::move(e));
  job.cap = n;
  Note(name, "scale request " + std::to_string(n));
  RunPass();
  return Status::OK();
}

Status ClusterPolicy::Finish(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return Status::NotFound("job " + name + " is not pending or running");
  if (it->second.state != JobPhase::kRunning) {
    return Status::FailedPrecondition(
        "job " + name + " is pending: only a running job finishes (cancel it instead)");
  }
  RemoveJob(name, "finish", "its trainers completed");
  return Status::OK();
}

Status ClusterPolicy::Cancel(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return Status::NotFound("job " + name + " is not pending or running");
  RemoveJob(name, "cancel",
            it->second.state == JobPhase::kRunning ? "cancelled while running"
                                                   : "cancelled while pending");
  return Status::OK();
}

void ClusterPolicy::RemoveJob(const std::string& name, const char* kind, const char* reason) {
  auto it = jobs_.find(name);
  BeginPass();
  PolicyEvent e;
  e.time_us = clock_->NowMicros();
  e.kind = kind;
  e.job = name;
  e.from = it->second.size;
  e.reason = reason;
  ReleaseAll(&it->second);
  jobs_.erase(it);
  before_.erase(name);
  events_.push_back(std::move(e));
  RunPass();
}

void ClusterPolicy::Tick() {
  BeginPass();
  RunPass();
}

Status ClusterPolicy::Restore(const std::vector<PolicyNode>& nodes,
                              const std::vector<PolicyJob>& jobs) {
  const int64_t now = clock_->NowMicros();
  for (const PolicyNode& pn : nodes) {
    Node& n = nodes_[pn.name];
    n.slots = pn.slots;
    n.types = pn.job_types;
    n.order = next_node_order_++;
    known_types_.insert(pn.job_types.begin(), pn.job_types.end());
  }
  for (PolicyJob j : jobs) {
    j.size = 0;
    for (const auto& [node, k] : j.placement) {
      j.size += k;
      if (auto it = nodes_.find(node); it != nodes_.end()) it->second.used += k;
    }
    j.cap = std::clamp(j.cap, j.spec.min_trainers, j.spec.max_trainers);
    j.submitted_us = now;
    j.started_us = j.last_change_us = j.state == JobPhase::kRunning ? now : -1;
    next_seq_ = std::max(next_seq_, j.seq + 1);
    jobs_[j.spec.name] = std::move(j);
  }
  Status s = CheckInvariants();
  if (s.ok()) return s;
  nodes_.clear();
  jobs_.clear();
  return Status::Corruption(
      "the saved jobs do not fit the saved nodes: " + s.message() +
      ". Move --state_dir aside (the server then starts with no jobs) or restore it "
      "from a backup");
}

std::vector<PolicyEvent> ClusterPolicy::TakeEvents() {
  std::vector<PolicyEvent> out;
  out.swap(events_);
  return out;
}

int64_t ClusterPolicy::NextWakeupMicros() const {
  const int64_t now = clock_->NowMicros();
  int64_t best = -1;
  auto consider = [&](int64_t t) {
    if (t > now && (best < 0 || t < best)) best = t;
  };
  for (const auto& [name, job] : jobs_) {
    if (options_.min_change_interval_us > 0 && job.state == JobPhase::kRunning &&
        job.spec.elastic && job.last_change_us >= 0) {
      consider(job.last_change_us + options_.min_change_interval_us);
    }
    if (job.spec.deadline_us > 0 && !job.deadline_reported) consider(job.spec.deadline_us);
  }
  return best;
}

// ---------------------------------------------------------------- the pass

void ClusterPolicy::AccrueService() {
  const int64_t now = clock_->NowMicros();
  for (auto& [name, job] : jobs_) {
    if (job.service_at_us >= 0 && job.state == JobPhase::kRunning) {
      job.service_trainer_s += job.size * (now - job.service_at_us) * 1e-6;
    }
    job.service_at_us = now;
  }
}

void ClusterPolicy::BeginPass() {
  AccrueService();
  reserved_.clear();
  reasons_.clear();
  exempt_.clear();
  before_.clear();
  for (const auto& [name, job] : jobs_) {
    before_[name] = {job.state == JobPhase::kRunning, job.size, job.placement};
  }
}

void ClusterPolicy::RunPass() {
  // 1. Repair jobs a lost node left below their floor.
  for (PolicyJob* job : Ordered(JobPhase::kRunning)) {
    if (job->size < Floor(*job)) Repair(job);
  }
  // 2. Admission, 3-4. fair share and apply.
  Admit();
  FairShare();

  // Deadlines.
  const int64_t now = clock_->NowMicros();
  for (auto& [name, job] : jobs_) {
    if (job.spec.deadline_us > 0 && !job.deadline_reported && now >= job.spec.deadline_us) {
      job.deadline_reported = true;
      PolicyEvent e;
      e.time_us = now;
      e.kind = "deadline_passed";
      e.job = name;
      e.from = e.to = job.size;
      e.placement = job.placement;
      e.reason = job.state == JobPhase::kRunning ? "still running" : "still pending";
      events_.push_back(std::move(e));
    }
  }

  // One event per job whose placement changed, in submission order.
  std::vector<PolicyJob*> all;
  for (auto& [name, job] : jobs_) all.push_back(&job);
  std::sort(all.begin(), all.end(), [](PolicyJob* a, PolicyJob* b) { return a->seq < b->seq; });
  for (PolicyJob* job : all) {
    auto b = before_.find(job->spec.name);
    const bool was_running = b != before_.end() && b->second.running;
    const int from = b == before_.end() ? 0 : b->second.size;
    const bool running = job->state == JobPhase::kRunning;
    if (b != before_.end() && was_running == running && from == job->size &&
        b->second.placement == job->placement) {
      continue;
    }
    if (!was_running && job->size == 0) continue;
    PolicyEvent e;
    e.time_us = now;
    e.job = job->spec.name;
    e.from = from;
    e.to = job->size;
    e.placement = job->placement;
    if (!was_running) {
      e.kind = "start";
      job->started_us = now;
    } else if (job->state == JobPhase::kPending) {
      e.kind = "requeue";
    } else if (job->size > from) {
      e.kind = "grow";
    } else if (job->size < from) {
      e.kind = "shrink";
    } else {
      e.kind = "move";
    }
    if (was_running && running && job->has_goodput) job->reform_paid_s += job->goodput.reform_s;
    std::vector<std::string> uniq;
    for (const auto& r : reasons_[job->spec.name]) {
      if (std::find(uniq.begin(), uniq.end(), r) == uniq.end()) uniq.push_back(r);
    }
    e.reason = uniq.empty() ? "policy" : Join(uniq, "; ");
    job->last_change_us = now;
    events_.push_back(std::move(e));
  }
}

bool ClusterPolicy::Repair(PolicyJob* job) {
  const int need = Floor(*job) - job->size;
  exempt_.insert(job->spec.name);
  if (Acquire(job, need, options_.preempt, "repair after node loss")) return true;
  const int had = job->size;
  ReleaseAll(job);
  job->state = JobPhase::kPending;
  Note(job->spec.name, "a lost node left " + std::to_string(had) + " of the " +
                           std::to_string(Floor(*job)) + " trainers it needs, and " +
                           std::to_string(need) + " more could not be found");
  SetPending(job, "requeued",
             "requeued after a node loss: waiting for " + std::to_string(Floor(*job)) + " slots");
  return false;
}

void ClusterPolicy::Admit() {
  std::map<std::string, std::string> blocked_by;  // node -> the blocked job holding it
  for (PolicyJob* job : Ordered(JobPhase::kPending)) {
    const std::string& type = job->spec.type;
    const int need = Floor(*job);
    std::vector<std::string> compat;
    for (const auto& [n, node] : nodes_) {
      if (node.types.count(type) > 0) compat.push_back(n);
    }
    if (compat.empty()) {
      SetPending(job, "no_type", "no live node offers job type '" + type + "'");
      continue;
    }
    const int capacity = TypeCapacity(type);
    if (capacity < need) {
      SetPending(job, "too_big",
                 "needs " + std::to_string(need) + " trainers of type " + type +
                     " at once; the live nodes offering it have " + std::to_string(capacity) +
                     " slots");
      continue;
    }
    std::string blocker;
    for (const auto& n : compat) {
      auto b = blocked_by.find(n);
      if (b != blocked_by.end()) {
        blocker = b->second;
        break;
      }
    }
    if (!blocker.empty()) {
      SetPending(job, "queued", "queued behind job " + blocker);
      continue;
    }
    if (Acquire(job, need, options_.preempt,
                "gang start at " + std::to_string(need) + " (min fits)")) {
      job->state = JobPhase::kRunning;
      job->pending_reason.clear();
      job->pending_code.clear();
      continue;
    }
    // Blocked: hold the free slots it will need, and the queue behind it on its nodes.
    int free = 0;
    int left = need;
    for (const auto& n : compat) {
      const int f = FreeOn(n);
      free += f;
      const int r = std::min(f, left);
      reserved_[n] += r;
      left -= r;
      blocked_by[n] = job->spec.name;
    }
    int reclaimable = 0;
    if (options_.preempt) {
      for (PolicyJob* v : VictimsFor(*job)) reclaimable += Reclaimable(*v, *job);
    }
    SetPending(job, "waiting",
               "waiting for " + std::to_string(need) + " slots of type " + type + ": " +
                   std::to_string(free) + " free, " + std::to_string(reclaimable) +
                   " reclaimable from lower or equal priority jobs now");
  }
}

bool ClusterPolicy::Acquire(PolicyJob* job, int need, bool may_reclaim, const std::string& why) {
  int free = 0;
  std::set<std::string> compat;
  for (const auto& [n, node] : nodes_) {
    if (node.types.count(job->spec.type) == 0) continue;
    compat.insert(n);
    free += FreeOn(n);
  }
  if (free < need) {
    if (!may_reclaim) return false;
    std::vector<PolicyJob*> victims = VictimsFor(*job);
    int total = 0;
    for (PolicyJob* v : victims) total += Reclaimable(*v, *job);
    if (free + total < need) return false;
    int still = need - free;
    for (PolicyJob* v : victims) {
      if (still <= 0) break;
      const int take = std::min(still, Reclaimable(*v, *job));
      if (take <= 0) continue;
      Shrink(v, take, &compat,
             "make room for job " + job->spec.name + " (priority " +
                 std::to_string(job->spec.priority) + ")");
      still -= take;
    }
  }
  Grow(job, need, why);
  return true;
}

int ClusterPolicy::Reclaimable(const PolicyJob& victim, const PolicyJob& beneficiary) const {
  if (&victim == &beneficiary || !victim.spec.elastic || victim.state != JobPhase::kRunning) {
    return 0;
  }
  if (victim.spec.priority > beneficiary.spec.priority) return 0;
  if (RateLimited(victim)) return 0;
  int on_compat = 0;
  for (const auto& [n, k] : victim.placement) {
    if (Offers(n, beneficiary.spec.type)) on_compat += k;
  }
  return std::max(0, std::min(victim.size - victim.spec.min_trainers, on_compat));
}

std::vector<PolicyJob*> ClusterPolicy::VictimsFor(const PolicyJob& job) {
  std::vector<PolicyJob*> out;
  for (auto& [name, v] : jobs_) {
    if (Reclaimable(v, job) > 0) out.push_back(&v);
  }
  // Lowest priority first; then the job furthest above its share (size / priority); then newest.
  std::sort(out.begin(), out.end(), [](PolicyJob* a, PolicyJob* b) {
    if (a->spec.priority != b->spec.priority) return a->spec.priority < b->spec.priority;
    if (a->size * b->spec.priority != b->size * a->spec.priority) {
      return RatioLess(b->size, b->spec.priority, a->size, a->spec.priority);
    }
    return a->seq > b->seq;
  });
  return out;
}

void ClusterPolicy::FairShare() {
  std::map<std::string, int> capacity;
  std::vector<Flex> flex = FlexJobs(&capacity);
  const bool goodput = options_.kind == PolicyKind::kGoodput;
  if (!goodput) {
    MaxMinFill(&flex, &capacity);
  } else {
    // Jobs without a model get their max-min share among all the flexible jobs (step 3); the
    // jobs with one share what that leaves by goodput (step 3').
    std::vector<Flex> trial = flex;
    std::map<std::string, int> trial_capacity = capacity;
    for (Flex& f : trial) {
      if (!f.job->has_goodput && options_.goodput.probe_trainers > 0) {
        f.hi = std::max(f.tent, std::min(f.hi, options_.goodput.probe_trainers));
      }
    }
    MaxMinFill(&trial, &trial_capacity);
    for (size_t i = 0; i < flex.size(); ++i) {
      if (flex[i].job->has_goodput) continue;
      for (const auto& [n, k] : trial[i].on) {
        auto it = flex[i].on.find(n);
        capacity[n] -= k - (it == flex[i].on.end() ? 0 : it->second);
      }
      flex[i] = std::move(trial[i]);
    }
    std::set<const PolicyJob*> moves;
    GoodputFill(&flex, &capacity, &moves);
    ApplyPacked(&flex, moves);
  }
  if (!goodput) ApplyShares(&flex);
  FillFreeSlots(&flex, goodput);
}

std::vector<ClusterPolicy::Flex> ClusterPolicy::FlexJobs(std::map<std::string, int>* capacity) {
  // Which jobs the fill may move: running elastic jobs the rate limit lets change (a job shrunk
  // for an admission earlier in this pass still may: its changes this pass are one re-form), plus
  // jobs started this pass.
  std::vector<Flex> flex;
  for (const auto& [n, node] : nodes_)
    (*capacity)[n] = node.slots - (reserved_.count(n) ? reserved_.at(n) : 0);
  for (auto& [name, job] : jobs_) {
    if (job.state != JobPhase::kRunning) continue;
    auto b = before_.find(name);
    const bool started_now = b == before_.end() || !b->second.running;
    const bool movable = job.spec.elastic && (started_now || !RateLimited(job));
    if (!movable) {
      for (const auto& [n, k] : job.placement) (*capacity)[n] -= k;
      continue;
    }
    Flex f;
    f.job = &job;
    f.hi = std::min(job.spec.max_trainers, job.cap);
    f.lo = options_.preempt ? job.spec.min_trainers : std::min(job.size, f.hi);
    f.lo = std::max(f.lo, job.spec.min_trainers);
    // Keep lo of its current trainers, from the nodes where it has most.
    std::vector<std::pair<int, std::string>> mine;
    for (const auto& [n, k] : job.placement) mine.push_back({-k, n});
    std::sort(mine.begin(), mine.end());
    int left = f.lo;
    for (const auto& [negk, n] : mine) {
      const int take = std::min(left, -negk);
      if (take > 0) f.on[n] = take;
      left -= take;
    }
    f.tent = f.lo - left;  // == lo: a running job holds at least min
    flex.push_back(std::move(f));
  }
  for (const Flex& f : flex) {
    for (const auto& [n, k] : f.on) (*capacity)[n] -= k;
  }
  return flex;
}

bool ClusterPolicy::TakeSlot(Flex* f, std::map<std::string, int>* capacity) {
  // Where it runs now (keeps trainers where they are), then more on a node it uses (keeps it
  // on few nodes), else the compatible node with the most room.
  std::map<std::string, int>& cap = *capacity;
  std::string pick;
  for (const auto& [n, k] : f->job->placement) {
    if (cap[n] > 0 && f->on[n] < k) {
      pick = n;
      break;
    }
  }
  for (const auto& [n, k] : f->on) {
    if (!pick.empty()) break;
    if (cap[n] > 0 && k > 0) pick = n;
  }
  if (pick.empty()) {
    int best = 0;
    for (const auto& [n, node] : nodes_) {
      if (cap[n] > best && node.types.count(f->job->spec.type) > 0) {
        best = cap[n];
        pick = n;
      }
    }
  }
  if (pick.empty()) return false;  // nothing left for its type
  cap[pick] -= 1;
  f->on[pick] += 1;
  f->tent += 1;
  return true;
}

void ClusterPolicy::MaxMinFill(std::vector<Flex>* flex_in, std::map<std::string, int>* capacity) {
  std::vector<Flex>& flex = *flex_in;
  // Weighted max-min fill: the next slot goes to the lowest tent/priority.
  auto worse = [&](size_t a, size_t b) {  // true when a should come after b
    const PolicyJob& ja = *flex[a].job;
    const PolicyJob& jb = *flex[b].job;
    if (flex[a].tent * jb.spec.priority != flex[b].tent * ja.spec.priority) {
      return RatioLess(flex[b].tent, jb.spec.priority, flex[a].tent, ja.spec.priority);
    }
    if (ja.spec.priority != jb.spec.priority) return ja.spec.priority < jb.spec.priority;
    return ja.seq > jb.seq;
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(worse)> heap(worse);
  for (size_t i = 0; i < flex.size(); ++i) {
    if (flex[i].tent < flex[i].hi) heap.push(i);
  }
  while (!heap.empty()) {
    const size_t i = heap.top();
    heap.pop();
    if (!TakeSlot(&flex[i], capacity)) continue;
    if (flex[i].tent < flex[i].hi) heap.push(i);
  }
}

void ClusterPolicy::ApplyShares(std::vector<Flex>* flex_in) {
  std::vector<Flex>& flex = *flex_in;
  // Shrinks first (they free the slots), then growth in fill order.
  for (Flex& f : flex) {
    if (f.tent >= f.job->size) continue;
    const std::string why = f.job->size > f.hi
                                ? "scale request " + std::to_string(f.hi)
                                : "fair share (priority " + std::to_string(f.job->spec.priority) +
                                      "): " + std::to_string(f.tent) + " trainers";
    Note(f.job->spec.name, why);
    // Exactly size - tent trainers, from the nodes the fill moved most of its trainers off.
    std::vector<std::pair<int, std::string>> excess;
    for (const auto& [n, k] : f.job->placement) {
      const int over = k - (f.on.count(n) ? f.on.at(n) : 0);
      if (over > 0) excess.push_back({-over, n});
    }
    std::sort(excess.begin(), excess.end());
    int drop = f.job->size - f.tent;
    for (const auto& [negover, n] : excess) {
      const int d = std::min(drop, -negover);
      RemoveFrom(f.job, n, d);
      drop -= d;
    }
    if (drop > 0) Shrink(f.job, drop, nullptr, why);
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < flex.size(); ++i) {
    if (flex[i].tent > flex[i].job->size) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PolicyJob& ja = *flex[a].job;
    const PolicyJob& jb = *flex[b].job;
    if (ja.spec.priority != jb.spec.priority) return ja.spec.priority > jb.spec.priority;
    return ja.seq < jb.seq;
  });
  for (size_t i : order) {
    Flex& f = flex[i];
    const std::string why = "free slots to its fair share (priority " +
                            std::to_string(f.job->spec.priority) + "): " + std::to_string(f.tent) +
                            " trainers";
    // Where the fill put it (that respects the other jobs' types), then anywhere it may run.
    int want = f.tent - f.job->size;
    for (const auto& [n, k] : f.on) {
      auto cur = f.job->placement.find(n);
      const int add =
          std::min({want, FreeOn(n), k - (cur == f.job->placement.end() ? 0 : cur->second)});
      if (add > 0) {
        PlaceOn(f.job, n, add);
        want -= add;
      }
    }
    Note(f.job->spec.name, why);
    if (want > 0) Grow(f.job, want, why);
  }
}

void ClusterPolicy::FillFreeSlots(std::vector<Flex>* flex_in, bool goodput) {
  std::vector<Flex>& flex = *flex_in;
  // The fill places slots greedily by type; where that left a slot free that a job below its
  // bound can use, it goes to the lowest size/priority of those jobs (no slot idles while an
  // elastic job could grow). Jobs the goodput fill sized take none: it left the slot free
  // because no job's goodput term rose with it.
  for (;;) {
    std::map<std::string, int> free_by_type;
    for (const auto& [n, node] : nodes_) {
      const int free = FreeOn(n);
      if (free <= 0) continue;
      for (const auto& t : node.types) free_by_type[t] += free;
    }
    if (free_by_type.empty()) break;
    Flex* best = nullptr;
    for (Flex& f : flex) {
      if (goodput && f.job->has_goodput) continue;
      if (f.job->size >= f.hi || free_by_type.count(f.job->spec.type) == 0) continue;
      if (best == nullptr ||
          RatioLess(f.job->size, f.job->spec.priority, best->job->size, best->job->spec.priority)) {
        best = &f;
      }
    }
    if (best == nullptr) break;
    Grow(best->job, 1, "free slots (priority " + std::to_string(best->job->spec.priority) + ")");
  }
}

// ---------------------------------------------------------------- placement helpers

void ClusterPolicy::PlaceOn(PolicyJob* job, const std::string& node, int k) {
  if (k <= 0) return;
  job->placement[node] += k;
  job->size += k;
  nodes_.at(node).used += k;
}

void ClusterPolicy::RemoveFrom(PolicyJob* job, const std::string& node, int k) {
  auto it = job->placement.find(node);
  if (it == job->placement.end() || k <= 0) return;
  k = std::min(k, it->second);
  it->second -= k;
  if (it->second == 0) job->placement.erase(it);
  job->size -= k;
  auto n = nodes_.find(node);
  if (n != nodes_.end()) n->second.used -= k;  // absent: the node is being removed
}

void ClusterPolicy::Grow(PolicyJob* job, int k, const std::string& why) {
  // Nodes it already uses first (most trainers first), then the compatible nodes with the most free
  // slots, then registration order.
  std::vector<std::string> cands;
  for (const auto& [n, node] : nodes_) {
    if (node.types.count(job->spec.type) > 0 && FreeOn(n) > 0) cands.push_back(n);
  }
  auto mine = [&](const std::string& n) {
    auto it = job->placement.find(n);
    return it == job->placement.end() ? 0 : it->second;
  };
  std::sort(cands.begin(), cands.end(), [&](const std::string& a, const std::string& b) {
    if (mine(a) != mine(b)) return mine(a) > mine(b);
    if (FreeOn(a) != FreeOn(b)) return FreeOn(a) > FreeOn(b);
    return nodes_.at(a).order < nodes_.at(b).order;
  });
  int placed = 0;
  for (const auto& n : cands) {
    if (placed == k) break;
    const int take = std::min(k - placed, FreeOn(n));
    PlaceOn(job, n, take);
    placed += take;
  }
  if (placed > 0) Note(job->spec.name, why);
}

void ClusterPolicy::Shrink(PolicyJob* job, int k, const std::set<std::string>* only_nodes,
                           const std::string& why) {
  // From the nodes where it has fewest trainers first, so it stays on few nodes.
  std::vector<std::pair<int, std::string>> mine;
  for (const auto& [n, c] : job->placement) {
    if (only_nodes == nullptr || only_nodes->count(n) > 0) mine.push_back({c, n});
  }
  std::sort(mine.begin(), mine.end());
  for (const auto& [c, n] : mine) {
    if (k <= 0) break;
    const int drop = std::min(k, c);
    RemoveFrom(job, n, drop);
    k -= drop;
  }
  Note(job->spec.name, why);
}

void ClusterPolicy::ReleaseAll(PolicyJob* job) {
  for (auto [n, k] : Placement(job->placement)) RemoveFrom(job, n, k);
}

int ClusterPolicy::FreeOn(const std::string& node) const {
  const Node& n = nodes_.at(node);
  auto r = reserved_.find(node);
  return n.slots - n.used - (r == reserved_.end() ? 0 : r->second);
}

bool ClusterPolicy::Offers(const std::string& node, const std::string& type) const {
  auto it = nodes_.find(node);
  return it != nodes_.end() && it->second.types.count(type) > 0;
}

int ClusterPolicy::TypeCapacity(const std::string& type) const {
  int total = 0;
  for (const auto& [n, node] : nodes_) {
    if (node.types.count(type) > 0) total += node.slots;
  }
  return total;
}

bool ClusterPolicy::RateLimited(const PolicyJob& job) const {
  if (options_.min_change_interval_us <= 0 || job.last_change_us < 0) return false;
  if (exempt_.count(job.spec.name) > 0) return false;
  return clock_->NowMicros() - job.last_change_us < options_.min_change_interval_us;
}

void ClusterPolicy::SetPending(PolicyJob* job, const std::string& code, const std::string& reason) {
  job->pending_reason = reason;
  if (job->pending_code == code) return;
  job->pending_code = code;
  PolicyEvent e;
  e.time_us = clock_->NowMicros();
  e.kind = "pending";
  e.job = job->spec.name;
  e.reason = reason;
  events_.push_back(std::move(e));
}

void ClusterPolicy::Note(const std::string& job, const std::string& why) {
  reasons_[job].push_back(why);
}

void ClusterPolicy::EmitNodeEvent(const std::string& kind, const std::string& node,
                                  const std::string& reason) {
  PolicyEvent e;
  e.time_us = clock_->NowMicros();
  e.kind = kind;
  e.node = node;
  e.reason = reason;
  events_.push_back(std::move(e));
}

std::vector<PolicyJob*> ClusterPolicy::Ordered(JobPhase state) {
  std::vector<PolicyJob*> out;
  for (auto& [name, job] : jobs_) {
    if (job.state == state) out.push_back(&job);
  }
  const bool by_priority = options_.priority_order;
  std::sort(out.begin(), out.end(), [by_priority](PolicyJob* a, PolicyJob* b) {
    if (by_priority) {
      if (a->spec.priority != b->spec.priority) return a->spec.priority > b->spec.priority;
      const int64_t da = a->spec.deadline_us > 0 ? a->spec.deadline_us : INT64_MAX;
      const int64_t db = b->spec.deadline_us > 0 ? b->spec.deadline_us : INT64_MAX;
      if (da != db) return da < db;
    }
    return a->seq < b->seq;
  });
  return out;
}

// ---------------------------------------------------------------- state

const PolicyJob* ClusterPolicy::Find(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

int ClusterPolicy::total_slots() const {
  int t = 0;
  for (const auto& [n, node] : nodes_) t += node.slots;
  return t;
}

int ClusterPolicy::used_slots() const {
  int t = 0;
  for (const auto& [n, node] : nodes_) t += node.used;
  return t;
}

int ClusterPolicy::FreeSlots(const std::string& type) const {
  int t = 0;
  for (const auto& [n, node] : nodes_) {
    if (node.types.count(type) > 0) t += node.slots - node.used;
  }
  return t;
}

int ClusterPolicy::pending_jobs() const {
  int c = 0;
  for (const auto& [n, job] : jobs_) c += job.state == JobPhase::kPending;
  return c;
}

int ClusterPolicy::running_jobs() const { return static_cast<int>(jobs_.size()) - pending_jobs(); }

std::string ClusterPolicy::RunningTrainers() const {
  std::vector<const PolicyJob*> all;
  for (const auto& [n, job] : jobs_) all.push_back(&job);
  std::sort(all.begin(), all.end(),
            [](const PolicyJob* a, const PolicyJob* b) { return a->seq < b->seq; });
  std::vector<std::string> parts;
  for (const PolicyJob* j : all) parts.push_back(j->spec.name + ":" + std::to_string(j->size));
  return Join(parts, "|");
}

nlohmann::json ClusterPolicy::Summary() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& [name, job] : jobs_) {
    jobs.push_back({{"name", name},
                    {"type", job.spec.type},
                    {"state", job.state == JobPhase::kRunning ? "running" : "pending"},
                    {"size", job.size},
                    {"min", job.spec.min_trainers},
                    {"max", job.spec.max_trainers},
                    {"cap", job.cap},
                    {"priority", job.spec.priority},
                    {"elastic", job.spec.elastic},
                    {"placement", job.placement},
                    {"pending_reason", job.pending_reason}});
    if (std::string note = GoodputNote(job); !note.empty()) jobs.back()["goodput"] = note;
  }
  return {{"submitted_jobs", jobs_.size()},        {"pending_jobs", pending_jobs()},
          {"total_slots", total_slots()},          {"used_slots", used_slots()},
          {"running_trainers", RunningTrainers()}, {"jobs", jobs}};
}

Status ClusterPolicy::CheckInvariants() const {
  std::map<std::string, int> used;
  for (const auto& [name, job] : jobs_) {
    int size = 0;
    for (const auto& [n, k] : job.placement) {
      auto node = nodes_.find(n);
      if (node == nodes_.end()) return Status::Internal("job " + name + " is on lost node " + n);
      if (node->second.types.count(job.spec.type) == 0) {
        return Status::Internal("job " + name + " is on node " + n + ", which lacks type " +
                                job.spec.type);
      }
      if (k <= 0)
        return Status::Internal("job " + name + " holds " + std::to_string(k) + " on " + n);
      size += k;
      used[n] += k;
    }
    if (size != job.size) return Status::Internal("job " + name + " size disagrees with placement");
    if (job.state == JobPhase::kPending && job.size != 0) {
      return Status::Internal("pending job " + name + " holds trainers");
    }
    if (job.state == JobPhase::kRunning) {
      if (!job.spec.elastic && job.size != job.spec.max_trainers) {
        return Status::Internal("restart-mode job " + name + " runs at " +
                                std::to_string(job.size) + ", not its fixed " +
                                std::to_string(job.spec.max_trainers));
      }
      if (job.size < job.spec.min_trainers || job.size > job.spec.max_trainers) {
        return Status::Internal("running job " + name + " holds " + std::to_string(job.size) +
                                ", outside " + std::to_string(job.spec.min_trainers) + ".." +
                                std::to_string(job.spec.max_trainers));
      }
    }
  }
  for (const auto& [n, node] : nodes_) {
    const int u = used.count(n) ? used.at(n) : 0;
    if (u != node.used) return Status::Internal("node " + n + " usage count is stale");
    if (u > node.slots) {
      return Status::Internal("node " + n + " holds " + std::to_string(u) + " trainers on " +
                              std::to_string(node.slots) + " slots");
    }
  }
  return Status::OK();
}

}  // namespace edl::jobserver
