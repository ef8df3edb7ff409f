// CreateNcclCommunicator for builds without the NCCL communicator (EDL_HAVE_NCCL == 0, or
// edl/runtime/comm/nccl/ not present): always FailedPrecondition. The real implementation in
// edl/runtime/comm/nccl/ is compiled instead when NCCL is found.
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
  return Status::FailedPrecondition(
      "NCCL communicator requested (generation " + std::to_string(options.generation) +
      ") but this edl was built without the NCCL communicator; rebuild with the CUDA "
      "toolkit and NCCL installed (EDL_USE_NCCL=ON) or use the gloo backend");
}

}  // namespace edl::runtime
