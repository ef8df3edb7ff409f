// NodeStatsSampler: what a cluster node reports about every heartbeat (`node_stats`,
// docs/CLUSTER.md "The monitor"): its CPU use since the previous sample, from /proc/stat, and its
// GPUs' mean utilisation through NVML (gpu_utilization.h) when the driver is there.
//
// Thread-safety: none (the client's io_context thread).
#pragma once

#include <cstdint>
#include <vector>

#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobclient/gpu_utilization.h"

namespace edl::jobclient {

class NodeStatsSampler {
 public:
  // Measures GPUs `gpus` from now on (empty: every GPU NVML lists); GpuUtilization::Open's errors,
  // after which the GPUs read as not measured.
  Status OpenGpus(const std::vector<int>& gpus) { return gpu_.Open(gpus); }
  int gpu_devices() const { return gpu_.devices(); }
  // The node's utilisation since the previous call into *out. False on the first call, when
  // /proc/stat cannot be read, or when its counters went backwards: nothing to report.
  bool Sample(proto::NodeStats* out);

 private:
  uint64_t busy_prev_ = 0, total_prev_ = 0;  // /proc/stat at the previous sample, in clock ticks
  GpuUtilization gpu_;
};

}  // namespace edl::jobclient
