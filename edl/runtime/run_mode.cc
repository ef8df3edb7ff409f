#include "edl/runtime/run_mode.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "edl/base/thread_annotations.h"
#include "edl/net/trainer_channel.h"
#include "edl/runtime/channel_membership.h"
#include "edl/runtime/comm/file_kv_store.h"
#include "edl/runtime/comm/memory_kv_store.h"

namespace edl::runtime {

namespace {

// How long a static rank waits for rank 0 to hand out the run id: as long as a trainer waits for a
// generation by default (--generation_wait_s), so ranks that start minutes apart still meet.
constexpr std::chrono::milliseconds kStaticJoinBound{120000};

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

// See NewRunScopedKvStore in run_mode.h.
class RunScopedKv : public KvStore {
 public:
  RunScopedKv(std::unique_ptr<KvStore> base, int rank, int world, std::chrono::milliseconds bound)
      : base_(std::move(base)), rank_(rank), world_(world), bound_(bound) {
    if (rank_ == 0) {
      MutexLock lock(&join_mu_);
      id_ = Nonce();
      if (world_ > 1) greeter_ = std::thread([this, id = id_] { Greet(id); });
    }
  }
  ~RunScopedKv() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (greeter_.joinable()) greeter_.join();
  }

  Status Set(const std::string& key, const std::string& value) override {
    EDL_RETURN_IF_ERROR(Join(bound_));
    return base_->Set(Scoped(key), value);
  }
  Status Get(const std::string& key, std::string* value) override {
    EDL_RETURN_IF_ERROR(Join(bound_));
    return base_->Get(Scoped(key), value);
  }
  Status Wait(const std::string& key, std::chrono::milliseconds timeout,
              std::string* value) override {
    const auto start = std::chrono::steady_clock::now();
    EDL_RETURN_IF_ERROR(Join(std::max(timeout, bound_)));
    const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - start);
    return base_->Wait(Scoped(key), std::max(left, std::chrono::milliseconds(1)), value);
  }

 private:
  static std::string Nonce() {
    std::random_device rd;
    std::uniform_int_distribution<uint64_t> d;
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(d(rd)),
                  static_cast<unsigned long long>(d(rd)));
    return buf;
  }
  // REQUIRES: Join() succeeded (id_ is then set for good).
  std::string Scoped(const std::string& key) NO_THREAD_SAFETY_ANALYSIS {
    return "run/" + id_ + "/" + key;
  }

  // Rank > 0: hello with a fresh nonce, wait for rank 0's welcome of exactly that nonce, confirm.
  Status Join(std::chrono::milliseconds bound) {
    MutexLock lock(&join_mu_);
    if (!id_.empty()) return Status::OK();
    const std::string me = std::to_string(rank_), nonce = Nonce();
    EDL_RETURN_IF_ERROR(base_->Set("run/hello/" + me, nonce));
    std::string id;
    Status s = base_->Wait("run/welcome/" + me + "/" + nonce, bound, &id);
    if (s.IsTimeout()) {
      return Status::Timeout("static rendezvous: rank 0 of this run did not answer rank " + me +
                             " within " + std::to_string(bound.count()) +
                             " ms; start every rank with the same MASTER_ADDR/MASTER_PORT (or "
                             "EDL_RENDEZVOUS_DIR) and check that rank 0 is running");
    }
    EDL_RETURN_IF_ERROR(s);
    if (id.empty() || id.find('/') != std::string::npos) {
      return Status::Corruption("static rendezvous: rank 0's run id '" + id + "' is malformed");
    }
    EDL_RETURN_IF_ERROR(base_->Set("run/joined/" + id + "/" + me, "1"));
    id_ = id;
    return Status::OK();
  }

  // Rank 0's helper: answers every rank's newest hello until each has confirmed.
  void Greet(const std::string& id) {
    std::set<int> waiting;
    for (int r = 1; r < world_; ++r) waiting.insert(r);
    std::vector<std::string> answered(world_);
    MutexLock lock(&mu_);
    while (!stop_ && !waiting.empty()) {
      lock.Unlock();
      for (auto it = waiting.begin(); it != waiting.end();) {
        const std::string r = std::to_string(*it);
        std::string v;
        if (base_->Get("run/joined/" + id + "/" + r, &v).ok()) {
          it = waiting.erase(it);
          continue;
        }
        if (base_->Get("run/hello/" + r, &v).ok() && v != answered[*it] &&
            base_->Set("run/welcome/" + r + "/" + v, id).ok()) {
          answered[*it] = v;  // a stale nonce gets an answer nobody reads
        }
        ++it;
      }
      lock.Lock();
      cv_.wait_for(lock.native(), std::chrono::milliseconds(10),
                   [this]() REQUIRES(mu_) { return stop_; });
    }
  }

  const std::unique_ptr<KvStore> base_;
  const int rank_, world_;
  const std::chrono::milliseconds bound_;
  Mutex join_mu_;  // rank > 0: one handshake
  // Rank 0: from construction; the others: once joined, then never changed.
  std::string id_ GUARDED_BY(join_mu_);
  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread greeter_;
};

}  // namespace

const char* RunModeName(RunMode mode) {
  switch (mode) {
    case RunMode::kStandalone:
      return "standalone";
    case RunMode::kStatic:
      return "static";
    case RunMode::kElastic:
      return "elastic";
    case RunMode::kRestart:
      return "restart";
  }
  return "?";
}

void RunPlan::ApplyTo(ElasticOptions* options) const {
  options->joining = joining();
  options->join_generation = joining() ? env.generation : 0;
  options->join_world = joining() && env.has_world ? env.world_size : 0;
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

StatusOr<RunPlan> ReadRunPlanFromProcess() {
  StatusOr<EnvContract> env = TrainerEnvFromProcess();
  if (!env.ok()) return env.status();
  RunPlan plan = PlanRun(env.value());
  if (plan.spare()) NameProcessAsSpare(true);
  return plan;
}

void NameProcessAsSpare(bool spare) {
  if (spare) {
    ::prctl(PR_SET_NAME, kSpareProcessName);
    return;
  }
  // Back to the kernel's default: the executable's file name, cut to 15 bytes.
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return;
  std::string name(exe, static_cast<size_t>(n));
  name = name.substr(name.rfind('/') + 1).substr(0, 15);
  ::prctl(PR_SET_NAME, name.c_str());
}

StatusOr<RunPlan> AwaitAssignment(const RunPlan& spare, std::chrono::milliseconds connect_timeout) {
  if (!spare.spare()) return Status::InvalidArgument("AwaitAssignment: not a spare's plan");
  NameProcessAsSpare(true);
  auto assigned = net::WaitAsSpare(spare.env.client_socket, spare.env.trainer_id, connect_timeout);
  NameProcessAsSpare(false);
  if (!assigned.ok()) return assigned.status();
  const std::map<std::string, std::string>& vars = assigned.value().env;
  for (const auto& var : vars) {
    const std::string& name = var.first;  // (a structured binding cannot be captured in C++17)
    if (std::find_if(std::begin(env::kAll), std::end(env::kAll),
                     [&](const char* n) { return name == n; }) == std::end(env::kAll)) {
      return Status::InvalidArgument("spare " + spare.env.trainer_id + ": the assignment sets " +
                                     name + ", which is no env contract variable");
    }
  }
  auto env = ParseTrainerEnv(vars);
  if (!env.ok()) return env.status().WithContext("spare " + spare.env.trainer_id + "'s assignment");
  const EnvContract& e = env.value();
  std::string wrong;
  if (e.job_id != spare.env.job_id) wrong = std::string(env::kJobId) + " differs from the spare's";
  if (e.client_socket != spare.env.client_socket)
    wrong = std::string(env::kClientSocket) + " differs from the spare's";
  if (e.spare != SpareKind::kNone) wrong = std::string(env::kSpare) + " is set";
  if (e.restart_mode) wrong = std::string(env::kRestartMode) + "=1 (restart mode has no spares)";
  if (!wrong.empty()) {
    return Status::InvalidArgument("spare " + spare.env.trainer_id + "'s assignment: " + wrong +
                                   "; the edl client of this node is at fault");
  }
  for (const char* name : env::kAll) {
    auto it = vars.find(name);
    if (it != vars.end() && !it->second.empty()) {
      ::setenv(name, it->second.c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  return PlanRun(e);
}

StatusOr<RunPlan> PlanRunFromProcess() {
  auto plan = ReadRunPlanFromProcess();
  if (!plan.ok() || !plan.value().spare()) return plan;
  return AwaitAssignment(plan.value());
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
      const std::string dir = !e.rendezvous_dir.empty() ? e.rendezvous_dir
                                                        : "/tmp/edl-rdzv-" + e.master_addr + "-" +
                                                              std::to_string(e.master_port);
      // `edl launch` starts trainers in generation 0; generation numbers start at 1.
      // Every key under this run's id: a run never reads a key an earlier run on the same
      // MASTER_ADDR/MASTER_PORT left in `dir` (e.g. gen/1/nccl/nccl_unique_id).
      return NewStaticMembership(e.rank, e.world_size, std::max<int64_t>(e.generation, 1),
                                 NewRunScopedKvStore(std::make_unique<FileKvStore>(dir), e.rank,
                                                     e.world_size, kStaticJoinBound));
    }
    case RunMode::kStandalone:
      break;
  }
  return NewStaticMembership(0, 1, 1, std::make_unique<MemoryKvStore>());
}

std::unique_ptr<KvStore> NewRunScopedKvStore(std::unique_ptr<KvStore> base, int rank, int world,
                                             std::chrono::milliseconds join_bound) {
  return std::make_unique<RunScopedKv>(std::move(base), rank, world, join_bound);
}

std::unique_ptr<MembershipSource> NewPinnedMembership(std::unique_ptr<MembershipSource> base,
                                                      int64_t generation) {
  return std::make_unique<PinnedMembership>(std::move(base), generation);
}

}  // namespace edl::runtime
