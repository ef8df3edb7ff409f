#include "edl/runtime/env_contract.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

namespace edl::runtime {

namespace {

// The hint every error ends with: who sets these variables.
constexpr const char* kWhoSets =
    "(the edl client and `edl launch` set it; unset it to run standalone)";

const std::string* Find(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// Strict decimal integer in [lo, hi]; InvalidArgument naming the variable otherwise.
Status ParseInt(const std::map<std::string, std::string>& env, const char* name, int64_t lo,
                int64_t hi, int64_t* out, const char* hint = kWhoSets) {
  const std::string* v = Find(env, name);
  if (v == nullptr) return Status::OK();  // *out keeps its default
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE) {
    return Status::InvalidArgument(std::string(name) + "='" + *v + "' is not an integer " + hint);
  }
  if (x < lo || x > hi) {
    return Status::InvalidArgument(std::string(name) + "=" + *v + " is outside [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "] " + hint);
  }
  *out = x;
  return Status::OK();
}

Status ParseInt(const std::map<std::string, std::string>& env, const char* name, int64_t lo,
                int64_t hi, int* out, const char* hint = kWhoSets) {
  int64_t x = *out;
  EDL_RETURN_IF_ERROR(ParseInt(env, name, lo, hi, &x, hint));
  *out = static_cast<int>(x);
  return Status::OK();
}

// "1" is true, "0" or unset false; anything else is an error (a typo must not flip the mode).
Status ParseFlag(const std::map<std::string, std::string>& env, const char* name, bool* out) {
  const std::string* v = Find(env, name);
  if (v != nullptr && *v != "0" && *v != "1") {
    return Status::InvalidArgument(std::string(name) + "='" + *v + "' must be 1 or 0 " + kWhoSets);
  }
  *out = v != nullptr && *v == "1";
  return Status::OK();
}

void SetString(const std::map<std::string, std::string>& env, const char* name, std::string* out) {
  if (const std::string* v = Find(env, name)) *out = *v;
}

}  // namespace

int EnvContract::TrainersOnNode() const {
  if (local_trainers > 0) return local_trainers;
  return has_world && local_world_size > 0 ? local_world_size : 1;
}

int EnvContract::DeviceHint() const { return client_socket.empty() ? local_rank : slot; }

std::map<std::string, std::string> BuildTrainerEnv(const EnvContract& c) {
  std::map<std::string, std::string> e;
  e[env::kJobId] = c.job_id;
  e[env::kTrainerId] = c.trainer_id;
  if (!c.client_socket.empty()) e[env::kClientSocket] = c.client_socket;
  if (c.restart_mode) e[env::kRestartMode] = "1";
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
  if (c.spare != SpareKind::kNone) e[env::kSpare] = c.spare == SpareKind::kFull ? "full" : "host";
  if (!c.rendezvous_dir.empty()) e[env::kRendezvousDir] = c.rendezvous_dir;
  if (c.local_trainers > 0) e[env::kLocalTrainers] = std::to_string(c.local_trainers);
  e[env::kGroupRank] = std::to_string(c.group_rank);
  e[env::kGroupWorldSize] = std::to_string(c.group_world_size);
  e[env::kRoleRank] = std::to_string(c.rank);
  e[env::kRoleWorldSize] = std::to_string(c.world_size);
  e[env::kRoleName] = env::kDefaultRoleName;
  e[env::kRestartCount] = std::to_string(c.restart_count);
  e[env::kMaxRestarts] = std::to_string(c.max_restarts);
  e[env::kRunId] = c.job_id;
  return e;
}

StatusOr<EnvContract> ParseTrainerEnv(const std::map<std::string, std::string>& env) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  EnvContract c;
  SetString(env, env::kRunId, &c.job_id);  // torchrun's name for it; EDL_JOB_ID wins
  SetString(env, env::kJobId, &c.job_id);
  SetString(env, env::kTrainerId, &c.trainer_id);
  SetString(env, env::kClientSocket, &c.client_socket);
  SetString(env, env::kCudaVisibleDevices, &c.cuda_visible_devices);
  SetString(env, env::kMasterAddr, &c.master_addr);
  SetString(env, env::kRendezvousDir, &c.rendezvous_dir);
  EDL_RETURN_IF_ERROR(ParseFlag(env, env::kRestartMode, &c.restart_mode));
  EDL_RETURN_IF_ERROR(ParseFlag(env, env::kJoining, &c.joining));
  if (const std::string* v = Find(env, env::kSpare)) {
    if (*v != "full" && *v != "host") {
      return Status::InvalidArgument(std::string(env::kSpare) + "='" + *v +
                                     "' must be full or host " + kWhoSets);
    }
    c.spare = *v == "full" ? SpareKind::kFull : SpareKind::kHost;
  }
  EDL_RETURN_IF_ERROR(
      ParseInt(env, env::kGeneration, 0, std::numeric_limits<int64_t>::max(), &c.generation));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kSlot, 0, kIntMax, &c.slot));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kMasterPort, 0, 65535, &c.master_port));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kLocalTrainers, 0, kIntMax, &c.local_trainers,
                               "(your setting: the trainers sharing this node's cores; unset it "
                               "to use LOCAL_WORLD_SIZE)"));

  const bool has_rank = Find(env, env::kRank) != nullptr;
  c.has_world = Find(env, env::kWorldSize) != nullptr;
  if (has_rank != c.has_world) {
    return Status::InvalidArgument(std::string(has_rank ? env::kRank : env::kWorldSize) +
                                   " is set but " + (has_rank ? env::kWorldSize : env::kRank) +
                                   " is not: set both (static or elastic world) or neither "
                                   "(standalone)");
  }
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kWorldSize, 1, kIntMax, &c.world_size));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kRank, 0, c.world_size - 1, &c.rank));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kLocalWorldSize, 1, kIntMax, &c.local_world_size));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kLocalRank, 0, c.local_world_size - 1, &c.local_rank));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kGroupWorldSize, 1, kIntMax, &c.group_world_size));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kGroupRank, 0,
                               Find(env, env::kGroupWorldSize) ? c.group_world_size - 1 : kIntMax,
                               &c.group_rank));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kMaxRestarts, 0, kIntMax, &c.max_restarts));
  EDL_RETURN_IF_ERROR(ParseInt(env, env::kRestartCount, 0, kIntMax, &c.restart_count));

  if (c.client_socket.empty()) {
    if (c.joining) {
      return Status::InvalidArgument(std::string(env::kJoining) + "=1 needs " + env::kClientSocket +
                                     ": only an edl client starts hot joiners");
    }
    if (c.restart_mode) {
      return Status::InvalidArgument(std::string(env::kRestartMode) + "=1 needs " +
                                     env::kClientSocket + ": restart mode is an edl client's");
    }
    if (c.spare != SpareKind::kNone) {
      return Status::InvalidArgument(std::string(env::kSpare) + " needs " + env::kClientSocket +
                                     ": only an edl client starts spares");
    }
  } else {
    if (c.trainer_id.empty()) {
      return Status::InvalidArgument(std::string(env::kClientSocket) + " is set but " +
                                     env::kTrainerId + " is not " + kWhoSets);
    }
    if (c.joining && c.restart_mode) {
      return Status::InvalidArgument(std::string(env::kJoining) + "=1 and " + env::kRestartMode +
                                     "=1 together: restart mode has no hot joiners");
    }
    if (c.spare != SpareKind::kNone && (c.joining || c.restart_mode)) {
      return Status::InvalidArgument(std::string(env::kSpare) + " with " +
                                     (c.joining ? env::kJoining : env::kRestartMode) +
                                     "=1: a spare learns whether it joins from its assignment");
    }
  }
  return c;
}

StatusOr<EnvContract> TrainerEnvFromProcess() {
  std::map<std::string, std::string> env;
  for (const char* name : env::kAll) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return ParseTrainerEnv(env);
}

}  // namespace edl::runtime
