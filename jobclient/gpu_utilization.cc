#include "jobclient/gpu_utilization.h"

#include <dlfcn.h>

namespace edl::jobclient {

namespace {
constexpr int kNvmlSuccess = 0;  // NVML_SUCCESS
}  // namespace

GpuUtilization::~GpuUtilization() { Close(); }

void GpuUtilization::Close() {
  if (shutdown_ != nullptr) shutdown_();
  if (lib_ != nullptr) ::dlclose(lib_);
  lib_ = nullptr;
  shutdown_ = nullptr;
  utilization_ = nullptr;
  devices_.clear();
}

Status GpuUtilization::Open(const std::vector<int>& gpus, const std::string& library) {
  Close();
  lib_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    const char* why = ::dlerror();
    return Status::NotFound("GPU utilisation: cannot load " + library + " (" +
                            (why ? why : "unknown") +
                            "): no NVIDIA driver on this node; GPU-UTILS shows n/a");
  }
  void* init = ::dlsym(lib_, "nvmlInit_v2");
  void* count = ::dlsym(lib_, "nvmlDeviceGetCount_v2");
  void* handle = ::dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2");
  void* rates = ::dlsym(lib_, "nvmlDeviceGetUtilizationRates");
  void* shutdown = ::dlsym(lib_, "nvmlShutdown");
  if (!init || !count || !handle || !rates || !shutdown) {
    Close();
    return Status::FailedPrecondition(
        "GPU utilisation: " + library +
        " lacks the NVML functions (nvmlInit_v2, "
        "nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, "
        "nvmlDeviceGetUtilizationRates, nvmlShutdown): not an NVML library");
  }
  if (int rc = reinterpret_cast<int (*)()>(init)(); rc != kNvmlSuccess) {
    Close();
    return Status::FailedPrecondition("GPU utilisation: nvmlInit_v2 failed with NVML error " +
                                      std::to_string(rc) +
                                      " (is the driver loaded? nvidia-smi says)");
  }
  shutdown_ = reinterpret_cast<int (*)()>(shutdown);
  utilization_ = reinterpret_cast<int (*)(void*, unsigned int*)>(rates);
  unsigned int n = 0;
  if (int rc = reinterpret_cast<int (*)(unsigned int*)>(count)(&n); rc != kNvmlSuccess) {
    Close();
    return Status::FailedPrecondition(
        "GPU utilisation: nvmlDeviceGetCount_v2 failed with NVML error " + std::to_string(rc));
  }
  std::vector<int> which = gpus;
  for (unsigned int i = 0; gpus.empty() && i < n; ++i) which.push_back(static_cast<int>(i));
  auto get = reinterpret_cast<int (*)(unsigned int, void**)>(handle);
  for (int i : which) {
    void* dev = nullptr;
    if (i < 0 || static_cast<unsigned int>(i) >= n ||
        get(static_cast<unsigned int>(i), &dev) != kNvmlSuccess) {
      Close();
      return Status::InvalidArgument("GPU utilisation: GPU " + std::to_string(i) +
                                     " is not one of the " + std::to_string(n) +
                                     " devices NVML lists; check --gpus");
    }
    devices_.push_back(dev);
  }
  return Status::OK();
}

double GpuUtilization::Sample() const {
  if (utilization_ == nullptr || devices_.empty()) return -1;
  double sum = 0;
  for (void* dev : devices_) {
    unsigned int rates[2] = {0, 0};  // nvmlUtilization_t {gpu, memory}
    if (utilization_(dev, rates) != kNvmlSuccess) return -1;
    sum += rates[0] > 100 ? 100 : rates[0];
  }
  return sum / static_cast<double>(devices_.size());
}

}  // namespace edl::jobclient
