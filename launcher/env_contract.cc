// BuildTrainerEnv: the trainer env contract of DESIGN.md as key/value pairs.
#include <string>

#include "launcher/launcher.h"

namespace edl::launcher {

std::map<std::string, std::string> BuildTrainerEnv(const EnvContract& c) {
  std::map<std::string, std::string> e;
  e[env::kJobId] = c.job_id;
  e[env::kTrainerId] = c.trainer_id;
  if (!c.client_socket.empty()) e[env::kClientSocket] = c.client_socket;
  e[env::kGeneration] = std::to_string(c.generation);
  e[env::kSlot] = std::to_string(c.slot);
  if (!c.cuda_visible_devices.empty()) e[env::kCudaVisibleDevices] = c.cuda_visible_devices;
  e[env::kRank] = std::to_string(c.rank);
  e[env::kWorldSize] = std::to_string(c.world_size);
  e[env::kLocalRank] = std::to_string(c.local_rank);
  e[env::kLocalWorldSize] = std::to_string(c.local_world_size);
  e[env::kMasterAddr] = c.master_addr;
  e[env::kMasterPort] = std::to_string(c.master_port);
  if (c.joining) e[env::kJoining] = "1";
  return e;
}

}  // namespace edl::launcher
