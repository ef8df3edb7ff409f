#include "edl/runtime/membership.h"

#include <thread>

#include <glog/logging.h>

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

}  // namespace

std::unique_ptr<MembershipSource> NewStaticMembership(int rank, int world, int64_t generation,
                                                      std::unique_ptr<KvStore> kv) {
  CHECK(rank >= 0 && rank < world);
  return std::make_unique<StaticMembership>(rank, world, generation, std::move(kv));
}

}  // namespace edl::runtime
