// edl_sched_trace: replays generated job traces (--seeds of them, from --seed on) through the real
// cluster policy in four variants (static FIFO, static with EASY backfill, elastic without
// preemption, full policy) and prints, per seed and variant, mean pending time, mean job
// completion time, makespan and slot utilisation; then each figure's mean over the seeds ± half
// its spread (min to max), and RESULT lines comparing each elastic variant's means with each
// static one's. The model and the trace are documented in tools/sched_sim.h.
// bench/scheduler_trace.sh runs it with the benchmark's settings.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "edl/base/flags.h"
#include "tools/sched_sim.h"

namespace {

using edl::schedsim::SimOptions;
using edl::schedsim::SimResult;
using edl::schedsim::Variant;

constexpr char kUsage[] =
    "usage: edl_sched_trace [flags]\n"
    "Replays generated job traces (fixed seeds) through jobserver::ClusterPolicy with a simulated\n"
    "clock and simulated trainers; compares static allocation (FIFO, and FIFO with EASY "
    "backfill),\n"
    "elastic without preemption and the full policy. The model and the trace's distributions are\n"
    "documented in tools/sched_sim.h.";

// ref / ours; 1 when both are 0 (e.g. no job waited in either run).
std::string Ratio(double ref, double ours) {
  if (ours <= 0 && ref <= 0) return "1.00";
  if (ours <= 0) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", ref / ours);
  return buf;
}

void PrintResult(const std::string& name, double ours, double ref, const std::string& unit,
                 bool lower_is_better) {
  std::printf("RESULT %s ours=%.1f%s ref=%.1f%s ratio=%s\n", name.c_str(), ours, unit.c_str(), ref,
              unit.c_str(), lower_is_better ? Ratio(ref, ours).c_str() : Ratio(ours, ref).c_str());
}

constexpr int kVariants = 4;
constexpr Variant kOrder[kVariants] = {Variant::kStatic, Variant::kStaticEasy, Variant::kElastic,
                                       Variant::kFull};

// One figure over the seeds: mean, and half the min-to-max spread.
struct Spread {
  double mean = 0, half = 0;
};
Spread Over(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x / v.size();
  s.half = (*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end())) / 2;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  edl::schedsim::TraceOptions trace_options;
  SimOptions sim;
  double interval_s = 120;
  bool print_trace = false;
  int seeds = 1;
  std::string events_out;
  edl::po::options_description d;
  d.add_options()(
      "seed", edl::po::value<uint64_t>(&trace_options.seed)->default_value(trace_options.seed),
      "the first trace seed")("seeds", edl::po::value<int>(&seeds)->default_value(seeds),
                              "traces to replay, seeds --seed, --seed + 1, ...")(
      "jobs", edl::po::value<int>(&trace_options.jobs)->default_value(trace_options.jobs),
      "jobs in the trace")("mean_interarrival_s",
                           edl::po::value<double>(&trace_options.mean_interarrival_s)
                               ->default_value(trace_options.mean_interarrival_s),
                           "mean gap between arrivals (Poisson)")(
      "nodes", edl::po::value<int>(&sim.nodes)->default_value(sim.nodes), "nodes in the cluster")(
      "slots", edl::po::value<int>(&sim.slots_per_node)->default_value(sim.slots_per_node),
      "slots per node")("min_change_interval_s",
                        edl::po::value<double>(&interval_s)->default_value(interval_s),
                        "the policy's per-job rate limit")(
      "alpha", edl::po::value<double>(&sim.model.alpha)->default_value(sim.model.alpha),
      "throughput exponent: n trainers give n^alpha")(
      "start_s", edl::po::value<double>(&sim.model.start_s)->default_value(sim.model.start_s),
      "seconds without progress after a start")(
      "reform_s", edl::po::value<double>(&sim.model.reform_s)->default_value(sim.model.reform_s),
      "seconds without progress after a resize")("print_trace", edl::po::bool_switch(&print_trace),
                                                 "print the trace, one job per line")(
      "events_out", edl::po::value<std::string>(&events_out),
      "write every variant's decision log here (JSON lines)");
  edl::ParsedFlags pf;
  edl::Status s = edl::ParseFlags("sched_trace", kUsage, d, argc, argv, &pf);
  if (!s.ok()) {
    std::cerr << "edl_sched_trace: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;
  if (trace_options.jobs < 1 || trace_options.jobs > 100000 || seeds < 1 || seeds > 1000 ||
      sim.nodes < 1 || sim.nodes > 100000 || sim.slots_per_node < 1 || sim.slots_per_node > 4096 ||
      !(interval_s >= 0) || !(trace_options.mean_interarrival_s > 0) ||
      !(sim.model.alpha > 0 && sim.model.alpha <= 1) || !(sim.model.start_s >= 0) ||
      !(sim.model.reform_s >= 0)) {
    std::cerr << "edl_sched_trace: need 1 <= --jobs <= 100000, 1 <= --seeds <= 1000, 1 <= --nodes "
                 "<= 100000, 1 <= --slots "
                 "<= 4096, --mean_interarrival_s > 0, 0 < --alpha <= 1, and non-negative times\n";
    return 2;
  }
  sim.min_change_interval_us = static_cast<int64_t>(interval_s * 1e6);
  trace_options.max_trainers = std::min(64, sim.nodes * sim.slots_per_node);

  const int total_slots = sim.nodes * sim.slots_per_node;
  std::printf("traces: %d jobs each, mean gap %.0f s, on %d slots (%d nodes x %d)\n",
              trace_options.jobs, trace_options.mean_interarrival_s, total_slots, sim.nodes,
              sim.slots_per_node);
  std::printf(
      "model: n trainers -> n^%.2f throughput, %.0f s start, %.0f s per resize; rate limit "
      "%.0f s\n",
      sim.model.alpha, sim.model.start_s, sim.model.reform_s, interval_s);

  std::ofstream events;
  if (!events_out.empty()) {
    events.open(events_out);
    if (!events) {
      std::cerr << "edl_sched_trace: cannot write --events_out " << events_out << "\n";
      return 2;
    }
    sim.event_log = &events;
  }
  // Per variant and figure (pending, JCT, makespan, utilisation %), one value per seed.
  std::array<std::array<std::vector<double>, 4>, kVariants> figures;
  const uint64_t first_seed = trace_options.seed;
  for (int k = 0; k < seeds; ++k) {
    trace_options.seed = first_seed + k;
    const auto trace = edl::schedsim::GenerateTrace(trace_options);
    std::printf("seed %llu: %d jobs, arrivals over %.1f h, offered load %.2f\n",
                static_cast<unsigned long long>(trace_options.seed), trace_options.jobs,
                trace.back().arrival_us / 3.6e9, edl::schedsim::OfferedLoad(trace, total_slots));
    if (print_trace) {
      for (const auto& j : trace) {
        std::printf("  %s arrive=%.0fs size=%d min=%d max=%d prio=%d %s duration=%.0fs\n",
                    j.name.c_str(), j.arrival_us / 1e6, j.requested, j.min, j.max, j.priority,
                    j.elastic ? "elastic" : "restart", j.duration_s);
      }
    }
    for (int v = 0; v < kVariants; ++v) {
      sim.variant = kOrder[v];
      SimResult r;
      s = edl::schedsim::Simulate(trace, sim, &r);
      if (!s.ok()) {
        std::cerr << "edl_sched_trace: seed " << trace_options.seed << ", "
                  << edl::schedsim::VariantName(kOrder[v]) << ": " << s.ToString() << "\n";
        return 1;
      }
      std::printf(
          "  %-11s mean pending %8.1f s  mean JCT %8.1f s  makespan %8.1f s  utilisation %5.1f %%"
          "  resizes %lld  policy events %lld  steps %lld\n",
          edl::schedsim::VariantName(kOrder[v]), r.mean_pending_s, r.mean_jct_s, r.makespan_s,
          100 * r.utilisation, static_cast<long long>(r.resizes),
          static_cast<long long>(r.policy_events), static_cast<long long>(r.steps));
      figures[v][0].push_back(r.mean_pending_s);
      figures[v][1].push_back(r.mean_jct_s);
      figures[v][2].push_back(r.makespan_s);
      figures[v][3].push_back(100 * r.utilisation);
    }
  }
  std::printf(
      "over %d seeds (%llu..%llu), mean ± half the min-max spread; the elastic variants may "
      "run a job up to 2x its requested size, the static ones never above it:\n",
      seeds, static_cast<unsigned long long>(first_seed),
      static_cast<unsigned long long>(first_seed + seeds - 1));
  for (int v = 0; v < kVariants; ++v) {
    const Spread p = Over(figures[v][0]), j = Over(figures[v][1]), m = Over(figures[v][2]),
                 u = Over(figures[v][3]);
    std::printf(
        "%-11s mean pending %8.1f ± %.1f s  mean JCT %8.1f ± %.1f s  makespan %8.1f ± %.1f s  "
        "utilisation %5.1f ± %.1f %%\n",
        edl::schedsim::VariantName(kOrder[v]), p.mean, p.half, j.mean, j.half, m.mean, m.half,
        u.mean, u.half);
  }
  // Each elastic variant against each static one, on the means over the seeds.
  for (int v = 2; v < kVariants; ++v) {
    for (int ref = 0; ref < 2; ++ref) {
      const std::string p = std::string("sched_trace_") + edl::schedsim::VariantName(kOrder[v]);
      const std::string vs = std::string("_vs_") + edl::schedsim::VariantName(kOrder[ref]);
      PrintResult(p + "_mean_pending" + vs, Over(figures[v][0]).mean, Over(figures[ref][0]).mean,
                  "s", true);
      PrintResult(p + "_mean_jct" + vs, Over(figures[v][1]).mean, Over(figures[ref][1]).mean, "s",
                  true);
      PrintResult(p + "_makespan" + vs, Over(figures[v][2]).mean, Over(figures[ref][2]).mean, "s",
                  true);
      PrintResult(p + "_utilisation" + vs, Over(figures[v][3]).mean, Over(figures[ref][3]).mean,
                  "%", false);
    }
  }
  return 0;
}
