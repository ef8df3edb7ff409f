// CreateNcclCommunicator, ShrinkNcclCommunicator and NcclRuntimeVersion in libedl: the NCCL
// communicator lives in the CUDA plugin (edl/runtime/cuda_plugin.h), so libedl never links NCCL or
// the CUDA runtime. These load the plugin on first use and call its entry points; without the
// plugin, or with one built without NCCL, the answer is FailedPrecondition naming what is missing
// and the fix (NcclRuntimeVersion: 0).
#include "edl/runtime/comm/communicator.h"
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

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
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
