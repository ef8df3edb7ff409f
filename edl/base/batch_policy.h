// BatchPolicy: how a job's batch follows its world size, and its names on the command line
// (--batch_policy) and on the wire (a progress report's `batch_policy`, edl/proto/PROTOCOL.md). The
// runtime's data plan (edl/runtime/data_plan.h) splits each step by it; the job server's goodput
// model (jobserver/policy/goodput_feed.h) predicts other world sizes by it.
//
// Thread-safety: constants.
#pragma once

#include "edl/base/enum_names.h"

namespace edl {

enum class BatchPolicy {
  kFixedLocal,   // every rank takes `batch`; global batch = world * batch (default)
  kFixedGlobal,  // global batch `batch` split across ranks, remainder to the lowest ranks
};
inline constexpr EnumNames<BatchPolicy, 2> kBatchPolicyNames({"fixed-local", "fixed-global"});

}  // namespace edl
