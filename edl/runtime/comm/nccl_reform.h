// The NCCL re-form decisions that need no GPU (docs/ARCHITECTURE.md, "The NCCL re-form state
// machine"), in libedl so that they are tested on CPU: whether the next generation's communicator
// is a shrink of the current one (ncclCommShrink) or a fresh init, and how a NCCL error that
// names two ranks (two trainers on one GPU) reads for the user.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace edl::runtime {

// ncclCommShrink (and its NCCL_SHRINK_ABORT flag) exist from NCCL 2.27.0 on (NCCL_VERSION_CODE).
inline constexpr int kNcclShrinkMinVersion = 22700;

enum class NcclBuild {
  kInit,         // a fresh unique-id rendezvous and ncclCommInitRankConfig
  kShrink,       // ncclCommShrink of the current, healthy communicator (planned shrink)
  kShrinkAbort,  // ncclCommShrink with NCCL_SHRINK_ABORT (a failure; the dead ranks excluded)
};

const char* NcclBuildName(NcclBuild b);  // "init", "shrink", "shrink_abort"

struct NcclBuildPlan {
  NcclBuild build = NcclBuild::kInit;
  std::vector<int> excluded;  // kShrink*: the ranks of the current generation left out, ascending
  std::string why;            // one line: why this build (logged, and in the re-form event)
};

// How a member of `next` builds its communicator, given the current generation's members
// (`current`, rank order; empty when this trainer has no communicator), whether `next` is a
// failure generation, whether the current communicator is still usable (not failed; with a
// failure it may have been aborted by the watcher: then only an init can follow) and the NCCL
// version found at run time (0: none). A shrink applies when every member of `next` was a member
// of `current` and the survivors keep their relative order (the server pushes survivors in their
// previous order, joiners after them: edl/proto/PROTOCOL.md); anything else is an init. Every
// member of `next` decides the same from the same inputs, except `parent_usable`, which the
// runtime makes agree by shrinking only when the current communicator's last collective succeeded
// on every rank (a planned switch) or, for a failure, only with NCCL_SHRINK_ABORT.
NcclBuildPlan PlanNcclBuild(const std::vector<std::string>& current,
                            const std::vector<std::string>& next, bool failure, bool parent_usable,
                            int nccl_version);

// The user-facing error for a NCCL error string that reports two ranks on one GPU ("Duplicate GPU
// detected : rank 1 and rank 0 both on CUDA device 1000"), naming both trainers (`rank_names`,
// may be short or empty) and the fix; empty when `nccl_error` is not that error.
std::string DuplicateGpuMessage(const std::string& nccl_error,
                                const std::vector<std::string>& rank_names, int64_t generation);

}  // namespace edl::runtime
