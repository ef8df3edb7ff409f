#include "edl/runtime/comm/nccl_reform.h"

#include <cstdio>
#include <unordered_map>

namespace edl::runtime {

const char* NcclBuildName(NcclBuild b) {
  switch (b) {
    case NcclBuild::kInit:
      return "init";
    case NcclBuild::kShrink:
      return "shrink";
    case NcclBuild::kShrinkAbort:
      return "shrink_abort";
  }
  return "?";
}

NcclBuildPlan PlanNcclBuild(const std::vector<std::string>& current,
                            const std::vector<std::string>& next, bool failure, bool parent_usable,
                            int nccl_version) {
  NcclBuildPlan plan;
  if (current.empty()) {
    plan.why = "no current communicator";
    return plan;
  }
  if (nccl_version < kNcclShrinkMinVersion) {
    plan.why = "NCCL " + std::to_string(nccl_version) +
               " has no ncclCommShrink (needs >= " + std::to_string(kNcclShrinkMinVersion) + ")";
    return plan;
  }
  if (!parent_usable) {
    plan.why = "the current communicator is no longer usable";
    return plan;
  }
  if (next.size() >= current.size()) {
    plan.why = "not a shrink (" + std::to_string(current.size()) + " -> " +
               std::to_string(next.size()) + " members)";
    return plan;
  }
  std::unordered_map<std::string, int> old_rank;
  for (size_t i = 0; i < current.size(); ++i) old_rank.emplace(current[i], static_cast<int>(i));
  int last = -1;
  std::vector<bool> kept(current.size(), false);
  for (const std::string& m : next) {
    auto it = old_rank.find(m);
    if (it == old_rank.end()) {
      plan.why = "trainer " + m + " joins (a shrink only removes ranks)";
      return plan;
    }
    if (it->second <= last) {
      plan.why = "the survivors changed their relative order (trainer " + m + ")";
      return plan;
    }
    last = it->second;
    kept[it->second] = true;
  }
  for (size_t i = 0; i < current.size(); ++i) {
    if (!kept[i]) plan.excluded.push_back(static_cast<int>(i));
  }
  plan.build = failure ? NcclBuild::kShrinkAbort : NcclBuild::kShrink;
  plan.why = std::to_string(plan.excluded.size()) + " of " + std::to_string(current.size()) +
             " ranks leave, the survivors keep their order";
  return plan;
}

std::string DuplicateGpuMessage(const std::string& nccl_error,
                                const std::vector<std::string>& rank_names, int64_t generation) {
  const size_t at = nccl_error.find("Duplicate GPU detected");
  if (at == std::string::npos) return "";
  int a = -1, b = -1;
  unsigned long long bus = 0;
  const int got = std::sscanf(
      nccl_error.c_str() + at,
      "Duplicate GPU detected : rank %d and rank %d both on CUDA device %llx", &a, &b, &bus);
  auto name = [&](int r) {
    std::string s = "rank " + std::to_string(r);
    if (r >= 0 && r < static_cast<int>(rank_names.size()) && !rank_names[r].empty()) {
      s = "trainer " + rank_names[r] + " (" + s + ")";
    }
    return s;
  };
  std::string msg = "NCCL refused generation " + std::to_string(generation) + ": ";
  if (got >= 2) {
    msg += name(a) + " and " + name(b) + " are on the same GPU";
    if (got == 3) {
      char hex[32];
      std::snprintf(hex, sizeof(hex), "%llx", bus);
      msg += std::string(" (PCI bus id ") + hex + ")";
    }
  } else {
    msg += "two trainers are on the same GPU (" + nccl_error.substr(at) + ")";
  }
  msg +=
      ", and one NCCL communicator takes one GPU per rank. Give each trainer its own GPU: "
      "`edl train --cuda_device N` (default: the slot, or LOCAL_RANK, modulo the visible GPUs), "
      "`edl client "
      "--gpus` (one CUDA_VISIBLE_DEVICES per slot), at most as many trainers per node as GPUs; "
      "or use --comm gloo to share a GPU";
  return msg;
}

}  // namespace edl::runtime
