// NCCL extras beyond the Communicator interface (communicator.h declares CreateNcclCommunicator,
// which loads the CUDA plugin and calls NewNcclCommunicator there). Only in the CUDA plugin
// libedl_cuda.so of builds with EDL_HAVE_NCCL (edl/runtime/comm/nccl/sources.cmake); code that
// calls these directly (the NCCL tests) links the plugin.
//
// Thread-safety: as Communicator.
#pragma once

#include <memory>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

// The NCCL communicator itself (CreateNcclCommunicator's implementation inside the plugin).
StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options);

// Builds the communicator of a pure shrink (generation g+1 = the ranks of `parent` minus
// `excluded_ranks`, survivors keeping their relative order) with ncclCommShrink instead of a fresh
// unique-id rendezvous. For planned shrinks only: `parent` must be a healthy communicator from
// CreateNcclCommunicator with no collective in flight (after a failure it has been aborted, and
// the runtime re-forms with CreateNcclCommunicator). options.rank/world_size must be this rank's
// place in the shrunk communicator; options.store and key_prefix are not used; cuda_stream as for
// CreateNcclCommunicator. The parent stays owned by the caller and is destroyed afterwards.
//
// Every surviving rank must call this with the same `excluded_ranks`; excluded ranks must not.
// Speed against a fresh init: UNMEASURED (no GPU was available when this was written); the
// elastic runtime currently always re-forms with CreateNcclCommunicator.
StatusOr<std::unique_ptr<Communicator>> ShrinkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, const CommOptions& options);

}  // namespace edl::runtime
