// Switching generations (docs/ARCHITECTURE.md, "Generations and the re-form"): communicators
// built ahead of a planned switch, the watcher thread, and the stall events of each re-form.
#include <algorithm>
#include <thread>

#include <glog/logging.h>

#include "edl/runtime/elastic_trainer_impl.h"

namespace edl::runtime {

using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Prepared communicators (make-before-break). When a planned generation (not a failure) that
// includes this trainer is committed, its members know the next membership before the switch
// step: the watcher starts building that communicator on a helper thread while training goes on
// over the current one, and the switch then takes it instead of building one on the critical path.
// Every member does the same, so the rendezvous completes in the background; a member that never
// saw that generation (it went straight to a newer one) leaves the others' builds waiting until
// SupersedableKv gives up on them, which is then the same as a failed build in Reform.
//
// The switch step waits for the builds: each member votes in-band every step (SwitchVote) and the
// members switch after the first step whose votes reach the world size, so the re-form on the
// critical path only takes communicators that are already connected. A member votes 1 once it is
// ready (its build for the newest generation finished, or it needs none: it leaves, or NCCL), 0
// while the build is in flight, and the world size alone once it has waited kMaxPrepareWait since
// it first saw that generation (a build held up by a peer: switch anyway, finish it on the
// critical path). Training goes on over the current communicator meanwhile, and a joiner waits in
// its own build, so the wait costs nothing but the joiner's idle time.
//
// A generation's communicator is built at most once per trainer (its rendezvous keys are written
// once): `claimed_` is the highest number a build was started for, by either thread. NCCL builds
// ahead too (several NCCL communicators may exist at once; the new one's init runs in NCCL's own
// threads and touches the trainer's stream only for its stream-ordered scratch slot), except for a
// planned shrink that ncclCommShrink can do (nccl_reform.h): that one must be called on the
// current communicator by the training thread, at the switch, and needs no rendezvous.

bool ElasticTrainer::Impl::BuildsAhead(const Generation& g) {
  if (g.failure || g.RankOf(me_) < 0) return false;
  if (o_.backend == "gloo") return true;
  // NCCL: the shrink test reads only immutable inputs here (the watcher calls this too); the
  // training thread's PlanNccl adds the state of the current communicator.
  return PlanNcclBuild(GenMembers(), g.members, false, true, nccl_version_.load()).build ==
         NcclBuild::kInit;
}

NcclBuildPlan ElasticTrainer::Impl::PlanNccl(const Generation& target) {
  if (o_.backend != "nccl" || !comm_ || comm_failed_) {
    return {NcclBuild::kInit, {}, "no healthy NCCL communicator to shrink"};
  }
  NcclBuildPlan plan = PlanNcclBuild(gen_.members, target.members, target.failure,
                                     !comm_->aborted(), nccl_version_.load());
  // A failure's shrink (NCCL_SHRINK_ABORT) would need the parent alive after the failed
  // collective; the watcher aborts it instead (not built): a failure re-forms with a full init.
  if (plan.build == NcclBuild::kShrinkAbort) {
    plan = {NcclBuild::kInit, {}, "a failure re-forms with a full init"};
  }
  LOG(INFO) << me_ << ": generation " << target.number
            << " NCCL build: " << NcclBuildName(plan.build) << " (" << plan.why << ")";
  return plan;
}

StatusOr<std::unique_ptr<Communicator>> ElasticTrainer::Impl::ShrinkComm(
    const Generation& target, int rank, const NcclBuildPlan& plan) {
  CommOptions co;
  co.rank = rank;
  co.world_size = target.world_size();
  co.generation = target.number;
  co.timeout = o_.comm_timeout;
  co.cuda_device = o_.cuda_device;
  co.cuda_stream = trainable_->stream();
  co.interrupt = Interrupt(target.number);
  co.rank_names = target.members;
  return ShrinkNcclCommunicator(comm_.get(), plan.excluded, /*abort_parent=*/false, co);
}

void ElasticTrainer::Impl::MaybePrepare(const Generation& g) {
  if (!BuildsAhead(g)) return;
  const int rank = g.RankOf(me_);
  MutexLock lock(&prep_mu_);
  if (g.number <= claimed_ || g.number <= gen_number_) return;
  if (prep_thread_.joinable()) {
    if (!prep_done_) return;  // one build at a time; the one in flight gives way if superseded
    prep_thread_.join();      // finished and never taken: superseded
  }
  claimed_ = g.number;
  prep_gen_ = g;
  prep_done_ = false;
  prep_comm_ = Status::Unavailable("not built");
  prep_thread_ = std::thread([this, g, rank] {
    const int64_t t0 = clock_->NowMicros();
    auto comm = BuildComm(g, rank);
    const bool ok = comm.ok();
    {
      MutexLock lock(&prep_mu_);
      prep_comm_ = std::move(comm);
      prep_done_ = true;
    }
    // Off the stall (training went on meanwhile), but what make-before-break took.
    Event({{"event", "prepared"},
           {"generation", g.number},
           {"ok", ok},
           {"build_s", MicrosToSeconds(clock_->NowMicros() - t0)}});
  });
}

float ElasticTrainer::Impl::SwitchVote(const Generation& latest) {
  constexpr int64_t kMaxPrepareWait = 2'000'000;  // microseconds
  NoteSeen(latest.number);
  if (!BuildsAhead(latest)) return 1.0f;
  MaybePrepare(latest);  // the watcher's call may have found an older build still in flight
  {
    MutexLock lock(&prep_mu_);
    if (claimed_ >= latest.number && (!prep_thread_.joinable() || prep_done_)) return 1.0f;
  }
  int64_t first_seen = 0;
  {
    MutexLock lock(&seen_mu_);
    first_seen = seen_at_.at(latest.number).first;
  }
  const bool waited = clock_->NowMicros() - first_seen >= kMaxPrepareWait;
  return waited ? static_cast<float>(gen_.world_size()) : 0.0f;
}

bool ElasticTrainer::Impl::TakePrepared(Generation* target,
                                        StatusOr<std::unique_ptr<Communicator>>* comm) {
  std::thread t;
  {
    MutexLock lock(&prep_mu_);
    if (!prep_thread_.joinable() || prep_gen_.number < target->number) {
      // None, or an older one still in flight (it gives way: a newer generation exists) or done.
      claimed_ = std::max(claimed_, target->number);
      if (prep_thread_.joinable() && prep_done_) prep_thread_.join();
      return false;
    }
    t = std::move(prep_thread_);
  }
  t.join();  // the other members build the same generation (or give up on it soon)
  MutexLock lock(&prep_mu_);
  *target = prep_gen_;
  *comm = std::move(prep_comm_);
  prep_comm_ = Status::Unavailable("taken");
  prep_gen_ = Generation();
  return true;
}

void ElasticTrainer::Impl::JoinPrepared() {
  cancel_prep_ = true;
  std::thread t;
  {
    MutexLock lock(&prep_mu_);
    t = std::move(prep_thread_);
  }
  if (t.joinable()) t.join();
  JoinRetired(/*all=*/true);
  MutexLock lock(&prep_mu_);
  prep_comm_ = Status::Unavailable("shut down");
}

void ElasticTrainer::Impl::InstallComm(std::unique_ptr<Communicator> comm, const Generation& gen,
                                       int rank) {
  std::unique_ptr<Communicator> old = std::move(comm_);
  comm_ = std::move(comm);
  if (comm_) {
    comm_failed_ = false;  // a new communicator
    if (gen_.number != gen.number && gen_.number != 0) {
      reform_from_gen_ = gen_.number;
      reform_from_world_ = gen_.world_size();
    }
    gen_ = gen;
    rank_ = rank;
  }
  {
    // The watcher lets go of `old` here, before it is torn down.
    MutexLock lock(&comm_mu_);
    watched_comm_ = comm_.get();
    if (comm_) {
      watched_members_ = gen_.members;
      gen_number_ = gen_.number;
    }
  }
  Retire(std::move(old));  // outside the lock: closing sockets may take a moment
}

// An old communicator's teardown runs on a helper thread, off the critical path: Gloo's (closing
// every pair, joining its device's loop thread) took 20-40 ms of each re-form on a loaded machine;
// NCCL's is bounded (ncclCommFinalize polled for a few seconds, else ncclCommAbort) but may take
// that long when a peer is gone. Several may be in flight (each bounded); finished ones are joined
// at the next retirement, the rest at shutdown.
void ElasticTrainer::Impl::Retire(std::unique_ptr<Communicator> old) {
  JoinRetired(/*all=*/false);
  if (!old) return;
  auto done = std::make_shared<std::atomic<bool>>(false);
  retiring_.push_back({std::thread([c = std::move(old), done]() mutable {
                         c.reset();
                         done->store(true);
                       }),
                       done});
}

void ElasticTrainer::Impl::JoinRetired(bool all) {
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if (all || it->done->load()) {
      it->thread.join();
      it = retiring_.erase(it);
    } else {
      ++it;
    }
  }
}

std::function<Status(CommPhase)> ElasticTrainer::Impl::Interrupt(int64_t number) {
  return [this, number](CommPhase phase) -> Status {
    if (cancel_prep_.load()) return Status::Aborted("the trainer is shutting down");
    const int64_t failure = newest_failure_.load();
    if (failure > number) {
      return Status::Aborted("failure generation " + std::to_string(failure) +
                             " was committed after generation " + std::to_string(number));
    }
    const int64_t newest = newest_seen_.load();
    if (phase == CommPhase::kConstruct && newest > number) {
      return Status::Aborted("generation " + std::to_string(number) + " was superseded by " +
                             std::to_string(newest) + " while its communicator was built");
    }
    return Status::OK();
  };
}

// ---------------------------------------------------------------------------------------------
// Watcher: aborts the communicator when a failure generation newer than ours is committed, so
// a collective blocked on a dead or hung peer returns at once.

void ElasticTrainer::Impl::StartWatcher() {
  stop_watcher_ = false;
  watcher_ = std::thread([this] { WatchLoop(); });
}

void ElasticTrainer::Impl::StopWatcher() {
  stop_watcher_ = true;
  if (watcher_.joinable()) watcher_.join();
}

void ElasticTrainer::Impl::WatchLoop() {
  // Checked on every wake-up, not only when the failure generation arrives: a communicator
  // installed after it (a joiner's first one, of the generation it superseded) is aborted too.
  int64_t seen = gen_number_, failed = 0, aborted = 0;  // newest failure seen; generation aborted
  while (!stop_watcher_) {
    Generation g;
    if (membership_->WaitGeneration(seen, milliseconds(100), &g).ok()) {
      seen = g.number;
      NoteSeen(g.number);
      if (g.failure) {
        failed = g.number;
        newest_failure_.store(g.number);
      }
      newest_seen_.store(g.number);  // after the failure: an interrupt reads them in this order
      MaybePrepare(g);
    }
    MutexLock lock(&comm_mu_);
    if (watched_comm_ != nullptr && failed > gen_number_ && aborted != gen_number_) {
      LOG(INFO) << me_ << ": failure generation " << failed << " committed; aborting "
                << "communicator of generation " << gen_number_;
      watched_comm_->Abort();
      aborted = gen_number_;
    }
  }
}

void ElasticTrainer::Impl::NoteSeen(int64_t number) {
  const int64_t mono = clock_->NowMicros(), wall = clock_->WallMicros();
  MutexLock lock(&seen_mu_);
  seen_at_.emplace(number, std::make_pair(mono, wall));  // keeps the first sighting
}

std::pair<int64_t, int64_t> ElasticTrainer::Impl::SeenAt(int64_t number) {
  MutexLock lock(&seen_mu_);
  auto it = seen_at_.find(number);
  if (it == seen_at_.end()) {  // the training thread got it before the watcher: now is close
    it = seen_at_.emplace(number, std::make_pair(clock_->NowMicros(), clock_->WallMicros())).first;
  }
  const auto at = it->second;
  seen_at_.erase(seen_at_.begin(), seen_at_.upper_bound(number));
  return at;
}

// A survivor's stall: from the end of its last step in the old generation to the end of its
// first step in the new one. The additive phases (lost, wait_generation, agree, reform, sync,
// first_step) cover it; seen_time (wall clock, seconds) is when this trainer first saw the
// generation it re-formed into, from which, with the server's generation record, the events log
// yields detection and decision-and-push; wait_switch is how long it trained on after seeing a
// planned change before the agreed switch step ended (not part of the stall).
nlohmann::json ElasticTrainer::Impl::StallEvent(int64_t now) {
  const auto [seen_us, seen_wall_us] = SeenAt(gen_.number);
  const int64_t wait_switch =
      reform_was_failure_ ? 0 : std::max<int64_t>(0, last_step_end_us_ - seen_us);
  return {{"event", "stall"},
          {"generation", gen_.number},
          {"from_generation", reform_from_gen_},
          {"world_before", reform_from_world_},
          {"world_after", gen_.world_size()},
          {"switch_step", switch_step_},
          {"failure", reform_was_failure_},
          {"stall_s", MicrosToSeconds(now - last_step_end_us_)},
          {"lost_s", MicrosToSeconds(stall_.lost_us)},
          {"wait_generation_s", MicrosToSeconds(stall_.wait_gen_us)},
          {"agree_s", MicrosToSeconds(stall_.agree_us)},
          {"reform_s", MicrosToSeconds(stall_.reform_us)},
          {"sync_s", MicrosToSeconds(stall_.sync_us)},
          {"eval_s", MicrosToSeconds(stall_.eval_us + eval_kept_us_)},
          {"first_step_s", MicrosToSeconds(now - stall_.sync_end_us - eval_kept_us_)},
          {"attempts", stall_.attempts},
          {"prepared", stall_.prepared},
          {"wait_switch_s", MicrosToSeconds(wait_switch)},
          {"seen_time", MicrosToSeconds(seen_wall_us)}};
}

}  // namespace edl::runtime
