// GPU utilisation of this node through NVML, for the monitor's GPU-UTILS (`node_stats`,
// docs/CLUSTER.md "The monitor"). NVML is loaded at run time with dlopen("libnvidia-ml.so.1"), the
// library the NVIDIA driver installs: `edl` has no link-time dependency on it, and a node without
// the driver (or with an unusable one) reports "not measured" (-1), shown as n/a.
//
// Thread-safety: none (the client's io_context thread).
#pragma once

#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::jobclient {

class GpuUtilization {
 public:
  GpuUtilization() = default;
  ~GpuUtilization();
  GpuUtilization(const GpuUtilization&) = delete;
  GpuUtilization& operator=(const GpuUtilization&) = delete;

  // Loads `library` and initialises NVML. `gpus`: the device indices to measure (a node's --gpus);
  // empty: every device NVML lists. NotFound when the library cannot be loaded, FailedPrecondition
  // when it lacks an NVML symbol or NVML does not initialise, InvalidArgument for a GPU index NVML
  // does not list; each names the library and the problem. After an error Sample() returns -1.
  Status Open(const std::vector<int>& gpus, const std::string& library = "libnvidia-ml.so.1");
  // Mean utilisation of the measured GPUs over NVML's last sample period, in percent (0..100);
  // -1 when not opened or a query fails.
  double Sample() const;
  int devices() const { return static_cast<int>(devices_.size()); }

 private:
  void Close();

  void* lib_ = nullptr;
  // NVML entry points (nvml.h; plain C, resolved by name).
  int (*shutdown_)() = nullptr;
  int (*utilization_)(void* device,
                      unsigned int* rates) = nullptr;  // nvmlUtilization_t: {gpu, memory}
  std::vector<void*> devices_;                         // nvmlDevice_t handles
};

}  // namespace edl::jobclient
