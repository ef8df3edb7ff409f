// The cluster policy's step 3' (cluster_policy.h, docs/SCHEDULING.md): slots by goodput for the
// jobs that reported a goodput model, and the input that records those models.
#include <algorithm>
#include <cmath>
#include <set>

#include "jobserver/policy/cluster_policy.h"

namespace edl::jobserver {

namespace {

// One job's term in the pass's objective: priority * (s^p - 1) / p over its speedup s, or
// priority * log(s) at p = 0. Increasing in s for every p < 1.
double SpeedupTerm(double speedup, double power, int priority) {
  const double s = std::max(speedup, 1e-9);
  if (std::abs(power) < 1e-9) return priority * std::log(s);
  return priority * (std::pow(s, power) - 1) / power;
}

}  // namespace

Status ClusterPolicy::ReportGoodput(const std::string& name, const GoodputModel& model) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return Status::NotFound("job " + name + " is not pending or running");
  PolicyJob& job = it->second;
  const bool running_goodput =
      options_.kind == PolicyKind::kGoodput && job.state == JobPhase::kRunning;
  if (model.measured_trainers == 0) {  // withdrawn: back to the fair share
    const bool had = job.has_goodput;
    job.goodput = GoodputModel{};
    job.has_goodput = false;
    job.goodput_curve.clear();
    if (had && running_goodput) {
      BeginPass();
      RunPass();
    }
    return Status::OK();
  }
  EDL_RETURN_IF_ERROR(
      CheckGoodputModel("goodput model of job " + name, model, job.spec.min_trainers));
  const bool news = model.measured_trainers > (job.has_goodput ? job.goodput.measured_trainers : 0);
  job.goodput = model;
  job.has_goodput = model.measured_trainers > 0;
  job.goodput_curve.clear();
  if (news && running_goodput) {
    BeginPass();  // a first model, or a larger size measured: what the job may get changed
    RunPass();
  }
  return Status::OK();
}

std::string ClusterPolicy::GoodputNote(const PolicyJob& job) const {
  if (options_.kind != PolicyKind::kGoodput || !job.spec.elastic) return "";
  if (!job.has_goodput) {
    return "no goodput model yet: fair share until its trainers report step times and gradient "
           "statistics";
  }
  return "goodput model, measured at up to " + std::to_string(job.goodput.measured_trainers) +
         " trainers";
}

double ClusterPolicy::CurveAt(PolicyJob* job, int n) {
  // Nodes are assumed filled one after the other: n trainers span ceil(n / S) nodes of the
  // largest size S offering the job's type (the placement step 4 packs toward).
  std::vector<double>& curve = job->goodput_curve;
  if (curve.empty()) {
    int node_slots = 1;
    for (const auto& [name, node] : nodes_) {
      if (node.types.count(job->spec.type) > 0) node_slots = std::max(node_slots, node.slots);
    }
    job->curve_node_slots = node_slots;
    curve.assign(job->spec.max_trainers + 1, -1.0);
    curve[0] = 0;
  }
  if (n < 0 || n >= static_cast<int>(curve.size())) return 0;
  if (curve[n] < 0) {
    const int s = job->curve_node_slots;
    curve[n] = BestBatch(job->goodput, (n + s - 1) / s, n).goodput;
  }
  return curve[n];
}

void ClusterPolicy::GoodputFill(std::vector<Flex>* flex, std::map<std::string, int>* capacity,
                                std::set<const PolicyJob*>* moves) {
  const GoodputPolicyOptions& o = options_.goodput;
  const int64_t now = clock_->NowMicros();
  const int fair = std::max(1, total_slots() / std::max(1, running_jobs()));
  struct Term {
    Flex* f;
    double ref = 1;     // G at the fair share: speedup 1
    double keep = 1;    // the share of the horizon a re-form leaves for progress
    int current = -1;   // size before the pass (no re-form cost at it); -1: started now
    double stay = 0;    // G at its current size where it runs now
    int top = 0;        // the most trainers the pass gives it
    int chunk = 1;      // slots on one node of its type
    double weight = 1;  // priority, tilted toward least attained service
  };
  std::vector<Term> terms;
  for (Flex& f : *flex) {
    PolicyJob* job = f.job;
    if (!job->has_goodput) continue;
    Term t;
    t.f = &f;
    const int last = std::min(job->spec.max_trainers, TypeCapacity(job->spec.type));
    const double trusted = o.explore_factor * job->goodput.measured_trainers;
    t.top = std::min({f.hi, last, static_cast<int>(std::min(trusted, 1e9))});
    t.top = std::max(t.top, f.tent);
    t.ref = CurveAt(job, std::clamp(fair, std::min(1, last), last));
    for (int n = 1; !(t.ref > 0) && n <= t.top; ++n) t.ref = CurveAt(job, n);
    if (!(t.ref > 0)) continue;  // no batch fits any size it may run: it stays at lo
    auto b = before_.find(job->spec.name);
    if (b != before_.end() && b->second.running && b->second.size == job->size) {
      t.current = job->size;
      const double age = job->started_us >= 0 ? (now - job->started_us) * 1e-6 : 0;
      const double horizon = std::max(age, o.min_horizon_s);
      t.keep = std::max(horizon - job->reform_paid_s, 0.0) / (horizon + job->goodput.reform_s);
      const int spans = static_cast<int>(job->placement.size());
      const int s = job->curve_node_slots;
      t.stay = spans == (t.current + s - 1) / s ? CurveAt(job, t.current)
                                                : BestBatch(job->goodput, spans, t.current).goodput;
    }
    for (const auto& [n, node] : nodes_) {
      if (node.types.count(job->spec.type) > 0) t.chunk = std::max(t.chunk, node.slots);
    }
    t.weight = job->spec.priority;
    if (o.service_power > 0) {
      t.weight *= std::max(o.service_floor, std::pow(1 + job->service_trainer_s / o.service_scale_s,
                                                     -o.service_power));
    }
    terms.push_back(t);
  }
  // G after the pass at n trainers: staying put costs nothing; any change (or a move to a more
  // compact placement at the same size) pays the re-form.
  auto goodput_at = [&](const Term& t, int n) {
    const double changed = CurveAt(t.f->job, n) * t.keep;
    return n == t.current ? std::max(t.stay, changed) : changed;
  };
  auto term_at = [&](const Term& t, int n) {
    return t.weight * SpeedupTerm(goodput_at(t, n) / t.ref, o.fairness_power, 1);
  };
  for (;;) {
    std::map<std::string, int> free_by_type;
    for (const auto& [n, node] : nodes_) {
      const int free = (*capacity)[n];
      if (free <= 0) continue;
      for (const auto& type : node.types) free_by_type[type] += free;
    }
    Term* best = nullptr;
    int best_k = 0;
    double best_gain = 0;
    for (Term& t : terms) {
      const int n = t.f->tent;
      auto free = free_by_type.find(t.f->job->spec.type);
      if (free == free_by_type.end()) continue;
      const int reach = std::max(t.chunk, t.current - n);
      const int kmax = std::min({t.top - n, free->second, reach});
      const double here = term_at(t, n);
      for (int k = 1; k <= kmax; ++k) {
        const double gain = (term_at(t, n + k) - here) / k;
        if (gain > best_gain * (1 + 1e-12) + 1e-15) {
          best = &t;
          best_k = k;
          best_gain = gain;
        }
      }
    }
    if (best == nullptr) break;
    for (int k = 0; k < best_k; ++k) {
      if (!TakeSlot(best->f, capacity)) break;
    }
  }
  for (const Term& t : terms) {
    if (t.f->tent == t.current && CurveAt(t.f->job, t.current) * t.keep > t.stay * (1 + 1e-9)) {
      moves->insert(t.f->job);
    }
  }
}

void ClusterPolicy::ApplyPacked(std::vector<Flex>* flex, const std::set<const PolicyJob*>& moves) {
  std::map<std::string, int> room;  // per node, for the jobs placed anew
  for (const auto& [n, node] : nodes_)
    room[n] = node.slots - (reserved_.count(n) ? reserved_.at(n) : 0);
  std::map<const PolicyJob*, Flex*> by_job;
  for (Flex& f : *flex) by_job[f.job] = &f;
  std::vector<Flex*> changing;
  for (auto& [name, job] : jobs_) {
    if (job.state != JobPhase::kRunning) continue;
    auto it = by_job.find(&job);
    auto b = before_.find(name);
    const bool changed = b == before_.end() || !b->second.running || b->second.size != job.size;
    if (it != by_job.end() && (changed || it->second->tent != job.size || moves.count(&job) > 0)) {
      changing.push_back(it->second);
    } else {
      for (const auto& [n, k] : job.placement) room[n] -= k;
    }
  }
  std::sort(changing.begin(), changing.end(), [](const Flex* a, const Flex* b) {
    if (a->tent != b->tent) return a->tent > b->tent;
    if (a->job->spec.priority != b->job->spec.priority) {
      return a->job->spec.priority > b->job->spec.priority;
    }
    return a->job->seq < b->job->seq;
  });
  std::vector<std::map<std::string, int>> target(changing.size());
  for (size_t i = 0; i < changing.size(); ++i) {
    const PolicyJob& job = *changing[i]->job;
    auto mine = [&](const std::string& n) {
      auto it = job.placement.find(n);
      return it == job.placement.end() ? 0 : it->second;
    };
    int left = changing[i]->tent;
    while (left > 0) {
      // The tightest node that takes the rest, else the roomiest; then where it runs now.
      std::string pick;
      bool fits = false;
      for (const auto& [n, node] : nodes_) {
        const int r = room[n];
        if (r <= 0 || node.types.count(job.spec.type) == 0) continue;
        if (pick.empty()) {
          pick = n, fits = r >= left;
          continue;
        }
        const int p = room[pick];
        const bool f = r >= left;
        const bool better = f != fits ? f
                            : f       ? (r != p ? r < p : mine(n) > mine(pick))
                                      : (r != p ? r > p : mine(n) > mine(pick));
        if (better) pick = n, fits = f;
      }
      if (pick.empty()) {  // the types do not pack this way: place as the fill did
        ApplyShares(flex);
        return;
      }
      const int take = std::min(left, room[pick]);
      target[i][pick] += take;
      room[pick] -= take;
      left -= take;
    }
  }
  auto why = [&](const Flex& f) {
    const std::string p = " (priority " + std::to_string(f.job->spec.priority) + "): ";
    if (!f.job->has_goodput) return "fair share" + p + std::to_string(f.tent) + " trainers";
    if (f.tent == f.job->size && moves.count(f.job) > 0) {
      return std::string("a compact placement (goodput)");
    }
    return "goodput share" + p + std::to_string(f.tent) + " trainers";
  };
  for (size_t i = 0; i < changing.size(); ++i) {  // shrinks first: they free the slots
    PolicyJob* job = changing[i]->job;
    for (auto [n, k] : Placement(job->placement)) {
      auto t = target[i].find(n);
      const int keep = t == target[i].end() ? 0 : t->second;
      if (k > keep) RemoveFrom(job, n, k - keep);
    }
  }
  for (size_t i = 0; i < changing.size(); ++i) {
    PolicyJob* job = changing[i]->job;
    for (const auto& [n, k] : target[i]) {
      auto cur = job->placement.find(n);
      PlaceOn(job, n, k - (cur == job->placement.end() ? 0 : cur->second));
    }
    auto b = before_.find(job->spec.name);
    if (b == before_.end() || job->placement != b->second.placement) {
      Note(job->spec.name, why(*changing[i]));
    }
  }
}

}  // namespace edl::jobserver
