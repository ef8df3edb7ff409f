#include "edl/runtime/run_mode.h"

#include <algorithm>
#include <thread>

#include "edl/runtime/channel_membership.h"
#include "edl/runtime/comm/file_kv_store.h"
#include "edl/runtime/comm/memory_kv_store.h"

namespace edl::runtime {

namespace {

class PinnedMembership : public MembershipSource {
 public:
  PinnedMembership(std::unique_ptr<MembershipSource> base, int64_t generation)
      : base_(std::move(base)), generation_(generation) {}

  std::string trainer_id() const override { return base_->trainer_id(); }
  bool Latest(Generation* out) override {
    Generation g;
    if (!base_->Latest(&g) || g.number != generation_) return false;
    *out = std::move(g);
    return true;
  }
  Status WaitGeneration(int64_t after, std::chrono::milliseconds timeout,
                        Generation* out) override {
    if (after < generation_) {
      Generation g;
      EDL_RETURN_IF_ERROR(base_->WaitGeneration(generation_ - 1, timeout, &g));
      if (g.number != generation_) {
        return Status::Aborted("restart mode: generation " + std::to_string(generation_) +
                               " this trainer was started for was superseded by " +
                               std::to_string(g.number) + "; the edl client restarts it");
      }
      *out = std::move(g);
      return Status::OK();
    }
    std::this_thread::sleep_for(timeout);  // this process's generation never changes
    return Status::Timeout("restart mode: generation " + std::to_string(generation_) +
                           " never changes in a trainer's life; the edl client restarts trainers");
  }
  KvStore* kv() override { return base_->kv(); }
  ServiceFeed* service_feed() override { return base_->service_feed(); }
  Status ReportReady(int64_t generation) override { return base_->ReportReady(generation); }
  Status ReportProgress(const ProgressInfo& p) override { return base_->ReportProgress(p); }
  Status ReportEvent(const nlohmann::json& e) override { return base_->ReportEvent(e); }

 private:
  const std::unique_ptr<MembershipSource> base_;
  const int64_t generation_;
};

}  // namespace

const char* RunModeName(RunMode mode) {
  switch (mode) {
    case RunMode::kStandalone: return "standalone";
    case RunMode::kStatic: return "static";
    case RunMode::kElastic: return "elastic";
    case RunMode::kRestart: return "restart";
  }
  return "?";
}

void RunPlan::ApplyTo(ElasticOptions* options) const {
  options->joining = joining();
  options->join_generation = joining() ? env.generation : 0;
}

RunPlan PlanRun(const EnvContract& env) {
  RunPlan p;
  p.env = env;
  if (!env.client_socket.empty()) {
    p.mode = env.restart_mode ? RunMode::kRestart : RunMode::kElastic;
  } else if (env.has_world) {
    p.mode = RunMode::kStatic;
  } else {
    p.mode = RunMode::kStandalone;
  }
  return p;
}

StatusOr<RunPlan> PlanRunFromProcess() {
  StatusOr<EnvContract> env = TrainerEnvFromProcess();
  if (!env.ok()) return env.status();
  return PlanRun(env.value());
}

StatusOr<std::unique_ptr<MembershipSource>> Connect(const RunPlan& plan,
                                                    std::chrono::milliseconds timeout) {
  const EnvContract& e = plan.env;
  switch (plan.mode) {
    case RunMode::kElastic:
      return ConnectChannelMembership(e.client_socket, e.trainer_id, timeout);
    case RunMode::kRestart: {
      auto channel = ConnectChannelMembership(e.client_socket, e.trainer_id, timeout);
      if (!channel.ok()) return channel.status();
      return NewPinnedMembership(std::move(channel.value()), e.generation);
    }
    case RunMode::kStatic: {
      const std::string dir = !e.rendezvous_dir.empty()
                                  ? e.rendezvous_dir
                                  : "/tmp/edl-rdzv-" + e.master_addr + "-" +
                                        std::to_string(e.master_port);
      // `edl launch` starts trainers in generation 0; generation numbers start at 1.
      return NewStaticMembership(e.rank, e.world_size, std::max<int64_t>(e.generation, 1),
                                 std::make_unique<FileKvStore>(dir));
    }
    case RunMode::kStandalone:
      break;
  }
  return NewStaticMembership(0, 1, 1, std::make_unique<MemoryKvStore>());
}

std::unique_ptr<MembershipSource> NewPinnedMembership(std::unique_ptr<MembershipSource> base,
                                                      int64_t generation) {
  return std::make_unique<PinnedMembership>(std::move(base), generation);
}

}  // namespace edl::runtime
