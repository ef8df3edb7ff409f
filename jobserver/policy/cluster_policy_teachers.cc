// The cluster policy's step 5 (cluster_policy.h): the capacity left to distillation teachers.
#include "jobserver/policy/cluster_policy.h"

namespace edl::jobserver {

std::map<std::string, int> ClusterPolicy::FreeSlotsByNode() const {
  // Not FreeOn: a reservation holds slots for a blocked job against other jobs; a teacher there
  // is stopped as soon as the job takes them, so it may use them meanwhile.
  std::map<std::string, int> free;
  for (const auto& [name, node] : nodes_) free[name] = node.slots - node.used;
  return free;
}

}  // namespace edl::jobserver
