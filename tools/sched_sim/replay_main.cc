// edl_sched_replay: replays the Pollux study's workloads (tools/sched_sim/data/pollux) through
// each scheduler variant (tools/sched_sim/replay.h) and prints, per workload and as the mean over
// the workloads, average and p99 job completion time, makespan and GPU-hours, then RESULT lines
// against the published results. bench/scheduler_trace.sh runs it with the benchmark's settings.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "edl/base/flags.h"
#include "tools/sched_sim/replay.h"

namespace {

using edl::Status;
using edl::schedsim::Figures;
using edl::schedsim::ReformCost;
using edl::schedsim::ReplayOptions;
using edl::schedsim::ReplayResult;
using edl::schedsim::Scheduler;

constexpr char kUsage[] =
    "usage: edl_sched_replay [flags]\n"
    "Replays the Pollux study's workloads (160 jobs each, 16 nodes x 4 GPUs) through EDL's "
    "cluster\n"
    "policy (goodput and fair share), Tiresias and EASY backfill, with jobs whose progress "
    "follows\n"
    "the measured traces (tools/sched_sim/replay.h, docs/SCHEDULING.md), and compares the figures\n"
    "with the study's published results.";

// One column of the report: a scheduler with a re-form cost.
struct Variant {
  std::string name;
  Scheduler scheduler;
  ReformCost reform;
};

const std::vector<Variant>& AllVariants() {
  static const std::vector<Variant> v = {
      {"goodput_edl", Scheduler::kGoodput, ReformCost::kSteps},
      {"goodput_30s", Scheduler::kGoodput, ReformCost::kFixed},
      {"tiresias", Scheduler::kTiresias, ReformCost::kFixed},
      {"easy", Scheduler::kEasy, ReformCost::kFixed},
      {"fair_edl", Scheduler::kFairShare, ReformCost::kSteps},
  };
  return v;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

// ref / ours for times (> 1: ours is lower, ahead).
std::string Ratio(double ref, double ours) {
  if (ref < 0 || ours <= 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", ref / ours);
  return buf;
}

void Result(const std::string& name, double ours, double ref, const char* unit) {
  std::printf("RESULT %s ours=%.1f%s ref=%.1f%s ratio=%s\n", name.c_str(), ours, unit, ref, unit,
              Ratio(ref, ours).c_str());
}

Figures Mean(const std::vector<Figures>& v) {
  Figures m;
  for (const Figures& f : v) {
    m.avg_jct_s += f.avg_jct_s / v.size();
    m.p99_jct_s += f.p99_jct_s / v.size();
    m.makespan_s += f.makespan_s / v.size();
    m.gpu_hours += f.gpu_hours / v.size();
  }
  return m;
}

void Row(const std::string& label, const Figures& f, const std::string& extra) {
  std::printf("  %-18s avg JCT %8.1f s  p99 JCT %8.1f s  makespan %8.1f s  GPU-hours ",
              label.c_str(), f.avg_jct_s, f.p99_jct_s, f.makespan_s);
  if (f.gpu_hours < 0) {
    std::printf("%7s", "n/a");
  } else {
    std::printf("%7.1f", f.gpu_hours);
  }
  std::printf("%s\n", extra.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "tools/sched_sim/data/pollux";
  std::string workloads = "1,2,3,4,5,6,7,8";
  std::string variants;
  std::string reference = "pollux";
  std::string events_out;
  std::string jobs_out;
  ReplayOptions o;
  edl::po::options_description d;
  d.add_options()("data", edl::po::value<std::string>(&data)->default_value(data),
                  "the folder of applications.csv, traces/, workloads/ and results-jobload/")(
      "workloads", edl::po::value<std::string>(&workloads)->default_value(workloads),
      "comma-separated workload numbers (workloads/workload-N.csv)")(
      "variants", edl::po::value<std::string>(&variants),
      "comma-separated variants to run (default: all): goodput_edl, goodput_30s, tiresias, easy, "
      "fair_edl")("interval_s", edl::po::value<double>(&o.interval_s)->default_value(o.interval_s),
                  "scheduling period, seconds")(
      "start_s", edl::po::value<double>(&o.start_s)->default_value(o.start_s),
      "stall when a job starts or resumes, seconds")(
      "reform_grow_steps",
      edl::po::value<double>(&o.reform_grow_steps)->default_value(o.reform_grow_steps),
      "EDL re-form stall of a grow or move, in steps of the new configuration")(
      "reform_shrink_steps",
      edl::po::value<double>(&o.reform_shrink_steps)->default_value(o.reform_shrink_steps),
      "EDL re-form stall of a shrink, in steps")(
      "reform_fixed_s", edl::po::value<double>(&o.reform_fixed_s)->default_value(o.reform_fixed_s),
      "the *_30s variants' stall per reallocation, seconds")(
      "min_change_interval_s",
      edl::po::value<double>(&o.min_change_interval_s)->default_value(o.min_change_interval_s),
      "the policy's per-job rate limit, seconds")(
      "fairness_power",
      edl::po::value<double>(&o.goodput.fairness_power)->default_value(o.goodput.fairness_power),
      "goodput policy: power p of the power mean of speedups (< 1)")(
      "explore_factor",
      edl::po::value<double>(&o.goodput.explore_factor)->default_value(o.goodput.explore_factor),
      "goodput policy: trust a model up to this times its largest measured size")(
      "probe_trainers",
      edl::po::value<int>(&o.goodput.probe_trainers)->default_value(o.goodput.probe_trainers),
      "goodput policy: most trainers a job gets before its first measurement (0: its fair share)")(
      "service_power",
      edl::po::value<double>(&o.goodput.service_power)->default_value(o.goodput.service_power),
      "goodput policy: least-attained-service tilt of the weights (0: none)")(
      "service_scale_s",
      edl::po::value<double>(&o.goodput.service_scale_s)->default_value(o.goodput.service_scale_s),
      "goodput policy: trainer-seconds of service that halve a weight at power 1")(
      "service_floor",
      edl::po::value<double>(&o.goodput.service_floor)->default_value(o.goodput.service_floor),
      "goodput policy: the least weight, as a share of the priority")(
      "min_horizon_s",
      edl::po::value<double>(&o.goodput.min_horizon_s)->default_value(o.goodput.min_horizon_s),
      "goodput policy: least horizon a re-form cost is weighed over, seconds")(
      "events_out", edl::po::value<std::string>(&events_out),
      "write the policy variants' decision logs here (JSON lines)")(
      "jobs_out", edl::po::value<std::string>(&jobs_out),
      "write every job's outcome here (CSV: variant, workload, job, arrival, start, finish, JCT, "
      "GPU-seconds, reallocations, preemptions)");
  edl::ParsedFlags pf;
  Status s = edl::ParseFlags("sched_replay", kUsage, d, argc, argv, &pf);
  if (!s.ok()) {
    std::cerr << "edl_sched_replay: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;

  std::vector<Variant> run;
  for (const std::string& v : variants.empty() ? std::vector<std::string>() : Split(variants)) {
    bool found = false;
    for (const Variant& x : AllVariants()) {
      if (x.name == v) run.push_back(x), found = true;
    }
    if (!found) {
      std::cerr << "edl_sched_replay: --variants: unknown '" << v
                << "'; give goodput_edl, goodput_30s, tiresias, easy or fair_edl\n";
      return 2;
    }
  }
  if (run.empty()) run = AllVariants();

  std::map<std::string, edl::schedsim::AppTrace> apps;
  s = edl::schedsim::LoadApps(data, &apps);
  if (!s.ok()) {
    std::cerr << "edl_sched_replay: " << s.ToString() << "\n";
    return 1;
  }
  std::map<std::string, edl::schedsim::PublishedJcts> published;
  for (const char* p : {"pollux", "tiresias", "optimus"}) {
    s = edl::schedsim::LoadPublished(data + "/results-jobload/" + p + "-1.0/summary.json",
                                     &published[p]);
    if (!s.ok()) {
      std::cerr << "edl_sched_replay: " << s.ToString() << "\n";
      return 1;
    }
  }
  std::ofstream events;
  if (!events_out.empty()) {
    events.open(events_out);
    if (!events) {
      std::cerr << "edl_sched_replay: cannot write --events_out " << events_out << "\n";
      return 2;
    }
    o.event_log = &events;
  }
  const edl::jobserver::GoodputPolicyOptions& g = o.goodput;
  std::printf(
      "cluster: %d nodes x %d GPUs; scheduling every %.0f s; start %.0f s; re-form: EDL "
      "%.2f steps (grow/move) / %.2f (shrink), or %.0f s; rate limit %.0f s\n",
      o.nodes, o.gpus_per_node, o.interval_s, o.start_s, o.reform_grow_steps, o.reform_shrink_steps,
      o.reform_fixed_s, o.min_change_interval_s);
  std::printf(
      "goodput policy: p=%.2f; weights (1 + service/%.0f s)^-%.2f, floor %.2f; explore "
      "x%.1f; probe %d trainer(s); horizon >= %.0f s\n",
      g.fairness_power, g.service_scale_s, g.service_power, g.service_floor, g.explore_factor,
      g.probe_trainers, g.min_horizon_s);

  std::ofstream jobs_csv;
  if (!jobs_out.empty()) {
    jobs_csv.open(jobs_out);
    if (!jobs_csv) {
      std::cerr << "edl_sched_replay: cannot write --jobs_out " << jobs_out << "\n";
      return 2;
    }
    jobs_csv << "variant,workload,job,arrival_s,start_s,finish_s,jct_s,gpu_s,reallocations,"
                "preemptions\n";
  }
  // figures[variant][workload], and the published ones.
  std::map<std::string, std::vector<Figures>> ours, refs;
  std::vector<std::string> names;
  for (const std::string& num : Split(workloads)) {
    edl::schedsim::Workload w;
    const std::string path = data + "/workloads/workload-" + num + ".csv";
    s = edl::schedsim::LoadWorkload(path, apps, o.nodes * o.gpus_per_node, &w);
    if (!s.ok()) {
      std::cerr << "edl_sched_replay: " << s.ToString() << "\n";
      return 1;
    }
    names.push_back(w.name);
    std::printf("%s: %zu jobs, submitted over %.1f h\n", w.name.c_str(), w.jobs.size(),
                (w.jobs.back().arrival_s - w.jobs.front().arrival_s) / 3600);
    for (const Variant& v : run) {
      ReplayOptions vo = o;
      vo.scheduler = v.scheduler;
      vo.reform = v.reform;
      ReplayResult r;
      s = edl::schedsim::Replay(w, apps, vo, &r);
      if (!s.ok()) {
        std::cerr << "edl_sched_replay: " << w.name << ", " << v.name << ": " << s.ToString()
                  << "\n";
        return 1;
      }
      char extra[160];
      std::snprintf(extra, sizeof(extra), "  reallocations %lld  preemptions %lld  stall %.1f h",
                    static_cast<long long>(r.reallocations), static_cast<long long>(r.preemptions),
                    r.stall_s / 3600);
      Row(v.name, r.figures, extra);
      for (const edl::schedsim::JobResult& j : r.jobs) {
        if (!jobs_csv.is_open()) break;
        jobs_csv << v.name << "," << w.name << "," << j.name << "," << j.arrival_s << ","
                 << j.start_s << "," << j.finish_s << "," << j.finish_s - j.arrival_s << ","
                 << j.gpu_s << "," << j.reallocations << "," << j.preemptions << "\n";
      }
      ours[v.name].push_back(r.figures);
    }
    for (const auto& [p, jcts] : published) {
      Figures f;
      auto it = jcts.find(w.name);
      s = it == jcts.end() ? Status::NotFound("no published " + p + " results for " + w.name)
                           : edl::schedsim::FiguresOf(w, it->second, &f);
      if (!s.ok()) {
        std::cerr << "edl_sched_replay: " << s.ToString() << "\n";
        return 1;
      }
      Row("published " + p, f, "");
      refs[p].push_back(f);
    }
    std::fflush(stdout);
  }
  std::printf("mean over %zu workloads:\n", names.size());
  for (const Variant& v : run) Row(v.name, Mean(ours[v.name]), "");
  for (const auto& [p, f] : refs) Row("published " + p, Mean(f), "");

  // RESULT lines: every variant against Pollux's published figures; our Tiresias also against
  // the published Tiresias (the replay's fidelity); GPU-hours against our Tiresias replay (the
  // published results hold no GPU time).
  auto results = [&](const std::string& variant, const std::string& ref_name,
                     const std::vector<Figures>& mine, const std::vector<Figures>& ref) {
    const std::string suffix = ref_name == reference ? "" : "_vs_" + ref_name;
    for (size_t i = 0; i <= names.size(); ++i) {
      const bool mean = i == names.size();
      const Figures a = mean ? Mean(mine) : mine[i];
      const Figures b = mean ? Mean(ref) : ref[i];
      const std::string w = mean ? "mean" : names[i];
      Result("sched_" + variant + "_avg_jct_" + w + suffix, a.avg_jct_s, b.avg_jct_s, "s");
      Result("sched_" + variant + "_p99_jct_" + w + suffix, a.p99_jct_s, b.p99_jct_s, "s");
      Result("sched_" + variant + "_makespan_" + w + suffix, a.makespan_s, b.makespan_s, "s");
    }
  };
  for (const Variant& v : run) results(v.name, reference, ours[v.name], refs[reference]);
  const std::string tiresias = "tiresias";  // our replay's variant and the published policy
  if (ours.count(tiresias) > 0) results(tiresias, tiresias, ours[tiresias], refs[tiresias]);
  if (ours.count(tiresias) > 0) {
    for (const Variant& v : run) {
      for (size_t i = 0; i <= names.size(); ++i) {
        const bool mean = i == names.size();
        const double a = mean ? Mean(ours[v.name]).gpu_hours : ours[v.name][i].gpu_hours;
        const double b = mean ? Mean(ours[tiresias]).gpu_hours : ours[tiresias][i].gpu_hours;
        Result(
            "sched_" + v.name + "_gpu_hours_" + (mean ? "mean" : names[i]) + "_vs_tiresias_replay",
            a, b, "h");
      }
    }
  }
  return 0;
}
