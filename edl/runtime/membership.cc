#include "edl/runtime/membership.h"

#include <cstdlib>
#include <thread>

#include <glog/logging.h>

#include "edl/runtime/comm/file_kv_store.h"

namespace edl::runtime {

int Generation::RankOf(const std::string& trainer_id) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == trainer_id) return static_cast<int>(i);
  }
  return -1;
}

namespace {

class StaticMembership : public MembershipSource {
 public:
  StaticMembership(int rank, int world, int64_t generation, std::unique_ptr<KvStore> kv)
      : rank_(rank), kv_(std::move(kv)) {
    gen_.number = generation;
    gen_.reason = "static";
    for (int r = 0; r < world; ++r) gen_.members.push_back("rank-" + std::to_string(r));
  }
  std::string trainer_id() const override { return gen_.members[rank_]; }
  bool Latest(Generation* out) override {
    *out = gen_;
    return true;
  }
  Status WaitGeneration(int64_t after, std::chrono::milliseconds timeout,
                        Generation* out) override {
    if (gen_.number > after) return Latest(out), Status::OK();
    std::this_thread::sleep_for(timeout);  // nothing ever changes in static mode
    return Status::Timeout("static mode (no EDL_CLIENT_SOCKET): the generation never changes");
  }
  KvStore* kv() override { return kv_.get(); }
  Status ReportReady(int64_t) override { return Status::OK(); }
  // Progress lines are the trainer's business (e.g. `edl train` prints them on rank 0).
  Status ReportProgress(const ProgressInfo&) override { return Status::OK(); }
  Status ReportEvent(const nlohmann::json& event) override {
    if (rank_ == 0) VLOG(1) << "event " << event.dump();
    return Status::OK();
  }

 private:
  const int rank_;
  const std::unique_ptr<KvStore> kv_;
  Generation gen_;
};

Status EnvInt(const char* name, bool required, int64_t fallback, int64_t* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (required) {
      return Status::InvalidArgument(std::string("static mode needs ") + name +
                                     " in the environment (run under `edl launch` or an edl client)");
    }
    *out = fallback;
    return Status::OK();
  }
  char* end = nullptr;
  *out = std::strtoll(v, &end, 10);
  if (*end != '\0') {
    return Status::InvalidArgument(std::string(name) + "='" + v + "' is not an integer");
  }
  return Status::OK();
}

}  // namespace

std::unique_ptr<MembershipSource> NewStaticMembership(int rank, int world, int64_t generation,
                                                      std::unique_ptr<KvStore> kv) {
  CHECK(rank >= 0 && rank < world);
  return std::make_unique<StaticMembership>(rank, world, generation, std::move(kv));
}

StatusOr<std::unique_ptr<MembershipSource>> StaticMembershipFromEnv() {
  int64_t rank = 0, world = 0, generation = 1;
  EDL_RETURN_IF_ERROR(EnvInt("RANK", true, 0, &rank));
  EDL_RETURN_IF_ERROR(EnvInt("WORLD_SIZE", true, 0, &world));
  EDL_RETURN_IF_ERROR(EnvInt("EDL_GENERATION", false, 1, &generation));
  if (generation < 1) generation = 1;  // `edl launch` starts trainers in generation 0
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::InvalidArgument("RANK=" + std::to_string(rank) + " is not in [0, WORLD_SIZE=" +
                                   std::to_string(world) + ")");
  }
  std::string dir;
  if (const char* d = std::getenv("EDL_RENDEZVOUS_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    dir = std::string("/tmp/edl-rdzv-") + (addr ? addr : "local") + "-" + (port ? port : "0");
  }
  return NewStaticMembership(static_cast<int>(rank), static_cast<int>(world), generation,
                             std::make_unique<FileKvStore>(dir));
}

}  // namespace edl::runtime
