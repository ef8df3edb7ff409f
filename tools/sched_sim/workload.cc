#include "tools/sched_sim/workload.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "tools/sched_sim/csv.h"

namespace edl::schedsim {

Status LoadWorkload(const std::string& path, const std::map<std::string, AppTrace>& apps,
                    int max_replicas, Workload* out) {
  CsvTable t;
  EDL_RETURN_IF_ERROR(
      ReadCsv(path, {"name", "time", "application", "num_replicas", "batch_size"}, &t));
  *out = Workload();
  out->name = std::filesystem::path(path).stem().string();
  std::set<std::string> names;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    WorkloadJob j;
    j.name = t.Field(r, "name");
    j.app = t.Field(r, "application");
    int64_t replicas = 0, batch = 0;
    EDL_RETURN_IF_ERROR(t.Double(r, "time", &j.arrival_s));
    EDL_RETURN_IF_ERROR(t.Int(r, "num_replicas", &replicas));
    EDL_RETURN_IF_ERROR(t.Int(r, "batch_size", &batch));
    if (j.name.empty() || !names.insert(j.name).second) {
      return Status::InvalidArgument(t.Where(r) + ": job name '" + j.name +
                                     "' is empty or used before: give each job its own name");
    }
    if (j.arrival_s < 0) {
      return Status::InvalidArgument(t.Where(r) + ": job " + j.name + " has negative time " +
                                     t.Field(r, "time") +
                                     ": times are seconds from the workload's start, >= 0");
    }
    auto app = apps.find(j.app);
    if (app == apps.end()) {
      std::string known;
      for (const auto& [n, a] : apps) known += (known.empty() ? "" : ", ") + n;
      return Status::InvalidArgument(t.Where(r) + ": job " + j.name + " names application '" +
                                     j.app + "', which has no traces (known: " + known +
                                     "): use one of those, or add traces/" + j.app +
                                     " and a line to applications.csv");
    }
    if (replicas < 1 || replicas > max_replicas) {
      return Status::InvalidArgument(t.Where(r) + ": job " + j.name + " asks for " +
                                     std::to_string(replicas) + " GPUs: give 1.." +
                                     std::to_string(max_replicas) + " (the cluster's GPUs)");
    }
    const jobserver::BatchLimits& lim = app->second.limits();
    if (batch < lim.base_batch || batch > lim.max_batch) {
      return Status::InvalidArgument(
          t.Where(r) + ": job " + j.name + " runs batch " + std::to_string(batch) + ", outside " +
          j.app + "'s validated batch sizes " + std::to_string(lim.base_batch) + ".." +
          std::to_string(lim.max_batch) + ": pick one in that range");
    }
    if (static_cast<double>(batch) / replicas > static_cast<double>(lim.max_local) * 1e6 ||
        replicas * lim.min_local > batch) {
      return Status::InvalidArgument(
          t.Where(r) + ": job " + j.name + ": batch " + std::to_string(batch) + " on " +
          std::to_string(replicas) + " GPUs is below " + j.app + "'s smallest micro-batch " +
          std::to_string(lim.min_local) + " per GPU: ask for fewer GPUs or a larger batch");
    }
    j.replicas = static_cast<int>(replicas);
    j.batch = static_cast<int>(batch);
    out->jobs.push_back(std::move(j));
  }
  if (out->jobs.empty()) return Status::InvalidArgument(path + ": no job; add one per line");
  std::stable_sort(
      out->jobs.begin(), out->jobs.end(),
      [](const WorkloadJob& a, const WorkloadJob& b) { return a.arrival_s < b.arrival_s; });
  return Status::OK();
}

Status LoadPublished(const std::string& path, PublishedJcts* out) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open it (is the data folder complete?)");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("jcts") || !j["jcts"].is_object()) {
    return Status::InvalidArgument(path +
                                   ": not a summary: expected a JSON object with \"jcts\": "
                                   "{\"workload-N\": {\"job\": seconds}}");
  }
  out->clear();
  for (const auto& [w, jobs] : j["jcts"].items()) {
    if (!jobs.is_object()) {
      return Status::InvalidArgument(path + ": jcts." + w + " is not an object of job: seconds");
    }
    for (const auto& [name, v] : jobs.items()) {
      if (!v.is_number() || !(v.get<double>() >= 0)) {
        return Status::InvalidArgument(path + ": jcts." + w + "." + name +
                                       " is not a non-negative number of seconds");
      }
      (*out)[w][name] = v.get<double>();
    }
  }
  return Status::OK();
}

double Percentile99(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * values.size()));
  return values[std::max<size_t>(rank, 1) - 1];
}

Status FiguresOf(const Workload& w, const std::map<std::string, double>& jcts, Figures* out) {
  *out = Figures();
  out->gpu_hours = -1;
  std::vector<double> all;
  double first = INFINITY, last = 0;
  for (const WorkloadJob& j : w.jobs) {
    auto it = jcts.find(j.name);
    if (it == jcts.end()) {
      return Status::InvalidArgument("no completion time for job " + j.name + " of " + w.name);
    }
    all.push_back(it->second);
    first = std::min(first, j.arrival_s);
    last = std::max(last, j.arrival_s + it->second);
  }
  double sum = 0;
  for (double x : all) sum += x;
  out->avg_jct_s = sum / all.size();
  out->p99_jct_s = Percentile99(all);
  out->makespan_s = last - first;
  return Status::OK();
}

}  // namespace edl::schedsim
