// A workload to replay (data/pollux/workloads/workload-N.csv: one job per line, name, submission
// time, application and the GPUs and batch size a user would have tuned it to), and the published
// results of other schedulers on it (data/pollux/results-jobload/<policy>-1.0/summary.json), with
// the figures the replay reports computed the same way for both.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "tools/sched_sim/app_trace.h"

namespace edl::schedsim {

struct WorkloadJob {
  std::string name;
  double arrival_s = 0;  // seconds from the workload's start
  std::string app;
  int replicas = 1;  // GPUs the user asked for
  int batch = 1;     // the total batch the user tuned
};

struct Workload {
  std::string name;               // the file name without .csv, e.g. "workload-1"
  std::vector<WorkloadJob> jobs;  // by arrival (ties: file order)
};

// Reads a workload with columns name,time,application,num_replicas,batch_size. InvalidArgument
// naming the file and line for: a missing column, a negative or non-numeric time, an application
// `apps` lacks (listing the known ones), num_replicas outside 1..max_replicas, a batch outside
// the application's validated batch sizes, a duplicate name; and for a file without jobs.
Status LoadWorkload(const std::string& path, const std::map<std::string, AppTrace>& apps,
                    int max_replicas, Workload* out);

// The job completion times (seconds) of each workload of a published summary.json
// ({"jcts": {"workload-N": {"job": seconds, ...}}, ...}).
using PublishedJcts = std::map<std::string, std::map<std::string, double>>;
Status LoadPublished(const std::string& path, PublishedJcts* out);

// The figures reported per workload and scheduler.
struct Figures {
  double avg_jct_s = 0;
  double p99_jct_s = 0;   // nearest rank: the ceil(0.99 n)-th smallest
  double makespan_s = 0;  // the last completion after the workload's first submission
  double gpu_hours = 0;   // GPUs held (in a stall too); < 0 where unknown (published results)
};
// From per-job JCTs and arrivals (matched by name; every job of `w` must have a JCT).
Status FiguresOf(const Workload& w, const std::map<std::string, double>& jcts, Figures* out);
double Percentile99(std::vector<double> values);

}  // namespace edl::schedsim
