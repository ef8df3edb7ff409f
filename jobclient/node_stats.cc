#include "jobclient/node_stats.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace edl::jobclient {

namespace {

// CPU time since boot from /proc/stat's "cpu" line, in clock ticks: busy (everything but idle and
// iowait) and total (user..steal); and the number of "cpuN" lines. False when unreadable.
bool ReadCpuTimes(uint64_t* busy, uint64_t* total, int* cores) {
  std::ifstream in("/proc/stat");
  std::string line;
  bool got = false;
  *cores = 0;
  while (std::getline(in, line) && line.rfind("cpu", 0) == 0) {
    if (line.size() > 3 && line[3] >= '0' && line[3] <= '9') {
      ++*cores;
      continue;
    }
    std::istringstream ss(line.substr(3));
    uint64_t v = 0, sum = 0, idle = 0;
    for (int i = 0; i < 8 && (ss >> v); ++i) {
      sum += v;
      if (i == 3 || i == 4) idle += v;
    }
    *busy = sum - idle;
    *total = sum;
    got = sum > 0;
  }
  return got && *cores > 0;
}

}  // namespace

bool NodeStatsSampler::Sample(proto::NodeStats* out) {
  uint64_t busy = 0, total = 0;
  int cores = 0;
  if (!ReadCpuTimes(&busy, &total, &cores)) return false;
  const bool have = total_prev_ > 0 && total > total_prev_ && busy >= busy_prev_;
  if (have) {
    out->cpu_cores = std::min<int>(cores, static_cast<int>(proto::kMaxSlotsPerNode) * 16);
    const double share =
        static_cast<double>(busy - busy_prev_) / static_cast<double>(total - total_prev_);
    out->cpu_busy = std::clamp(share, 0.0, 1.0) * out->cpu_cores;
    out->gpu_util = gpu_.Sample();
  }
  busy_prev_ = busy;
  total_prev_ = total;
  return have;
}

}  // namespace edl::jobclient
