#include "tools/sched_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <random>

#include "edl/base/clock.h"
#include "jobserver/policy/cluster_policy.h"

namespace edl::schedsim {
namespace {

constexpr char kJobType[] = "train";

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Uniform in (0, 1): 53 random bits, never exactly 0.
  double Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {  // Box-Muller
    const double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Index i with probability weights[i] / sum.
  size_t Pick(const std::vector<double>& weights) {
    double sum = 0;
    for (double w : weights) sum += w;
    double x = Uniform() * sum;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (x < weights[i]) return i;
      x -= weights[i];
    }
    return weights.size() - 1;
  }

 private:
  std::mt19937_64 gen_;
};

}  // namespace

std::vector<TraceJob> GenerateTrace(const TraceOptions& o) {
  Rng rng(o.seed);
  const std::vector<int> sizes = {1, 2, 4, 8, 16, 32, 64};
  const std::vector<double> size_p = {.32, .20, .16, .14, .09, .06, .03};
  const std::vector<int> prios = {1, 2, 5};
  const std::vector<double> prio_p = {.75, .20, .05};
  std::vector<TraceJob> out;
  double t = 0;
  for (int i = 0; i < o.jobs; ++i) {
    TraceJob j;
    j.name = "job" + std::to_string(i);
    if (i > 0) t += -std::log(rng.Uniform()) * o.mean_interarrival_s;
    j.arrival_us = static_cast<int64_t>(std::llround(t * 1e6));
    j.requested = std::min(sizes[rng.Pick(size_p)], o.max_trainers);
    const double median_s = 15 * 60 * (1 + std::log2(j.requested) / 2);
    j.duration_s = std::clamp(median_s * std::exp(1.3 * rng.Normal()), 120.0, 86400.0);
    j.elastic = rng.Uniform() < 0.85;
    if (j.elastic) {
      j.min = (j.requested + 1) / 2;
      j.max = std::min(2 * j.requested, o.max_trainers);
    } else {
      j.min = j.max = j.requested;
    }
    j.priority = prios[rng.Pick(prio_p)];
    out.push_back(j);
  }
  return out;
}

double ThroughputModel::Speed(int n) const { return n <= 0 ? 0 : std::pow(n, alpha); }

const char* VariantName(Variant v) {
  switch (v) {
    case Variant::kStatic:
      return "static";
    case Variant::kStaticEasy:
      return "static_easy";
    case Variant::kElastic:
      return "elastic";
    case Variant::kFull:
      return "full";
  }
  return "?";
}

double OfferedLoad(const std::vector<TraceJob>& trace, int total_slots) {
  if (trace.size() < 2) return 0;
  double demand = 0;
  for (const auto& j : trace) demand += j.requested * j.duration_s;
  const double span = (trace.back().arrival_us - trace.front().arrival_us) * 1e-6;
  return span <= 0 ? 0 : demand / (total_slots * span);
}

namespace {

// Means, makespan and utilisation from the jobs' outcomes and the slot-time they held.
void Summarize(int total_slots, double slot_us, SimResult* out) {
  const size_t n = out->jobs.size();
  int64_t first = n == 0 ? 0 : out->jobs.front().arrival_us, last = first;
  double pending = 0, jct = 0;
  for (const JobOutcome& j : out->jobs) {
    pending += (j.start_us - j.arrival_us) * 1e-6;
    jct += (j.finish_us - j.arrival_us) * 1e-6;
    last = std::max(last, j.finish_us);
  }
  if (n > 0) {
    out->mean_pending_s = pending / n;
    out->mean_jct_s = jct / n;
  }
  out->makespan_s = (last - first) * 1e-6;
  out->utilisation = out->makespan_s > 0 ? slot_us * 1e-6 / (total_slots * out->makespan_s) : 0;
}

// The static_easy variant (sched_sim.h): every job at its requested size for start_s + its
// duration; FIFO with EASY backfilling over one pool of slots.
Status SimulateEasyBackfill(const std::vector<TraceJob>& trace, const SimOptions& o,
                            SimResult* out) {
  const size_t n = trace.size();
  const int total = o.nodes * o.slots_per_node;
  out->jobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out->jobs[i].arrival_us = trace[i].arrival_us;
    if (trace[i].requested > total) {
      return Status::FailedPrecondition("job " + trace[i].name + " needs " +
                                        std::to_string(trace[i].requested) +
                                        " slots; the cluster has " + std::to_string(total));
    }
  }
  auto run_us = [&](size_t i) {
    return static_cast<int64_t>(std::ceil((o.model.start_s + trace[i].duration_s) * 1e6));
  };
  std::deque<size_t> queue;
  std::vector<size_t> running;
  int free = total;
  size_t next = 0, done = 0;
  int64_t now = 0;
  double slot_us = 0;
  auto start = [&](size_t i) {
    out->jobs[i].start_us = now;
    out->jobs[i].finish_us = now + run_us(i);
    free -= trace[i].requested;
    running.push_back(i);
  };
  while (done < n) {
    int64_t t = std::numeric_limits<int64_t>::max();
    if (next < n) t = trace[next].arrival_us;
    for (size_t i : running) t = std::min(t, out->jobs[i].finish_us);
    slot_us += static_cast<double>(total - free) * (t - now);
    now = t;
    ++out->steps;
    for (auto it = running.begin(); it != running.end();) {
      if (out->jobs[*it].finish_us <= now) {
        free += trace[*it].requested;
        ++done;
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    while (next < n && trace[next].arrival_us <= now) queue.push_back(next++);
    while (!queue.empty() && trace[queue.front()].requested <= free) {
      start(queue.front());
      queue.pop_front();
    }
    if (!queue.empty()) {
      // The head's reservation: the earliest end after which enough slots are free (shadow), and
      // the slots it leaves spare then (extra).
      const int need = trace[queue.front()].requested;
      std::vector<std::pair<int64_t, int>> ends;
      for (size_t i : running) ends.emplace_back(out->jobs[i].finish_us, trace[i].requested);
      std::sort(ends.begin(), ends.end());
      int avail = free;
      int64_t shadow = now;
      for (const auto& [end, slots] : ends) {
        if (avail >= need) break;
        avail += slots;
        shadow = end;
      }
      int extra = avail - need;
      for (auto it = queue.begin() + 1; it != queue.end();) {
        const size_t i = *it;
        const int req = trace[i].requested;
        const bool ends_first = now + run_us(i) <= shadow;
        if (req <= free && (ends_first || req <= extra)) {
          if (!ends_first) extra -= req;
          start(i);
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    out->max_used_slots = std::max(out->max_used_slots, total - free);
  }
  Summarize(total, slot_us, out);
  return Status::OK();
}

}  // namespace

Status Simulate(const std::vector<TraceJob>& trace, const SimOptions& o, SimResult* out) {
  *out = SimResult();
  for (size_t i = 1; i < trace.size(); ++i) {
    if (trace[i].arrival_us < trace[i - 1].arrival_us) {
      return Status::InvalidArgument("trace arrivals must not decrease (job " + trace[i].name +
                                     ")");
    }
  }
  if (o.variant == Variant::kStaticEasy) return SimulateEasyBackfill(trace, o, out);
  ManualClock clock(0);
  jobserver::ClusterPolicyOptions po;
  po.min_change_interval_us = o.min_change_interval_us;
  po.preempt = o.variant == Variant::kFull;
  po.priority_order = o.variant != Variant::kStatic;
  jobserver::ClusterPolicy policy(po, &clock);
  for (int i = 0; i < o.nodes; ++i) {
    EDL_RETURN_IF_ERROR(policy.AddNode({"node" + std::to_string(i), o.slots_per_node, {kJobType}}));
  }
  const int total_slots = o.nodes * o.slots_per_node;

  struct Live {
    double work = 0, done = 0;
    int size = 0;
    int64_t stall_until = 0;
  };
  const size_t n = trace.size();
  std::vector<Live> live(n);
  std::vector<bool> arrived(n, false), finished(n, false);
  std::map<std::string, size_t> index;
  out->jobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    index[trace[i].name] = i;
    live[i].work = trace[i].duration_s * o.model.Speed(trace[i].requested);
    out->jobs[i].arrival_us = trace[i].arrival_us;
  }

  size_t next_arrival = 0, done_jobs = 0;
  int64_t now = 0;
  double slot_us = 0;  // integral of held slots over time
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // Microseconds job i needs from `now` to finish at its current size.
  auto finish_at = [&](size_t i) -> int64_t {
    const Live& l = live[i];
    if (l.size == 0) return kNever;
    const double remaining = std::max(0.0, l.work - l.done);
    const int64_t from = std::max(now, l.stall_until);
    return from + static_cast<int64_t>(std::ceil(remaining / o.model.Speed(l.size) * 1e6));
  };

  while (done_jobs < n) {
    int64_t next = kNever;
    if (next_arrival < n) next = trace[next_arrival].arrival_us;
    for (size_t i = 0; i < n; ++i) {
      if (arrived[i] && !finished[i]) next = std::min(next, finish_at(i));
    }
    const int64_t wake = policy.NextWakeupMicros();
    if (wake > now) next = std::min(next, wake);
    if (next == kNever) {
      return Status::FailedPrecondition(
          "simulation stuck at t=" + std::to_string(now / 1e6) +
          " s: " + std::to_string(n - done_jobs) +
          " jobs can never run; the first pending: " + policy.Summary().dump());
    }
    // Progress and held slots from now to next.
    for (size_t i = 0; i < n; ++i) {
      Live& l = live[i];
      if (!arrived[i] || finished[i] || l.size == 0) continue;
      const int64_t from = std::max(now, l.stall_until);
      if (next > from) l.done += (next - from) * 1e-6 * o.model.Speed(l.size);
      slot_us += static_cast<double>(l.size) * (next - now);
    }
    clock.Advance(next - now);
    now = next;
    ++out->steps;

    for (size_t i = 0; i < n; ++i) {
      Live& l = live[i];
      if (!arrived[i] || finished[i] || l.size == 0) continue;
      if (l.done >= l.work * (1 - 1e-12)) {
        EDL_RETURN_IF_ERROR(policy.Finish(trace[i].name));
        finished[i] = true;
        out->jobs[i].finish_us = now;
        l.size = 0;
        ++done_jobs;
      }
    }
    while (next_arrival < n && trace[next_arrival].arrival_us <= now) {
      const TraceJob& t = trace[next_arrival];
      jobserver::JobSubmission s;
      s.name = t.name;
      s.type = kJobType;
      s.priority = o.variant == Variant::kStatic ? 1 : t.priority;
      s.elastic = o.variant != Variant::kStatic && t.elastic;
      s.min_trainers = s.elastic ? t.min : t.requested;
      s.max_trainers = s.elastic ? t.max : t.requested;
      EDL_RETURN_IF_ERROR(policy.Submit(s));
      arrived[next_arrival] = true;
      ++next_arrival;
    }
    policy.Tick();
    for (const jobserver::PolicyEvent& e : policy.TakeEvents()) {
      ++out->policy_events;
      if (o.event_log != nullptr) {
        nlohmann::json j = e.ToJson();
        j["variant"] = VariantName(o.variant);
        *o.event_log << j.dump() << "\n";
      }
    }
    EDL_RETURN_IF_ERROR(policy.CheckInvariants());

    // The simulated trainers follow the policy's targets.
    int used = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!arrived[i] || finished[i]) continue;
      const jobserver::PolicyJob* pj = policy.Find(trace[i].name);
      if (pj == nullptr) return Status::Internal("job " + trace[i].name + " vanished");
      Live& l = live[i];
      const int to = pj->size;
      used += to;
      if (to == l.size) continue;
      if (l.size == 0) {
        l.stall_until = now + static_cast<int64_t>(o.model.start_s * 1e6);
        if (out->jobs[i].start_us < 0) out->jobs[i].start_us = now;
      } else if (to > 0) {
        l.stall_until = now + static_cast<int64_t>(o.model.reform_s * 1e6);
        ++out->jobs[i].resizes;
        ++out->resizes;
        if (!trace[i].elastic || o.variant == Variant::kStatic) {
          return Status::Internal("restart-mode job " + trace[i].name + " was resized");
        }
      }
      if (to > 0 && (to < pj->spec.min_trainers || to > pj->spec.max_trainers)) {
        return Status::Internal("job " + trace[i].name + " at " + std::to_string(to) +
                                " outside its bounds");
      }
      l.size = to;
    }
    if (used > total_slots) {
      return Status::Internal("jobs hold " + std::to_string(used) + " trainers on " +
                              std::to_string(total_slots) + " slots");
    }
    out->max_used_slots = std::max(out->max_used_slots, used);
  }

  Summarize(total_slots, slot_us, out);
  return Status::OK();
}

}  // namespace edl::schedsim
