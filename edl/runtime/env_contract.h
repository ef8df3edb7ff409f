// The trainer env contract: what a trainer process learns from its environment, in both
// directions, in one place (docs/ARCHITECTURE.md, "Env contract").
//
//   - the parent side (the `edl client` of a node, `edl launch`) fills an EnvContract and puts
//     BuildTrainerEnv(c) into the child's environment (launcher::TrainerSpec::env);
//   - the trainer side (edl/runtime/run_mode.h, the model app) reads it back with
//     TrainerEnvFromProcess() / ParseTrainerEnv(), which check every variable and say which one
//     is wrong and how to fix it.
//
// Every variable name lives in namespace env below; nothing else in the tree spells an "EDL_..."
// trainer variable. The variables (docs/TRAINERS.md's "Restart mode" table is the user-facing
// copy):
//
//   EDL_JOB_ID, EDL_TRAINER_ID       job and stable trainer id (unique in the job)
//   EDL_CLIENT_SOCKET                the node client's Unix socket; set only under a client
//   EDL_RESTART_MODE=1               the client runs in restart mode (torchrun-style)
//   EDL_GENERATION, EDL_SLOT         generation the trainer was started in, slot / GPU index
//   EDL_JOINING=1                    a hot joiner (in-place mode)
//   EDL_SPARE=full|host              a warm spare (in-place mode): prepare, then wait for the
//                                    client to assign an identity (edl/runtime/run_mode.h);
//                                    full: model and device too, host: the device (CUDA_VISIBLE_
//                                    DEVICES) is named only by the assignment, so nothing may
//                                    touch it before
//   EDL_RENDEZVOUS_DIR               static mode: the FileKvStore directory of this run
//   EDL_LOCAL_TRAINERS               user override of the trainers sharing this node's cores
//   RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT   torchrun-style
//   GROUP_RANK GROUP_WORLD_SIZE      torchrun's node ("group") index in the generation and count
//   ROLE_RANK ROLE_WORLD_SIZE ROLE_NAME   torchrun's role: one role, "default" (= RANK, WORLD_SIZE)
//   TORCHELASTIC_RESTART_COUNT       restarts of the trainer set before this start
//   TORCHELASTIC_MAX_RESTARTS        restarts allowed (2147483647 under an edl client: no bound)
//   TORCHELASTIC_RUN_ID              the job id (= EDL_JOB_ID; torchrun's --rdzv_id)
//   (TORCHELASTIC_USE_AGENT_STORE is never set: rank 0's init_process_group hosts the TCPStore.)
//   CUDA_VISIBLE_DEVICES             the slot's GPU (GPU slots)
//   EDL_CUDA_PHASE_TIMES=1           diagnostics only: CUDA per-phase step times
//
// Thread-safety: pure functions, except TrainerEnvFromProcess (reads environ; do not call it
// while another thread calls setenv).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "edl/base/status.h"

namespace edl::runtime {

namespace env {
inline constexpr const char* kJobId = "EDL_JOB_ID";
inline constexpr const char* kTrainerId = "EDL_TRAINER_ID";
inline constexpr const char* kClientSocket = "EDL_CLIENT_SOCKET";
inline constexpr const char* kRestartMode = "EDL_RESTART_MODE";
inline constexpr const char* kGeneration = "EDL_GENERATION";
inline constexpr const char* kSlot = "EDL_SLOT";
inline constexpr const char* kJoining = "EDL_JOINING";
inline constexpr const char* kSpare = "EDL_SPARE";
inline constexpr const char* kRendezvousDir = "EDL_RENDEZVOUS_DIR";
inline constexpr const char* kLocalTrainers = "EDL_LOCAL_TRAINERS";
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
// torchrun's one role name, ROLE_NAME's value.
inline constexpr const char* kDefaultRoleName = "default";
// Diagnostics a user sets by hand (no parent writes it; read where it is used, not parsed here):
// "1" makes the CUDA backend print GPU time per step phase (resnet50/cuda/cuda_backend.h).
inline constexpr const char* kCudaPhaseTimes = "EDL_CUDA_PHASE_TIMES";
// Every contract name above (the diagnostics excepted), for TrainerEnvFromProcess and tests.
inline constexpr const char* kAll[] = {
    kJobId,          kTrainerId, kClientSocket,   kRestartMode,   kGeneration,         kSlot,
    kJoining,        kSpare,     kRendezvousDir,  kLocalTrainers, kCudaVisibleDevices, kRank,
    kWorldSize,      kLocalRank, kLocalWorldSize, kMasterAddr,    kMasterPort,         kGroupRank,
    kGroupWorldSize, kRoleRank,  kRoleWorldSize,  kRoleName,      kRestartCount,       kMaxRestarts,
    kRunId};
}  // namespace env

// A warm spare's kind (EDL_SPARE): what it may prepare before its assignment.
enum class SpareKind { kNone, kFull, kHost };

struct EnvContract {
  std::string job_id;         // EDL_JOB_ID
  std::string trainer_id;     // EDL_TRAINER_ID: stable for the process's life, unique in the job
  std::string client_socket;  // EDL_CLIENT_SOCKET (unset when empty: no client)
  bool restart_mode = false;  // EDL_RESTART_MODE=1 (only with a client socket)
  int64_t generation = 0;     // EDL_GENERATION the trainer was started in
  int slot = 0;               // EDL_SLOT: slot / GPU index on the node
  std::string cuda_visible_devices;  // CUDA_VISIBLE_DEVICES (unset when empty)
  // torchrun-style, of the generation the trainer was started in. `has_world` is false when a
  // parsed environment had no RANK / WORLD_SIZE (standalone); BuildTrainerEnv always writes them.
  bool has_world = true;
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 0;                    // MASTER_PORT
  bool joining = false;  // EDL_JOINING=1 for a hot joiner (in-place mode); unset otherwise
  // EDL_SPARE (unset: kNone). A spare's trainer_id is its spare id, its world_size the world it
  // expects to join (warm-up), its local_world_size the joiners' (1); the rest is the assignment's.
  SpareKind spare = SpareKind::kNone;
  std::string rendezvous_dir;  // EDL_RENDEZVOUS_DIR (unset when empty)
  int local_trainers = 0;      // EDL_LOCAL_TRAINERS (unset when 0); never set by EDL itself
  // torchrun's node ("group") view: this node's index among the generation's nodes (in the order
  // their first rank appears) and how many nodes the generation spans. ROLE_RANK / ROLE_WORLD_SIZE
  // / ROLE_NAME are written from rank / world_size / "default" (one role) and not read back.
  int group_rank = 0, group_world_size = 1;  // GROUP_RANK, GROUP_WORLD_SIZE
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: restarts of the trainer set so far
  int max_restarts = 0;   // TORCHELASTIC_MAX_RESTARTS (kUnboundedRestarts: no bound)
  // TORCHELASTIC_RUN_ID is written from job_id; read back into job_id when EDL_JOB_ID is unset
  // (a trainer started by torchrun itself).

  // max_restarts under an edl client, which restarts trainers as often as the job changes.
  static constexpr int kUnboundedRestarts = 2147483647;

  // Trainers sharing this node's cores: EDL_LOCAL_TRAINERS, else LOCAL_WORLD_SIZE, at least 1.
  int TrainersOnNode() const;
  // The device a trainer takes by default, as an index into the visible devices (modulo their
  // count): its slot when an edl client started it (the slot is the node's GPU index, whatever
  // the trainer's rank; a joiner's or a spare's LOCAL_RANK says nothing about its GPU), else
  // LOCAL_RANK (torchrun, `edl launch`). Under --gpus the client also sets CUDA_VISIBLE_DEVICES
  // to the slot's GPU alone, which is then device 0 either way.
  int DeviceHint() const;
};

// The env entries for `c`, to put into launcher::TrainerSpec::env.
std::map<std::string, std::string> BuildTrainerEnv(const EnvContract& c);

// Reads the contract back from `env` (name -> value; other names are ignored). An empty value
// counts as unset. InvalidArgument naming the variable and the fix when a value is malformed
// (not an integer, out of range: RANK outside [0, WORLD_SIZE), a port outside [0, 65535]) or
// the combination is inconsistent (RANK without WORLD_SIZE, EDL_JOINING, EDL_SPARE or
// EDL_RESTART_MODE without EDL_CLIENT_SOCKET, EDL_CLIENT_SOCKET without EDL_TRAINER_ID, EDL_SPARE
// with EDL_JOINING or EDL_RESTART_MODE).
StatusOr<EnvContract> ParseTrainerEnv(const std::map<std::string, std::string>& env);

// ParseTrainerEnv over this process's environment (the names in env::kAll).
StatusOr<EnvContract> TrainerEnvFromProcess();

}  // namespace edl::runtime
