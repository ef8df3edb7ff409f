// The NCCL communicator's entry points inside the CUDA plugin libedl_cuda.so (built with
// EDL_HAVE_NCCL, edl/runtime/comm/nccl/sources.cmake). libedl reaches them through
// CreateNcclCommunicator, ShrinkNcclCommunicator and NcclRuntimeVersion (communicator.h,
// comm/nccl_plugin.cc), which load the plugin; code that links the plugin may call them directly.
//
// Thread-safety: as Communicator.
#pragma once

#include <memory>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

// CreateNcclCommunicator's implementation.
StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options);

// ShrinkNcclCommunicator's implementation (see there). Speed against a fresh init: UNMEASURED
// (a shrink needs two GPUs; the GPU runs so far had one).
StatusOr<std::unique_ptr<Communicator>> NewShrunkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, bool abort_parent,
    const CommOptions& options);

// ncclGetVersion of the NCCL library this process runs with, 0 if it fails.
int NcclVersion();

}  // namespace edl::runtime
