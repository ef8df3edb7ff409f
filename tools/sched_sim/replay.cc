#include "tools/sched_sim/replay.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <tuple>

#include "edl/base/clock.h"

namespace edl::schedsim {

namespace {

using jobserver::BatchChoice;
using jobserver::GoodputModel;

constexpr char kGpuType[] = "gpu";
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
// A replay that runs this long has gone wrong (the longest reference job takes under a day).
constexpr double kMaxSimulatedS = 1e8;

int64_t Micros(double s) { return static_cast<int64_t>(std::llround(s * 1e6)); }

std::string NodeName(int i) {
  std::string s = std::to_string(i);
  return "node" + std::string(s.size() < 4 ? 4 - s.size() : 0, '0') + s;
}

// Each job's trainer bounds under the scheduler.
struct Bounds {
  int min = 1, max = 1;
};

// ---------------------------------------------------------------- allocators

// Decides placements. The replay calls Submit at a job's arrival, Finish at its completion and
// Tick every interval, then reads every live job's placement.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Status Submit(size_t job) = 0;
  virtual Status Finish(size_t job) = 0;
  virtual Status Tick() = 0;
  virtual Status Report(size_t /*job*/, const GoodputModel& /*model*/) { return Status::OK(); }
  // Trainers of `job` per node (all zero: not running).
  virtual void PlacementOf(size_t job, std::vector<int>* per_node) const = 0;
};

// kGoodput and kFairShare: the real jobserver::ClusterPolicy.
class PolicyAllocator : public Allocator {
 public:
  PolicyAllocator(const Workload& w, std::vector<Bounds> bounds, const ReplayOptions& o,
                  ManualClock* clock)
      : w_(w), bounds_(std::move(bounds)), o_(o), policy_(PolicyOptions(o), clock) {}

  Status Init() {
    for (int i = 0; i < o_.nodes; ++i) {
      index_[NodeName(i)] = i;
      EDL_RETURN_IF_ERROR(policy_.AddNode({NodeName(i), o_.gpus_per_node, {kGpuType}}));
    }
    return Drain();
  }
  Status Submit(size_t j) override {
    jobserver::JobSubmission s;
    s.name = w_.jobs[j].name;
    s.type = kGpuType;
    s.min_trainers = bounds_[j].min;
    s.max_trainers = bounds_[j].max;
    EDL_RETURN_IF_ERROR(policy_.Submit(s));
    return Drain();
  }
  Status Finish(size_t j) override {
    EDL_RETURN_IF_ERROR(policy_.Finish(w_.jobs[j].name));
    return Drain();
  }
  Status Tick() override {
    policy_.Tick();
    return Drain();
  }
  Status Report(size_t j, const GoodputModel& m) override {
    return policy_.ReportGoodput(w_.jobs[j].name, m);
  }
  void PlacementOf(size_t j, std::vector<int>* per_node) const override {
    per_node->assign(o_.nodes, 0);
    const jobserver::PolicyJob* pj = policy_.Find(w_.jobs[j].name);
    if (pj == nullptr) return;
    for (const auto& [node, k] : pj->placement) (*per_node)[index_.at(node)] = k;
  }

 private:
  static jobserver::ClusterPolicyOptions PolicyOptions(const ReplayOptions& o) {
    jobserver::ClusterPolicyOptions po;
    po.kind = o.scheduler == Scheduler::kGoodput ? jobserver::PolicyKind::kGoodput
                                                 : jobserver::PolicyKind::kFairShare;
    po.goodput = o.goodput;
    po.min_change_interval_us = Micros(o.min_change_interval_s);
    return po;
  }
  // The decision log, and the invariants after every input.
  Status Drain() {
    for (const jobserver::PolicyEvent& e : policy_.TakeEvents()) {
      if (o_.event_log != nullptr) *o_.event_log << e.ToJson().dump() << "\n";
    }
    return policy_.CheckInvariants();
  }

  const Workload& w_;
  const std::vector<Bounds> bounds_;
  const ReplayOptions& o_;
  jobserver::ClusterPolicy policy_;
  std::map<std::string, int> index_;
};

// Shared by kTiresias and kEasy: fixed-size jobs on a pool of nodes; a job started gets the GPUs
// of the nodes with most free ones first (lowest index on a tie).
class FixedSizeAllocator : public Allocator {
 public:
  FixedSizeAllocator(const Workload& w, const ReplayOptions& o)
      : w_(w), o_(o), free_(o.nodes, o.gpus_per_node), on_(w.jobs.size()) {}
  void PlacementOf(size_t j, std::vector<int>* per_node) const override {
    *per_node = on_[j].empty() ? std::vector<int>(o_.nodes, 0) : on_[j];
  }

 protected:
  int FreeGpus() const {
    int f = 0;
    for (int x : free_) f += x;
    return f;
  }
  void Start(size_t j) {
    std::vector<int>& on = on_[j];
    on.assign(o_.nodes, 0);
    int need = w_.jobs[j].replicas;
    while (need > 0) {
      const int n = static_cast<int>(std::max_element(free_.begin(), free_.end()) - free_.begin());
      const int take = std::min(need, free_[n]);
      if (take <= 0) break;  // REQUIRES of the callers: it fits
      free_[n] -= take;
      on[n] += take;
      need -= take;
    }
  }
  void Stop(size_t j) {
    for (int n = 0; n < static_cast<int>(on_[j].size()); ++n) free_[n] += on_[j][n];
    on_[j].clear();
  }
  bool Running(size_t j) const { return !on_[j].empty(); }

  const Workload& w_;
  const ReplayOptions& o_;
  std::vector<int> free_;             // per node
  std::vector<std::vector<int>> on_;  // per job: trainers per node; empty when not running
};

class TiresiasAllocator : public FixedSizeAllocator {
 public:
  TiresiasAllocator(const Workload& w, const ReplayOptions& o, const ManualClock* clock)
      : FixedSizeAllocator(w, o), clock_(clock), st_(w.jobs.size()) {}

  Status Submit(size_t j) override {  // seen at the next interval
    arrived_.push_back(j);
    return Status::OK();
  }
  Status Finish(size_t j) override {  // its GPUs wait for the next interval
    Stop(j);
    st_[j].done = true;
    return Status::OK();
  }
  Status Tick() override {
    const int64_t now = clock_->NowMicros();
    for (size_t j : arrived_) {
      st_[j].known = true;
      st_[j].seq = next_seq_++;
      st_[j].last_us = now;
    }
    arrived_.clear();
    std::vector<size_t> live;
    for (size_t j = 0; j < st_.size(); ++j) {
      State& s = st_[j];
      if (!s.known || s.done) continue;
      if (Running(j)) {
        s.executed_s += (now - s.last_us) * 1e-6;
        if (s.queue == 0 && s.executed_s * w_.jobs[j].replicas >= o_.tiresias_threshold_gpu_s) {
          s.queue = 1;  // demoted: to the end of the second queue
          s.seq = next_seq_++;
        }
      }
      s.last_us = now;
      live.push_back(j);
    }
    std::sort(live.begin(), live.end(), [&](size_t a, size_t b) {
      return std::tie(st_[a].queue, st_[a].seq) < std::tie(st_[b].queue, st_[b].seq);
    });
    // Which run: walk the queues, each job runs if its GPUs fit in what is left.
    int left = o_.nodes * o_.gpus_per_node;
    std::vector<size_t> starts;
    for (size_t j : live) {
      if (w_.jobs[j].replicas <= left) {
        left -= w_.jobs[j].replicas;
        if (!Running(j)) starts.push_back(j);
      } else if (Running(j)) {
        Stop(j);  // preempted
      }
    }
    for (size_t j : starts) Start(j);
    return Status::OK();
  }

 private:
  struct State {
    bool known = false, done = false;
    int queue = 0;
    uint64_t seq = 0;
    double executed_s = 0;  // wall seconds run (its GPUs times this: attained service)
    int64_t last_us = 0;
  };
  const ManualClock* const clock_;  // the replay's; outlives the allocator
  std::vector<State> st_;
  std::vector<size_t> arrived_;
  uint64_t next_seq_ = 1;
};

class EasyAllocator : public FixedSizeAllocator {
 public:
  // run_s[j]: job j's run time at its GPUs, start included, known in advance.
  EasyAllocator(const Workload& w, const ReplayOptions& o, const ManualClock* clock,
                std::vector<double> run_s)
      : FixedSizeAllocator(w, o), clock_(clock), run_s_(std::move(run_s)), end_us_(w.jobs.size()) {}

  Status Submit(size_t j) override {
    queue_.push_back(j);
    Schedule();
    return Status::OK();
  }
  Status Finish(size_t j) override {
    Stop(j);
    running_.erase(std::find(running_.begin(), running_.end(), j));
    Schedule();
    return Status::OK();
  }
  Status Tick() override {
    Schedule();
    return Status::OK();
  }

 private:
  void Run(size_t j) {
    Start(j);
    running_.push_back(j);
    end_us_[j] = clock_->NowMicros() + Micros(run_s_[j]);
  }
  void Schedule() {
    const int64_t now = clock_->NowMicros();
    while (!queue_.empty() && w_.jobs[queue_.front()].replicas <= FreeGpus()) {
      Run(queue_.front());
      queue_.pop_front();
    }
    if (queue_.empty()) return;
    // The head's reservation: the earliest end after which enough GPUs are free (shadow), and
    // the GPUs it leaves spare then (extra).
    const int need = w_.jobs[queue_.front()].replicas;
    std::vector<std::pair<int64_t, int>> ends;
    for (size_t j : running_) ends.emplace_back(end_us_[j], w_.jobs[j].replicas);
    std::sort(ends.begin(), ends.end());
    int avail = FreeGpus();
    int64_t shadow = now;
    for (const auto& [end, gpus] : ends) {
      if (avail >= need) break;
      avail += gpus;
      shadow = end;
    }
    int extra = avail - need;
    for (auto it = queue_.begin() + 1; it != queue_.end();) {
      const size_t j = *it;
      const int req = w_.jobs[j].replicas;
      const bool ends_first = now + Micros(run_s_[j]) <= shadow;
      if (req <= FreeGpus() && (ends_first || req <= extra)) {
        if (!ends_first) extra -= req;
        Run(j);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const ManualClock* const clock_;  // the replay's; outlives the allocator
  const std::vector<double> run_s_;
  std::vector<int64_t> end_us_;
  std::deque<size_t> queue_;
  std::vector<size_t> running_;
};

// ---------------------------------------------------------------- the replay

struct SimJob {
  const WorkloadJob* spec = nullptr;
  const AppTrace* app = nullptr;
  Bounds bounds;
  bool adaptive = false;  // kGoodput: picks its batch by its fitted model
  bool arrived = false, done = false;
  std::vector<int> per_node;
  int trainers = 0, nodes = 0;
  BatchChoice batch;
  int epoch = 0;
  double progress = 0;
  double rate = 0;  // progress per second outside a stall
  int64_t stall_until_us = 0;
  // kGoodput: a configuration it has not measured yet (measured once its stall is over), what it
  // measured, and its model.
  bool learn_pending = false;
  std::map<std::tuple<int, int, int>, jobserver::StepMeasurement> measured;
  GoodputModel model;
};

class Replayer {
 public:
  Replayer(const Workload& w, const std::map<std::string, AppTrace>& apps, const ReplayOptions& o,
           ReplayResult* out)
      : w_(w), apps_(apps), o_(o), out_(out), clock_(0) {}

  Status Run();

 private:
  Status Init();
  int64_t NextEventUs(int64_t next_arrival, int64_t next_tick) const;
  void Advance(int64_t to);
  Status EndEpochs();
  Status Apply();
  void Adapt(SimJob* job);
  bool Learn(SimJob* job);
  Status LearnAll();
  void Measure(SimJob* job);
  double ReformSeconds(const SimJob& job, int from) const;
  double StepSecondsNow(const SimJob& job) const;
  void UpdateRate(SimJob* job);
  Status ReportModel(size_t j);
  double RunSecondsAlone(const SimJob& job) const;

  const Workload& w_;
  const std::map<std::string, AppTrace>& apps_;
  const ReplayOptions& o_;
  ReplayResult* out_;
  ManualClock clock_;
  std::vector<SimJob> jobs_;
  std::unique_ptr<Allocator> alloc_;
  size_t done_ = 0;
};

Status Replayer::Init() {
  const ReplayOptions& o = o_;
  if (o.nodes < 1 || o.nodes > 10000 || o.gpus_per_node < 1 || o.gpus_per_node > 9 ||
      !(o.interval_s >= 1) || !(o.start_s >= 0) || !(o.reform_fixed_s >= 0) ||
      !(o.reform_grow_steps >= 0) || !(o.reform_shrink_steps >= 0) ||
      !(o.min_change_interval_s >= 0) || o.max_trainers < 1 || !(o.goodput.fairness_power < 1) ||
      !(o.goodput.explore_factor >= 1) || !(o.goodput.min_horizon_s >= 0) ||
      !(o.tiresias_threshold_gpu_s >= 0) || !(o.goodput.service_power >= 0) ||
      !(o.goodput.service_scale_s > 0) ||
      !(o.goodput.service_floor >= 0 && o.goodput.service_floor <= 1) ||
      o.goodput.probe_trainers < 0) {
    return Status::InvalidArgument(
        "replay options: need 1 <= nodes <= 10000, 1 <= GPUs per node <= 9 (a placement is "
        "keyed by one digit per node), interval >= 1 s, non-negative times and step counts, "
        "max_trainers >= 1, fairness power < 1, explore factor >= 1, service power >= 0, "
        "service scale > 0, service floor in 0..1, probe trainers >= 0");
  }
  const int total = o.nodes * o.gpus_per_node;
  out_->jobs.resize(w_.jobs.size());
  jobs_.resize(w_.jobs.size());
  std::vector<Bounds> bounds(w_.jobs.size());
  std::vector<double> run_s(w_.jobs.size());
  for (size_t j = 0; j < w_.jobs.size(); ++j) {
    const WorkloadJob& wj = w_.jobs[j];
    SimJob& job = jobs_[j];
    job.spec = &wj;
    auto app = apps_.find(wj.app);
    if (app == apps_.end()) {
      return Status::InvalidArgument("job " + wj.name + ": no traces of application " + wj.app);
    }
    job.app = &app->second;
    if (wj.replicas > total) {
      return Status::FailedPrecondition("job " + wj.name + " asks for " +
                                        std::to_string(wj.replicas) + " GPUs; the cluster has " +
                                        std::to_string(total));
    }
    const jobserver::BatchLimits& lim = job.app->limits();
    switch (o.scheduler) {
      case Scheduler::kGoodput:
        job.adaptive = true;
        job.bounds = {1, std::max(1, std::min({o.max_trainers, total,
                                               lim.max_batch / std::max(1, lim.min_local)}))};
        break;
      case Scheduler::kFairShare:
        job.bounds = {1, wj.replicas};
        break;
      case Scheduler::kTiresias:
      case Scheduler::kEasy:
        job.bounds = {wj.replicas, wj.replicas};
        break;
    }
    job.per_node.assign(o.nodes, 0);
    bounds[j] = job.bounds;
    JobResult& r = out_->jobs[j];
    r.name = wj.name;
    r.arrival_s = wj.arrival_s;
    if (o.scheduler == Scheduler::kEasy) run_s[j] = RunSecondsAlone(job);
  }
  switch (o.scheduler) {
    case Scheduler::kGoodput:
    case Scheduler::kFairShare: {
      auto p = std::make_unique<PolicyAllocator>(w_, bounds, o, &clock_);
      EDL_RETURN_IF_ERROR(p->Init());
      alloc_ = std::move(p);
      break;
    }
    case Scheduler::kTiresias:
      alloc_ = std::make_unique<TiresiasAllocator>(w_, o, &clock_);
      break;
    case Scheduler::kEasy:
      alloc_ = std::make_unique<EasyAllocator>(w_, o, &clock_, std::move(run_s));
      break;
  }
  return Status::OK();
}

// The EASY reservations' run time: start, then every epoch at the user's GPUs on the fewest nodes.
double Replayer::RunSecondsAlone(const SimJob& job) const {
  std::vector<int> compact;
  for (int left = job.spec->replicas; left > 0; left -= o_.gpus_per_node) {
    compact.push_back(std::min(left, o_.gpus_per_node));
  }
  const BatchChoice b =
      jobserver::FixedBatch(job.app->limits(), job.spec->batch, job.spec->replicas);
  const double step = job.app->StepSeconds(compact, b.local_batch, b.accum_steps);
  double s = o_.start_s;
  for (int e = 0; e < job.app->max_epochs(); ++e) {
    const double work = job.app->EpochEnd(e) - (e == 0 ? 0 : job.app->EpochEnd(e - 1));
    s += work / job.app->Gain(b.total_batch, e) * step;
  }
  return s;
}

double Replayer::StepSecondsNow(const SimJob& job) const {
  return job.app->StepSeconds(job.per_node, job.batch.local_batch, job.batch.accum_steps);
}

void Replayer::UpdateRate(SimJob* job) {
  job->rate = 0;
  if (job->trainers == 0 || job->batch.total_batch <= 0) return;
  const double step = StepSecondsNow(*job);
  if (step > 0) job->rate = job->app->Gain(job->batch.total_batch, job->epoch) / step;
}

void Replayer::Measure(SimJob* job) {
  const auto key = std::make_tuple(job->nodes, job->trainers, job->batch.local_batch);
  if (job->measured.count(key) > 0) return;
  const StepTime t = job->app->Step(job->per_node, job->batch.local_batch);
  jobserver::StepMeasurement m;
  m.nodes = job->nodes;
  m.trainers = job->trainers;
  m.local_batch = job->batch.local_batch;
  m.step_s = t.step_s;
  m.sync_s = t.sync_s;
  job->measured[key] = m;
  std::vector<jobserver::StepMeasurement> all;
  for (const auto& [k, v] : job->measured) all.push_back(v);
  jobserver::ThroughputParams p;
  if (jobserver::FitThroughput(all, &p).ok()) {
    job->model.throughput = p;
    job->model.measured_trainers = std::max(job->model.measured_trainers, job->trainers);
  }
}

// The batch for the job's placement: its own (kGoodput: the best by its model) or the user's.
void Replayer::Adapt(SimJob* job) {
  const jobserver::BatchLimits& lim = job->app->limits();
  if (job->trainers == 0) return;
  if (!job->adaptive) {
    job->batch = jobserver::FixedBatch(lim, job->spec->batch, job->trainers);
    return;
  }
  BatchChoice b;
  if (job->model.measured_trainers > 0) {
    b = jobserver::BestBatch(job->model, job->nodes, job->trainers);
  }
  if (b.goodput <= 0) b = jobserver::SmallestBatch(lim, job->trainers);
  job->batch = b;
}

// kGoodput, once a job runs steps on a new configuration (its start or re-form is over): it
// measures them, refits, and takes the batch its new model picks (measuring that too: a few
// steps more). True when its model changed.
bool Replayer::Learn(SimJob* job) {
  if (!job->adaptive || job->trainers == 0 || !job->learn_pending ||
      clock_.NowMicros() < job->stall_until_us) {
    return false;
  }
  job->learn_pending = false;
  bool changed = false;
  for (int round = 0; round < 3; ++round) {
    const auto key = std::make_tuple(job->nodes, job->trainers, job->batch.local_batch);
    if (job->measured.count(key) > 0) break;
    Measure(job);
    changed = true;
    Adapt(job);
  }
  return changed;
}

double Replayer::ReformSeconds(const SimJob& job, int from) const {
  if (o_.reform == ReformCost::kFixed) return o_.reform_fixed_s;
  const double steps = job.trainers < from ? o_.reform_shrink_steps : o_.reform_grow_steps;
  return steps * StepSecondsNow(job);
}

Status Replayer::ReportModel(size_t j) {
  SimJob& job = jobs_[j];
  if (!job.adaptive || job.trainers == 0) return Status::OK();
  const GradStats g = job.app->Grad(job.batch.total_batch, job.epoch);
  const double base = job.app->limits().base_batch;
  job.model.noise_scale = g.sqr > 0 ? base * g.var / g.sqr : 1e12;
  job.model.batch = job.app->limits();
  job.model.reform_s = o_.reform == ReformCost::kFixed ? o_.reform_fixed_s
                                                       : o_.reform_grow_steps * StepSecondsNow(job);
  return alloc_->Report(j, job.model);
}

int64_t Replayer::NextEventUs(int64_t next_arrival, int64_t next_tick) const {
  int64_t t = std::min(next_arrival, next_tick);
  const int64_t now = clock_.NowMicros();
  for (const SimJob& job : jobs_) {
    if (job.learn_pending && job.adaptive && job.trainers > 0 && job.stall_until_us > now) {
      t = std::min(t, job.stall_until_us);
    }
    if (!job.arrived || job.done || job.rate <= 0) continue;
    const double left = std::max(0.0, job.app->EpochEnd(job.epoch) - job.progress);
    const int64_t from = std::max(now, job.stall_until_us);
    t = std::min(t, from + static_cast<int64_t>(std::ceil(left / job.rate * 1e6)));
  }
  return t;
}

void Replayer::Advance(int64_t to) {
  const int64_t now = clock_.NowMicros();
  for (size_t j = 0; j < jobs_.size(); ++j) {
    SimJob& job = jobs_[j];
    if (!job.arrived || job.done || job.trainers == 0) continue;
    const int64_t from = std::max(now, job.stall_until_us);
    if (to > from) job.progress += (to - from) * 1e-6 * job.rate;
    out_->stall_s += (std::min(to, job.stall_until_us) - std::min(now, job.stall_until_us)) * 1e-6;
    out_->jobs[j].gpu_s += job.trainers * (to - now) * 1e-6;
  }
  clock_.Advance(to - now);
}

Status Replayer::EndEpochs() {
  const double now_s = clock_.NowMicros() * 1e-6;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    SimJob& job = jobs_[j];
    if (!job.arrived || job.done || job.trainers == 0) continue;
    const double end = job.app->EpochEnd(job.epoch);
    if (job.progress < end * (1 - 1e-12)) continue;
    job.progress = end;
    ++job.epoch;
    if (job.epoch >= job.app->max_epochs()) {
      job.done = true;
      job.trainers = 0;
      job.rate = 0;
      job.per_node.assign(o_.nodes, 0);
      out_->jobs[j].finish_s = now_s;
      ++done_;
      ++out_->decisions;
      EDL_RETURN_IF_ERROR(alloc_->Finish(j));
      continue;
    }
    Adapt(&job);  // a new epoch's noise scale may call for another batch
    UpdateRate(&job);
    EDL_RETURN_IF_ERROR(ReportModel(j));
  }
  return Status::OK();
}

Status Replayer::LearnAll() {
  for (size_t j = 0; j < jobs_.size(); ++j) {
    SimJob& job = jobs_[j];
    if (job.done || !Learn(&job)) continue;
    UpdateRate(&job);
    EDL_RETURN_IF_ERROR(ReportModel(j));
  }
  return Status::OK();
}

Status Replayer::Apply() {
  const int64_t now = clock_.NowMicros();
  std::vector<int> used(o_.nodes, 0);
  std::vector<int> to;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    SimJob& job = jobs_[j];
    if (!job.arrived || job.done) continue;
    alloc_->PlacementOf(j, &to);
    int trainers = 0, nodes = 0;
    for (int n = 0; n < o_.nodes; ++n) {
      trainers += to[n];
      nodes += to[n] > 0;
      used[n] += to[n];
    }
    if (trainers > 0 && (trainers < job.bounds.min || trainers > job.bounds.max)) {
      return Status::Internal("job " + job.spec->name + " placed on " + std::to_string(trainers) +
                              " GPUs, outside its bounds " + std::to_string(job.bounds.min) + ".." +
                              std::to_string(job.bounds.max));
    }
    if (to == job.per_node) continue;
    JobResult& r = out_->jobs[j];
    const int from = job.trainers;
    job.per_node = to;
    job.trainers = trainers;
    job.nodes = nodes;
    job.learn_pending = true;
    Adapt(&job);
    if (from == 0 && trainers > 0) {
      job.stall_until_us = now + Micros(o_.start_s);
      if (r.start_s < 0) r.start_s = now * 1e-6;
    } else if (trainers == 0) {
      ++r.preemptions;
      ++out_->preemptions;
    } else {
      job.stall_until_us = std::max(job.stall_until_us, now + Micros(ReformSeconds(job, from)));
      ++r.reallocations;
      ++out_->reallocations;
    }
    UpdateRate(&job);
    EDL_RETURN_IF_ERROR(ReportModel(j));
  }
  for (int n = 0; n < o_.nodes; ++n) {
    if (used[n] > o_.gpus_per_node) {
      return Status::Internal("node " + std::to_string(n) + " holds " + std::to_string(used[n]) +
                              " trainers on " + std::to_string(o_.gpus_per_node) + " GPUs");
    }
  }
  return Status::OK();
}

Status Replayer::Run() {
  EDL_RETURN_IF_ERROR(Init());
  const size_t n = jobs_.size();
  size_t next = 0;
  int64_t next_tick = Micros(o_.interval_s);
  int idle_ticks = 0;
  while (done_ < n) {
    const int64_t arrival = next < n ? Micros(w_.jobs[next].arrival_s) : kNever;
    const int64_t t = NextEventUs(arrival, next_tick);
    if (t * 1e-6 > kMaxSimulatedS) {
      return Status::FailedPrecondition(
          "replay of " + w_.name + " passed " + std::to_string(kMaxSimulatedS) +
          " simulated seconds with " + std::to_string(n - done_) + " jobs unfinished");
    }
    Advance(t);
    EDL_RETURN_IF_ERROR(EndEpochs());
    EDL_RETURN_IF_ERROR(LearnAll());
    while (next < n && Micros(w_.jobs[next].arrival_s) <= t) {
      jobs_[next].arrived = true;
      ++out_->decisions;
      EDL_RETURN_IF_ERROR(alloc_->Submit(next++));
    }
    const bool tick = t >= next_tick;
    if (tick) {
      ++out_->decisions;
      EDL_RETURN_IF_ERROR(alloc_->Tick());
      next_tick += Micros(o_.interval_s);
    }
    EDL_RETURN_IF_ERROR(Apply());
    // Nothing running, nothing left to arrive, jobs left: they can never run.
    bool running = false;
    for (const SimJob& job : jobs_) running = running || (!job.done && job.trainers > 0);
    if (running || next < n) {
      idle_ticks = 0;
    } else if (tick) {
      ++idle_ticks;
    }
    if (idle_ticks > 2 && done_ < n) {
      return Status::FailedPrecondition("replay of " + w_.name + ": " + std::to_string(n - done_) +
                                        " jobs wait and none runs: they can never be placed");
    }
  }
  std::map<std::string, double> jcts;
  double gpu_s = 0;
  for (const JobResult& r : out_->jobs) {
    jcts[r.name] = r.finish_s - r.arrival_s;
    gpu_s += r.gpu_s;
  }
  EDL_RETURN_IF_ERROR(FiguresOf(w_, jcts, &out_->figures));
  out_->figures.gpu_hours = gpu_s / 3600;
  return Status::OK();
}

}  // namespace

Status Replay(const Workload& w, const std::map<std::string, AppTrace>& apps,
              const ReplayOptions& options, ReplayResult* out) {
  *out = ReplayResult();
  return Replayer(w, apps, options, out).Run();
}

}  // namespace edl::schedsim
