// CreateNcclCommunicator, ShrinkNcclCommunicator and NcclRuntimeVersion in libedl: the NCCL
// communicator lives in the CUDA plugin (edl/runtime/cuda_plugin.h), so libedl never links NCCL or
// the CUDA runtime. These load the plugin on first use and call its entry points; without the
// plugin, or with one built without NCCL, the answer is FailedPrecondition naming what is missing
// and the fix (NcclRuntimeVersion: 0).
#include "edl/runtime/comm/communicator.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include <glog/logging.h>

#include "edl/runtime/cuda_plugin.h"

namespace edl::runtime {
namespace {

using Made = StatusOr<std::unique_ptr<Communicator>>;

// The plugin function `name`, or the FailedPrecondition that says why there is none.
template <typename F>
StatusOr<F*> NcclEntry(const char* name, int64_t generation) {
  auto fn = CudaPluginFunction<F>(name);
  if (fn.ok()) return fn;
  if (fn.status().IsNotFound()) {
    return Status::FailedPrecondition(
        "NCCL communicator requested (generation " + std::to_string(generation) +
        ") but the CUDA plugin " + CudaPluginPath() +
        " was built without NCCL; install NCCL under the CUDA toolkit and rebuild "
        "(cmake -DEDL_USE_NCCL=ON), or use --comm gloo");
  }
  return Status::FailedPrecondition("NCCL communicator requested (generation " +
                                    std::to_string(generation) + "): " + fn.status().message() +
                                    "; or use --comm gloo");
}

}  // namespace

std::string InterfaceOfAddress(const std::string& ip) {
  in_addr v4{};
  in6_addr v6{};
  const bool is4 = inet_pton(AF_INET, ip.c_str(), &v4) == 1;
  const bool is6 = !is4 && inet_pton(AF_INET6, ip.c_str(), &v6) == 1;
  if (!is4 && !is6) return "";
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string name;
  for (ifaddrs* a = all; a != nullptr && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_name == nullptr) continue;
    if (is4 && a->ifa_addr->sa_family == AF_INET &&
        std::memcmp(&reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, &v4, sizeof(v4)) == 0) {
      name = a->ifa_name;
    } else if (is6 && a->ifa_addr->sa_family == AF_INET6 &&
               std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6,
                           sizeof(v6)) == 0) {
      name = a->ifa_name;
    }
  }
  freeifaddrs(all);
  return name;
}

std::string DefaultNcclSocketIfname(const std::string& host) {
  static std::mutex mu;  // one setenv, before any NCCL init of this process reads the variable
  std::lock_guard<std::mutex> lock(mu);
  if (const char* set = std::getenv("NCCL_SOCKET_IFNAME"); set != nullptr && *set != '\0')
    return set;
  const std::string iface = InterfaceOfAddress(host);
  if (iface.empty()) return "";
  const std::string value = "=" + iface;
  ::setenv("NCCL_SOCKET_IFNAME", value.c_str(), /*overwrite=*/0);
  LOG(INFO) << "NCCL_SOCKET_IFNAME=" << value << ": the interface of this trainer's address "
            << host << " (set NCCL_SOCKET_IFNAME to choose another)";
  return value;
}

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
  (void)DefaultNcclSocketIfname(options.host);
  using Entry = void(const CommOptions*, Made*);
  auto fn = NcclEntry<Entry>("edl_cuda_new_nccl_communicator_v1", options.generation);
  if (!fn.ok()) return fn.status();
  Made out(Status::Internal("the CUDA plugin's NCCL entry point returned nothing"));
  fn.value()(&options, &out);
  return out;
}

StatusOr<std::unique_ptr<Communicator>> ShrinkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, bool abort_parent,
    const CommOptions& options) {
  using Entry = void(Communicator*, const std::vector<int>*, bool, const CommOptions*, Made*);
  auto fn = NcclEntry<Entry>("edl_cuda_shrink_nccl_communicator_v1", options.generation);
  if (!fn.ok()) return fn.status();
  Made out(Status::Internal("the CUDA plugin's NCCL shrink entry point returned nothing"));
  fn.value()(parent, &excluded_ranks, abort_parent, &options, &out);
  return out;
}

int NcclRuntimeVersion() {
  auto fn = CudaPluginFunction<int()>("edl_cuda_nccl_version_v1");
  return fn.ok() ? fn.value()() : 0;
}

}  // namespace edl::runtime
