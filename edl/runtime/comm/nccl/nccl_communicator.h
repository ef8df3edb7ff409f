// NCCL extras beyond the Communicator interface (communicator.h declares CreateNcclCommunicator).
// Only in builds with EDL_HAVE_NCCL (edl/runtime/comm/nccl/sources.cmake).
//
// Thread-safety: as Communicator.
#pragma once

#include <memory>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {

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
