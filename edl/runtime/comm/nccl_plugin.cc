// CreateNcclCommunicator in libedl: the NCCL communicator lives in the CUDA plugin
// (edl/runtime/cuda_plugin.h), so libedl never links NCCL or the CUDA runtime. This loads the
// plugin on first use and calls its entry point; without the plugin, or with one built without
// NCCL, the answer is FailedPrecondition naming what is missing and the fix.
#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/cuda_plugin.h"

namespace edl::runtime {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
  using Entry = void(const CommOptions*, StatusOr<std::unique_ptr<Communicator>>*);
  auto fn = CudaPluginFunction<Entry>("edl_cuda_new_nccl_communicator_v1");
  if (!fn.ok()) {
    if (fn.status().IsNotFound()) {
      return Status::FailedPrecondition(
          "NCCL communicator requested (generation " + std::to_string(options.generation) +
          ") but the CUDA plugin " + CudaPluginPath() +
          " was built without NCCL; install NCCL under the CUDA toolkit and rebuild "
          "(cmake -DEDL_USE_NCCL=ON), or use --comm gloo");
    }
    return Status::FailedPrecondition("NCCL communicator requested (generation " +
                                      std::to_string(options.generation) + "): " +
                                      fn.status().message() + "; or use --comm gloo");
  }
  StatusOr<std::unique_ptr<Communicator>> out(
      Status::Internal("the CUDA plugin's NCCL entry point returned nothing"));
  fn.value()(&options, &out);
  return out;
}

}  // namespace edl::runtime
