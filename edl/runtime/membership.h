// MembershipSource: how the elastic runtime learns the job's committed generations and talks back
// to the control plane. In production it is a thin adapter over net::TrainerChannel (the node
// client over EDL_CLIENT_SOCKET); in static mode (`edl launch`, no server) a fixed generation from
// RANK / WORLD_SIZE; in tests an in-process fake shared by several trainer threads. Which one a
// trainer gets is the runtime's choice from the env contract: edl/runtime/run_mode.h.
//
// Thread-safety: implementations are thread-safe; the runtime calls Latest()/WaitGeneration() from
// its training thread and from a watcher thread at the same time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/batch_policy.h"
#include "edl/base/status.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::proto {
struct ServiceMembers;
}

namespace edl::runtime {

// One committed generation as the runtime needs it (a projection of proto::GenerationInfo).
struct Generation {
  int64_t number = 0;                // strictly increasing across the job
  std::vector<std::string> members;  // trainer ids ordered by rank: survivors keep relative
                                     // order, joiners come last
  bool failure = false;  // the change removed a dead or hung trainer: survivors must abort
  std::string reason;    // "start", "script", "ctl", "failure", ... (for events)
  std::vector<std::string> hosts;  // by rank: address each member's communicator binds (empty or
                                   // "" entries: ElasticOptions::host / loopback)

  int world_size() const { return static_cast<int>(members.size()); }
  // Rank of `trainer_id` in this generation, -1 when it is not a member (a leaving trainer).
  int RankOf(const std::string& trainer_id) const;
};

// Mirrors net::ProgressReport.
struct ProgressInfo {
  int64_t generation = 0, step = 0, epoch = 0;
  double loss = 0, images_per_sec = 0;
  int world_size = 0;
  double accuracy = -1;  // -1: not evaluated
  int64_t samples = -1;  // the job's samples committed through `step` (proto::ProgressReport)
  // What the job measures of itself (proto::ProgressReport; self_measure.h).
  int64_t noise_steps = 0;
  double grad_sqr = 0, grad_var = 0, noise_scale = -1;
  double compute_s_per_sample = -1, sync_s = -1;
  int64_t batch = 0;  // the job's batch and its policy (proto::ProgressReport); 0: not reported
  BatchPolicy batch_policy = BatchPolicy::kFixedLocal;
};

// The member lists of a distillation service, relayed by the trainer's node client (PROTOCOL.md,
// "Services"): the trainer needs no server address of its own.
class ServiceFeed {
 public:
  virtual ~ServiceFeed() = default;
  virtual Status Watch(const std::string& service) = 0;
  // Waits up to `timeout` for a list of `service` newer than *version (0: none yet) and updates
  // *version. Timeout when none came; Unavailable when the way to the client broke.
  virtual Status Next(const std::string& service, uint64_t* version,
                      std::chrono::milliseconds timeout, proto::ServiceMembers* out) = 0;
};

class MembershipSource {
 public:
  virtual ~MembershipSource() = default;

  // This trainer's id, stable for the process's life (EDL_TRAINER_ID).
  virtual std::string trainer_id() const = 0;
  // Newest committed generation received; false if none yet.
  virtual bool Latest(Generation* out) = 0;
  // Blocks until a committed generation with number > `after` is known (returns at once if one
  // is) and stores it in *out; Timeout after `timeout`.
  virtual Status WaitGeneration(int64_t after, std::chrono::milliseconds timeout,
                                Generation* out) = 0;
  // Rendezvous store; keys carry the generation. Never null; owned by the source.
  virtual KvStore* kv() = 0;
  // A joiner finished preparing (model built, data ready) and may be committed.
  virtual Status ReportReady(int64_t generation) = 0;
  virtual Status ReportProgress(const ProgressInfo& progress) = 0;
  // One event for the job's events log (JSON object; the control plane adds job, trainer, time).
  virtual Status ReportEvent(const nlohmann::json& event) = 0;
  // Service member lists through the node's client; null without one (static, standalone).
  // Owned by the source.
  virtual ServiceFeed* service_feed() { return nullptr; }
};

// Static mode: a single generation (number `generation`, members "rank-0".."rank-<world-1>")
// that never changes, over `kv`. REQUIRES: 0 <= rank < world.
std::unique_ptr<MembershipSource> NewStaticMembership(int rank, int world, int64_t generation,
                                                      std::unique_ptr<KvStore> kv);

}  // namespace edl::runtime
