// edl_sched_trace: replays one generated job trace through the real cluster policy in three
// variants (static, elastic without preemption, full policy) and prints, per variant, mean pending
// time, mean job completion time, makespan and slot utilisation, then RESULT lines comparing each
// elastic variant with static. The model and the trace are documented in tools/sched_sim.h.
// bench/scheduler_trace.sh runs it with the benchmark's settings.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "edl/base/flags.h"
#include "tools/sched_sim.h"

namespace {

using edl::schedsim::SimOptions;
using edl::schedsim::SimResult;
using edl::schedsim::Variant;

constexpr char kUsage[] =
    "usage: edl_sched_trace [flags]\n"
    "Replays a generated job trace (fixed seed) through jobserver::ClusterPolicy with a simulated\n"
    "clock and simulated trainers; compares static allocation, elastic without preemption and the\n"
    "full policy. The model and the trace's distributions are documented in tools/sched_sim.h.";

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

}  // namespace

int main(int argc, char** argv) {
  edl::schedsim::TraceOptions trace_options;
  SimOptions sim;
  double interval_s = 120;
  bool print_trace = false;
  std::string events_out;
  edl::po::options_description d;
  d.add_options()
      ("seed", edl::po::value<uint64_t>(&trace_options.seed)->default_value(trace_options.seed), "trace seed")
      ("jobs", edl::po::value<int>(&trace_options.jobs)->default_value(trace_options.jobs), "jobs in the trace")
      ("mean_interarrival_s", edl::po::value<double>(&trace_options.mean_interarrival_s)->default_value(trace_options.mean_interarrival_s), "mean gap between arrivals (Poisson)")
      ("nodes", edl::po::value<int>(&sim.nodes)->default_value(sim.nodes), "nodes in the cluster")
      ("slots", edl::po::value<int>(&sim.slots_per_node)->default_value(sim.slots_per_node), "slots per node")
      ("min_change_interval_s", edl::po::value<double>(&interval_s)->default_value(interval_s), "the policy's per-job rate limit")
      ("alpha", edl::po::value<double>(&sim.model.alpha)->default_value(sim.model.alpha), "throughput exponent: n trainers give n^alpha")
      ("start_s", edl::po::value<double>(&sim.model.start_s)->default_value(sim.model.start_s), "seconds without progress after a start")
      ("reform_s", edl::po::value<double>(&sim.model.reform_s)->default_value(sim.model.reform_s), "seconds without progress after a resize")
      ("print_trace", edl::po::bool_switch(&print_trace), "print the trace, one job per line")
      ("events_out", edl::po::value<std::string>(&events_out), "write every variant's decision log here (JSON lines)");
  edl::ParsedFlags pf;
  edl::Status s = edl::ParseFlags("sched_trace", kUsage, d, argc, argv, &pf);
  if (!s.ok()) {
    std::cerr << "edl_sched_trace: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;
  if (trace_options.jobs < 1 || trace_options.jobs > 100000 || sim.nodes < 1 || sim.nodes > 100000 ||
      sim.slots_per_node < 1 || sim.slots_per_node > 4096 || !(interval_s >= 0) ||
      !(trace_options.mean_interarrival_s > 0) || !(sim.model.alpha > 0 && sim.model.alpha <= 1) ||
      !(sim.model.start_s >= 0) || !(sim.model.reform_s >= 0)) {
    std::cerr << "edl_sched_trace: need 1 <= --jobs <= 100000, 1 <= --nodes <= 100000, 1 <= --slots "
                 "<= 4096, --mean_interarrival_s > 0, 0 < --alpha <= 1, and non-negative times\n";
    return 2;
  }
  sim.min_change_interval_us = static_cast<int64_t>(interval_s * 1e6);
  trace_options.max_trainers = std::min(64, sim.nodes * sim.slots_per_node);

  const auto trace = edl::schedsim::GenerateTrace(trace_options);
  const int total_slots = sim.nodes * sim.slots_per_node;
  std::printf("trace: %d jobs, seed %llu, mean gap %.0f s, arrivals over %.1f h, offered load %.2f "
              "of %d slots (%d nodes x %d)\n",
              trace_options.jobs, static_cast<unsigned long long>(trace_options.seed),
              trace_options.mean_interarrival_s, trace.back().arrival_us / 3.6e9,
              edl::schedsim::OfferedLoad(trace, total_slots), total_slots, sim.nodes,
              sim.slots_per_node);
  std::printf("model: n trainers -> n^%.2f throughput, %.0f s start, %.0f s per resize; rate limit "
              "%.0f s\n",
              sim.model.alpha, sim.model.start_s, sim.model.reform_s, interval_s);
  if (print_trace) {
    for (const auto& j : trace) {
      std::printf("  %s arrive=%.0fs size=%d min=%d max=%d prio=%d %s duration=%.0fs\n",
                  j.name.c_str(), j.arrival_us / 1e6, j.requested, j.min, j.max, j.priority,
                  j.elastic ? "elastic" : "restart", j.duration_s);
    }
  }

  std::ofstream events;
  if (!events_out.empty()) {
    events.open(events_out);
    if (!events) {
      std::cerr << "edl_sched_trace: cannot write --events_out " << events_out << "\n";
      return 2;
    }
    sim.event_log = &events;
  }
  SimResult results[3];
  const Variant variants[3] = {Variant::kStatic, Variant::kElastic, Variant::kFull};
  for (int v = 0; v < 3; ++v) {
    sim.variant = variants[v];
    s = edl::schedsim::Simulate(trace, sim, &results[v]);
    if (!s.ok()) {
      std::cerr << "edl_sched_trace: " << edl::schedsim::VariantName(variants[v]) << ": "
                << s.ToString() << "\n";
      return 1;
    }
    const SimResult& r = results[v];
    std::printf("%-8s mean pending %8.1f s  mean JCT %8.1f s  makespan %8.1f s  utilisation %5.1f %%"
                "  resizes %lld  policy events %lld  steps %lld\n",
                edl::schedsim::VariantName(variants[v]), r.mean_pending_s, r.mean_jct_s,
                r.makespan_s, 100 * r.utilisation, static_cast<long long>(r.resizes),
                static_cast<long long>(r.policy_events), static_cast<long long>(r.steps));
  }
  const SimResult& ref = results[0];
  for (int v = 1; v < 3; ++v) {
    const SimResult& r = results[v];
    const std::string p = std::string("sched_trace_") + edl::schedsim::VariantName(variants[v]);
    PrintResult(p + "_mean_pending_vs_static", r.mean_pending_s, ref.mean_pending_s, "s", true);
    PrintResult(p + "_mean_jct_vs_static", r.mean_jct_s, ref.mean_jct_s, "s", true);
    PrintResult(p + "_makespan_vs_static", r.makespan_s, ref.makespan_s, "s", true);
    PrintResult(p + "_utilisation_vs_static", 100 * r.utilisation, 100 * ref.utilisation, "%",
                false);
  }
  return 0;
}
