// CreateNcclCommunicator for builds without NCCL (EDL_HAVE_NCCL == 0): always FailedPrecondition.
// The real implementation lives in edl/runtime/comm/nccl/ and is compiled instead when NCCL is found.
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
  return Status::FailedPrecondition(
      "NCCL communicator requested (generation " + std::to_string(options.generation) +
      ") but this edl was built without NCCL; rebuild with the CUDA toolkit and NCCL installed "
      "(EDL_USE_NCCL=ON) or use the gloo backend");
}

}  // namespace edl::runtime
