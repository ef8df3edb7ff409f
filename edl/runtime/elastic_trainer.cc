// The elastic loop. Invariants:
//   - the phase (trainer_phase.h) changes only in Enter(), on the training thread;
//   - comm_ is null or was formed for gen_ (both change together, in InstallComm);
//   - state_ holds a synced step in every phase but joining;
//   - state_ and the Trainable's tensors are identical on every rank of gen_ after SyncState();
//   - a step is committed (state_.step advanced, samples logged) only after its all-reduce
//     completed on this rank; a rank whose all-reduce failed logs that step's samples at the next
//     sync if the broadcast state shows the step was committed elsewhere (pending_).
#include "edl/runtime/elastic_trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include <glog/logging.h>

#include "edl/proto/messages.h"
#include "edl/proto/rendezvous_key.h"
#include "edl/runtime/elastic_trainer_impl.h"

namespace edl::runtime {
namespace {

using std::chrono::milliseconds;

// In-band slots after the gradients (Trainable::kInbandSlots == 5), SUM-reduced with them.
// kSwitchVotes sums the members' SwitchVote()s (small integers: exact in fp32). kLocalGradSq sums
// each rank's |g_i|^2 of its own mean gradient (self_measure.h; 0 where it is not measured).
enum InbandSlot { kSwitchVotes = 0, kLossSum = 1, kCorrect = 2, kSamples = 3, kLocalGradSq = 4 };
static_assert(Trainable::kInbandSlots >= 5, "the runtime uses five in-band slots");

// Sum of squares of `n` floats, in double.
double SquaredNorm(const float* v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  return s;
}

// The rendezvous store of one re-form attempt: waits in short slices and gives up (Aborted) as
// soon as a generation newer than the target is committed. Ranks may target different generations
// (one saw a newer commit before the others), and a rank waiting for a peer's key that went on to
// the newer generation would otherwise sit out the whole communicator timeout; this way every
// rank converges on the newest generation within a slice. Peers connect only once every rank's
// key is present, so giving up while a key is missing never strands a peer mid-connect.
// Unavailable from the base store (the node's client is between server connections: a server
// restart) is retried within the attempt's bound, as a timeout is: the rendezvous outlives a
// server restart instead of failing and leaving the trainer waiting for a generation nobody makes.
class SupersedableKv : public KvStore {
 public:
  // `cancel` (may be null): gives up at the next slice once it is true (shutdown). `retry_for`:
  // how long a Set or Get keeps retrying while the base store is Unavailable.
  SupersedableKv(KvStore* base, MembershipSource* membership, int64_t target,
                 const std::atomic<bool>* cancel, milliseconds retry_for)
      : base_(base),
        membership_(membership),
        target_(target),
        cancel_(cancel),
        retry_for_(retry_for) {}
  Status Set(const std::string& key, const std::string& value) override {
    return Retrying(key, [&] { return base_->Set(key, value); });
  }
  Status Get(const std::string& key, std::string* value) override {
    return Retrying(key, [&] { return base_->Get(key, value); });
  }
  Status Wait(const std::string& key, milliseconds timeout, std::string* value) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      Status s = base_->Wait(key, std::max(milliseconds(1), std::min(left, kSlice)), value);
      if (IsUnavailable(s)) {
        if (left <= kSlice) return s;
        std::this_thread::sleep_for(kUnavailableNap);
      } else if (!s.IsTimeout() || left <= kSlice) {
        return s;
      }
      EDL_RETURN_IF_ERROR(GivenUp(key));
    }
  }

 private:
  static constexpr milliseconds kSlice{250};
  static constexpr milliseconds kUnavailableNap{50};  // the client answers at once while offline
  static bool IsUnavailable(const Status& s) { return s.code() == Status::Code::kUnavailable; }
  // Aborted once the trainer shuts down or a newer generation is committed.
  Status GivenUp(const std::string& key) {
    if (cancel_ != nullptr && cancel_->load()) {
      return Status::Aborted("rendezvous for generation " + std::to_string(target_) +
                             " cancelled: the trainer is shutting down");
    }
    Generation g;
    if (membership_->Latest(&g) && g.number > target_) {
      return Status::Aborted("generation " + std::to_string(target_) + " was superseded by " +
                             std::to_string(g.number) + " while waiting for rendezvous key " + key);
    }
    return Status::OK();
  }
  template <typename Fn>
  Status Retrying(const std::string& key, Fn&& call) {
    const auto deadline = std::chrono::steady_clock::now() + retry_for_;
    for (;;) {
      Status s = call();
      if (!IsUnavailable(s) || std::chrono::steady_clock::now() >= deadline) return s;
      std::this_thread::sleep_for(kUnavailableNap);
      EDL_RETURN_IF_ERROR(GivenUp(key));
    }
  }

  KvStore* const base_;
  MembershipSource* const membership_;
  const int64_t target_;
  const std::atomic<bool>* const cancel_;
  const milliseconds retry_for_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Run: join or start, then steps until done or left; the phases (trainer_phase.h).

Status ElasticTrainer::Impl::Run(ElasticResult* result) {
  EDL_RETURN_IF_ERROR(schedule_.Validate());
  if (o_.batch <= 0) return Status::InvalidArgument("--batch must be > 0");
  if (!o_.sample_log_path.empty()) {
    sample_log_fd_ =
        ::open(o_.sample_log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (sample_log_fd_ < 0) return PosixError("sample log " + o_.sample_log_path, errno);
  }
  start_us_ = o_.start_micros > 0 ? o_.start_micros : clock_->NowMicros();
  if (o_.backend == "nccl") nccl_version_ = NcclRuntimeVersion();
  Generation gen;
  EDL_RETURN_IF_ERROR(FirstGeneration(&gen));
  StartWatcher();  // already in the first re-form: a joiner stuck in its sync must be woken too
  EDL_RETURN_IF_ERROR(Reform(gen));
  progress_t0_us_ = clock_->NowMicros();
  while (phase_ != TrainerPhase::kLeft && !Done()) {
    if (phase_ == TrainerPhase::kEvaluating) {
      // The re-form landed on an epoch end (a switch or failure took the place of its evaluation).
      EDL_RETURN_IF_ERROR(EvaluateThen(TrainerPhase::kResuming));
    } else {
      EDL_RETURN_IF_ERROR(TrainOneStep());
    }
  }
  if (phase_ != TrainerPhase::kLeft) {
    // The last step's evaluation, unless it had one (an epoch end's, or one a member completed
    // before the last re-form). A failed collective is not worth a re-form any more.
    if (o_.evaluate_each_epoch && last_eval_step_ != state_.step) {
      if (phase_ != TrainerPhase::kEvaluating) Enter(TrainerPhase::kEvaluating);
      Status e = Evaluate(&accuracy_);
      if (!e.ok() && !comm_failed_) return e;
    }
    Enter(TrainerPhase::kDone);
  }
  const bool left = phase_ == TrainerPhase::kLeft;
  StopWatcher();
  JoinPrepared();
  if (!left && rank_ == 0 && o_.loader != nullptr) {
    Status f = o_.loader->Finish(trainable_, state_, Context());
    ReportLoaderEvents();
    EDL_RETURN_IF_ERROR(f);
  }
  auto hash = StateHash(trainable_);
  EDL_RETURN_IF_ERROR(hash.status());
  result->left = left;
  result->step = state_.step;
  result->generation = gen_.number;
  result->last_loss = last_loss_;
  result->accuracy = accuracy_;
  result->state_hash = hash.value();
  Event({{"event", left ? "left" : "done"}, {"generation", gen_.number}, {"step", state_.step}});
  return Status::OK();
}

void ElasticTrainer::Impl::Enter(TrainerPhase next) {
  CHECK(IsLegalPhaseTransition(phase_, next))
      << me_ << ": no transition from trainer phase " << NameOf(phase_) << " to " << NameOf(next)
      << " (generation " << gen_.number << ", step " << state_.step << ")";
  VLOG(1) << me_ << ": phase " << NameOf(phase_) << " -> " << NameOf(next) << " (generation "
          << gen_.number << ", step " << state_.step << ")";
  phase_ = next;
}

Status ElasticTrainer::Impl::TrainOneStep() {
  const int64_t epoch_before = state_.position.epoch;
  StepResult r;
  Status s = Step(&r);
  if (s.ok()) {
    CommitStep(r);
    s = ReportStep(r);
  }
  if (!s.ok()) return comm_failed_ ? Recover(s) : s;  // else the Trainable (or loader) failed
  if (r.switch_seen) return SwitchGeneration();
  if (o_.evaluate_each_epoch && state_.position.epoch != epoch_before) {
    Enter(TrainerPhase::kEvaluating);
    return EvaluateThen(TrainerPhase::kTraining);
  }
  return Status::OK();
}

Status ElasticTrainer::Impl::EvaluateThen(TrainerPhase next) {
  DCHECK(phase_ == TrainerPhase::kEvaluating) << NameOf(phase_);
  Status e = Evaluate(&accuracy_);
  if (!e.ok()) return comm_failed_ ? Recover(e) : e;
  Enter(next);
  return Status::OK();
}

Status ElasticTrainer::Impl::FirstGeneration(Generation* gen) {
  // What every member of a generation must share, before anything else (a joiner's ready follows
  // it): the server refuses a joiner whose configuration differs from the job's.
  if (!o_.config_fingerprint.empty()) {
    Event({{"event", "config"}, {"fingerprint", o_.config_fingerprint}});
  }
  Generation known;
  if (!membership_->Latest(&known)) known.number = 0;
  if (o_.joining) {
    const int64_t pending = o_.join_generation > 0 ? o_.join_generation : known.number + 1;
    // Joiners come last. The size it joins at is in its environment: the newest generation the
    // client pushes may not have arrived yet (a world of 1 would warm up the wrong batch).
    const int world = o_.join_world > 0 ? o_.join_world : std::max(1, known.world_size() + 1);
    EDL_RETURN_IF_ERROR(WarmUp(world));
    EDL_RETURN_IF_ERROR(membership_->ReportReady(pending));
    Event({{"event", "joiner_ready"},
           {"generation", pending},
           {"after_generation", known.number},
           {"ready_s", MicrosToSeconds(clock_->NowMicros() - start_us_)}});
  } else if (known.number > 0 && known.RankOf(me_) >= 0) {
    *gen = known;
    return Status::OK();
  }
  // Wait until a generation includes this trainer.
  int64_t after = o_.joining ? known.number : 0;
  for (;;) {
    EDL_RETURN_IF_ERROR(WaitNewer(after, gen));
    if (gen->RankOf(me_) >= 0) return Status::OK();
    after = gen->number;
  }
}

// `world`: the size this joiner expects to join at (its batch under a fixed global batch). The
// re-form overwrites the state anyway, unless nobody holds state and this trainer cold-starts with
// its own initialisation: so it is put back.
Status ElasticTrainer::Impl::WarmUp(int world) {
  const int64_t n = WarmUpSamples(trainable_->train_size(), o_.batch_policy, o_.batch, world);
  if (n <= 0) return Status::OK();
  if (n == o_.warmed_samples) {
    Event({{"event", "joiner_warm_up"}, {"samples", n}, {"seconds", 0.0}, {"spare", true}});
    return Status::OK();
  }
  const int64_t t0 = clock_->NowMicros();
  EDL_RETURN_IF_ERROR(WarmUpTrainable(trainable_, n));
  Event({{"event", "joiner_warm_up"},
         {"samples", n},
         {"seconds", MicrosToSeconds(clock_->NowMicros() - t0)}});
  return Status::OK();
}

int64_t WarmUpSamples(int64_t train_size, BatchPolicy policy, int64_t batch, int world) {
  world = std::max(1, world);
  return std::max<int64_t>(
      0, std::min<int64_t>(train_size, BatchSizes(policy, batch, world)[world - 1]));
}

Status WarmUpTrainable(Trainable* trainable, int64_t samples) {
  if (samples <= 0) return Status::OK();
  std::vector<StateTensor> tensors = trainable->StateTensors();
  size_t total = 0;
  for (const StateTensor& t : tensors) total += t.bytes;
  std::vector<char> saved(total);
  size_t off = 0;
  for (const StateTensor& t : tensors) {
    EDL_RETURN_IF_ERROR(trainable->CopyToHost(t, saved.data() + off));
    off += t.bytes;
  }
  std::vector<int64_t> indices(static_cast<size_t>(samples));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  EDL_RETURN_IF_ERROR(trainable->WarmUpStep(indices).WithContext("joiner warm-up"));
  off = 0;
  for (const StateTensor& t : tensors) {
    EDL_RETURN_IF_ERROR(trainable->CopyFromHost(t, saved.data() + off));
    off += t.bytes;
  }
  return trainable->ZeroGradients();
}

Status ElasticTrainer::Impl::WaitNewer(int64_t after, Generation* out) {
  Status s = membership_->WaitGeneration(after, o_.generation_wait, out);
  if (s.ok()) NoteSeen(out->number);
  if (s.IsTimeout()) {
    return Status::Timeout(
        "trainer " + me_ + ": no committed generation after " + std::to_string(after) + " within " +
        std::to_string(o_.generation_wait.count()) + " ms; is the edl client / server running?");
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Re-form: communicator for `target` (or newer, if one shows up meanwhile) plus state sync.

// REQUIRES: phase joining (the first re-form) or reforming. Ends in phase left, evaluating or
// resuming; an error leaves the phase as it is (Run() returns it).
Status ElasticTrainer::Impl::Reform(Generation target) {
  DCHECK(phase_ == TrainerPhase::kJoining || phase_ == TrainerPhase::kReforming) << NameOf(phase_);
  sync_s_ = Ema(0.9);  // the all-reduce time is the new world's; the noise scale is the model's
  for (;;) {
    int rank = target.RankOf(me_);
    if (rank < 0) {
      // The whole job stops (`edl ctl stop`): the state every rank holds after the agreed switch
      // step is the job's, so rank 0 keeps it as the final checkpoint before everybody leaves. A
      // trainer still joining (its first sync superseded by the stop) holds no state of the job:
      // saving its fresh model would put step 0 above the job's newest checkpoint.
      if (target.reason == proto::kStopReason && rank_ == 0 && !comm_failed_ &&
          phase_ != TrainerPhase::kJoining && o_.loader != nullptr) {
        Status s = o_.loader->Finish(trainable_, state_, Context());
        ReportLoaderEvents();  // a refused final save: checkpoint_failed with the fence's reason
        nlohmann::json e = {{"event", "stop_checkpoint"},
                            {"generation", gen_.number},
                            {"step", state_.step},
                            {"ok", s.ok()}};
        // The server's stop outcome quotes it.
        if (!s.ok()) e["error"] = s.ToString().substr(0, 1024);
        Event(std::move(e));
        if (!s.ok()) return s.WithContext("stopping the job");
        LOG(INFO) << me_ << ": the job stops (generation " << target.number
                  << "); final checkpoint saved at step " << state_.step;
      }
      Enter(TrainerPhase::kLeft);
      InstallComm(nullptr, target, -1);
      Event({{"event", "leave"}, {"generation", target.number}, {"step", state_.step}});
      return Status::OK();
    }
    const int64_t t_build = stall_.mark_us > 0 ? stall_.mark_us : clock_->NowMicros();
    StatusOr<std::unique_ptr<Communicator>> comm{Status::Unavailable("not built")};
    stall_.prepared = TakePrepared(&target, &comm);
    bool shrunk = false;
    if (stall_.prepared) {
      rank = target.RankOf(me_);  // the prepared one may be of a newer generation
    } else if (const NcclBuildPlan plan = PlanNccl(target); plan.build == NcclBuild::kShrink) {
      comm = ShrinkComm(target, rank, plan);  // from the old one, before it goes
      shrunk = comm.ok();
      if (!shrunk) LOG(WARNING) << me_ << ": " << comm.status().ToString() << "; full init instead";
    }
    InstallComm(nullptr, gen_, rank_);  // the old communicator goes (torn down in the background)
    if (!stall_.prepared && !shrunk) comm = BuildComm(target, rank);
    const int64_t t_built = clock_->NowMicros();
    stall_.reform_us += t_built - t_build;
    stall_.attempts++;
    int64_t t_wait = t_built;  // a failed attempt's logging counts as waiting for the next one
    std::string failed_why;    // why this attempt failed (for reform_failed, below)
    if (comm.ok()) {
      InstallComm(std::move(comm.value()), target, rank);  // clears comm_failed_
      int64_t newest = 0;
      bool evaluated = false;
      Status s = SyncState(&newest, &evaluated);
      stall_.sync_end_us = clock_->NowMicros();
      stall_.sync_us += stall_.sync_end_us - t_built;
      t_wait = stall_.sync_end_us;
      if (s.ok() && newest <= target.number) {
        // Decided on synced state only, so every member (a joiner too) evaluates, or none does.
        // An evaluation some member completed is not done again: a failure in the first step after
        // an epoch end's evaluation re-forms on that epoch end.
        last_eval_step_ = evaluated ? state_.step : -1;
        const bool eval_due =
            o_.evaluate_each_epoch && state_.step > 0 && state_.position.cursor == 0 && !evaluated;
        Enter(eval_due ? TrainerPhase::kEvaluating : TrainerPhase::kResuming);
        return Status::OK();
      }
      if (!s.ok() && !comm_failed_) return s;
      LOG(INFO) << me_ << ": generation " << target.number << " superseded or failed during sync ("
                << (s.ok() ? "newer generation " + std::to_string(newest) : s.ToString()) << ")";
      if (!s.ok()) failed_why = s.ToString();
    } else if (comm.status().code() == Status::Code::kInvalidArgument ||
               comm.status().code() == Status::Code::kFailedPrecondition) {
      return comm.status();
    } else {
      LOG(WARNING) << me_ << ": " << comm.status().ToString();
      failed_why = comm.status().ToString();
    }
    Generation next;
    Generation latest;
    if (membership_->Latest(&latest) && latest.number > target.number) {
      next = latest;
    } else {
      // Nothing newer answers this failure yet (a peer that died unseen, a transient error): say
      // so, and the server commits the generation again (JobMembership::ReformFailed) rather than
      // every member waiting out --generation_wait_s for a commit nobody would make.
      if (!failed_why.empty()) {
        Event({{"event", "reform_failed"},
               {"generation", target.number},
               {"error", failed_why.substr(0, 1024)}});
      }
      EDL_RETURN_IF_ERROR(WaitNewer(target.number, &next));
    }
    stall_.mark_us = clock_->NowMicros();
    stall_.wait_gen_us += stall_.mark_us - t_wait;
    target = next;
  }
}

StatusOr<std::unique_ptr<Communicator>> ElasticTrainer::Impl::BuildComm(const Generation& target,
                                                                        int rank) {
  CommOptions co;
  co.rank = rank;
  co.world_size = target.world_size();
  co.generation = target.number;
  co.key_prefix = proto::RendezvousPrefix(target.number, o_.backend);  // the server GCs these
  SupersedableKv kv(membership_->kv(), membership_, target.number, &cancel_prep_, o_.comm_timeout);
  co.store = &kv;  // used during construction only
  co.timeout = o_.comm_timeout;
  co.host = o_.host;
  if (co.host.empty() && rank < static_cast<int>(target.hosts.size())) co.host = target.hosts[rank];
  co.cuda_device = o_.cuda_device;
  co.cuda_stream = trainable_->stream();
  co.interrupt = Interrupt(target.number);
  co.rank_names = target.members;
  return o_.backend == "nccl" ? CreateNcclCommunicator(co) : CreateGlooCommunicator(co);
}

// ---------------------------------------------------------------------------------------------
// State sync.

Status ElasticTrainer::Impl::SyncState(int64_t* newest_seen, bool* evaluated) {
  const int w = gen_.world_size(), r = rank_;
  // state_ holds a synced step once the first re-form completed (phase joining until then).
  const bool has_state = phase_ != TrainerPhase::kJoining;
  const int64_t level = has_state ? state_.step + 1 : 0;
  Generation latest;
  membership_->Latest(&latest);
  // [0]: level * w + (w-1-r), whose MAX names the highest level and the lowest rank holding it;
  // [1]: newest generation seen; [2]: -level (its MAX is minus the lowest level); [3], [4]: the
  // fingerprint word and its negation (every rank's is the same iff [3] == -[4]); [5]: the level
  // of a step whose evaluation this rank completed (0: none), whose MAX is the newest such step.
  const int64_t fp = FingerprintWord();
  const bool done = has_state && last_eval_step_ == state_.step;
  int64_t v[6] = {level * w + (w - 1 - r), latest.number, -level, fp, -fp, done ? level : 0};
  EDL_RETURN_IF_ERROR(Comm(comm_->AllReduce(v, 6, DataType::kInt64, ReduceOp::kMax)));
  *newest_seen = v[1];
  *evaluated = v[5] > 0 && v[5] == v[0] / w;    // of the step the root holds, which every rank gets
  if (v[1] > gen_.number) return Status::OK();  // every rank saw the same: re-form again
  if (*evaluated) {
    // Its accuracy, for the members that did not complete it: the bits of the double, whose MAX is
    // the value for accuracies >= 0; every member that completed it holds the same one (-1: none).
    int64_t bits = -1;
    if (done && level == v[5] && accuracy_ >= 0) std::memcpy(&bits, &accuracy_, sizeof(bits));
    EDL_RETURN_IF_ERROR(Comm(comm_->AllReduce(&bits, 1, DataType::kInt64, ReduceOp::kMax)));
    if (bits >= 0) std::memcpy(&accuracy_, &bits, sizeof(accuracy_));
  }
  const int64_t max_level = v[0] / w, min_level = -v[2];
  int root = static_cast<int>(w - 1 - v[0] % w);
  if (max_level == 0) root = 0;  // cold start (below)
  if (v[3] != -v[4]) return FingerprintMismatch(root);
  bool need_tensors = max_level != min_level || o_.always_broadcast_state;
  if (max_level == 0) {  // nobody holds state: cold start on rank 0
    need_tensors = true;
    if (r == 0) {
      state_ = TrainingState();
      if (o_.loader != nullptr) {
        Status s = o_.loader->Load(trainable_, &state_);
        if (s.ok()) {
          Event({{"event", "cold_start"}, {"generation", gen_.number}, {"step", state_.step}});
        } else if (!s.IsNotFound()) {
          return s.WithContext("cold start of generation " + std::to_string(gen_.number));
        }
      }
    }
  }
  TrainingState synced;
  // Every rank holds the same step: only per-rank state (BN running statistics) may differ.
  EDL_RETURN_IF_ERROR(BroadcastState(root, /*per_rank_only=*/!need_tensors, &synced));
  // The step this rank had in flight was committed by others: its samples were consumed.
  if (pending_.step == synced.step && pending_.step == state_.step + 1 && has_state) {
    LogSamples(pending_.step, pending_.epoch, pending_.indices, std::nan(""));
  }
  pending_.step = -1;
  state_ = synced;  // held from now on: the re-form ends (Reform), out of phase joining
  const std::vector<int64_t> b = Batches();
  const int64_t global = std::accumulate(b.begin(), b.end(), int64_t{0});
  if (state_.last_global_batch != 0 && global != state_.last_global_batch) {
    state_.ramp_from_lr = state_.last_lr;
    state_.steps_since_reform = 0;
  }
  auto hash = StateHash(trainable_);
  EDL_RETURN_IF_ERROR(hash.status());
  Event({{"event", "sync"},
         {"generation", gen_.number},
         {"rank", r},
         {"world_size", w},
         {"step", state_.step},
         {"root", root},
         {"tensors_broadcast", need_tensors},
         {"state_hash", std::to_string(hash.value())}});
  return Status::OK();
}

int64_t ElasticTrainer::Impl::FingerprintWord() {
  if (fingerprint_word_ < 0) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (unsigned char c : trainable_->Fingerprint()) h = (h ^ c) * 0x100000001b3ULL;
    fingerprint_word_ = static_cast<int64_t>(h >> 1);  // >= 0, so its negation fits
  }
  return fingerprint_word_;
}

// Some rank's Trainable::Fingerprint() differs from the others' (another model, shapes or
// optimizer): the state broadcast would not fit it. The root's (the state every rank would get) is
// the job's. A rank whose fingerprint differs from it fails with both named (its trainer exits and
// the job re-forms without it); the others treat the generation as failed and wait for that one.
Status ElasticTrainer::Impl::FingerprintMismatch(int root) {
  constexpr uint64_t kMaxBytes = 1 << 20;
  const std::string mine = trainable_->Fingerprint();
  uint64_t len = std::min<uint64_t>(mine.size(), kMaxBytes);
  EDL_RETURN_IF_ERROR(Comm(comm_->Broadcast(&len, sizeof(len), root)));
  if (len > kMaxBytes)
    return Comm(Status::Corruption("rank " + std::to_string(root) + " sent a " +
                                   std::to_string(len) + "-byte fingerprint"));
  std::string theirs = rank_ == root ? mine.substr(0, len) : std::string(len, '\0');
  EDL_RETURN_IF_ERROR(Comm(comm_->Broadcast(theirs.data(), len, root)));
  if (mine.substr(0, kMaxBytes) == theirs) {
    Event({{"event", "fingerprint_mismatch"}, {"generation", gen_.number}, {"root", root}});
    return Comm(Status::Aborted("a trainer of generation " + std::to_string(gen_.number) +
                                " has another model or optimizer than rank " +
                                std::to_string(root) +
                                ", which holds the job's state; waiting "
                                "for the job to re-form without it"));
  }
  return Status::FailedPrecondition(
      "this trainer's model or optimizer differs from the job's, so the training state of rank " +
      std::to_string(root) + " (generation " + std::to_string(gen_.number) +
      ") cannot be loaded "
      "into it: this trainer has '" +
      mine + "', the job has '" + theirs +
      "'; start every "
      "trainer of a job with the same model and optimizer");
}

Status ElasticTrainer::Impl::BroadcastState(int root, bool per_rank_only, TrainingState* synced) {
  const SyncHeader header = EncodeSyncHeader(state_);  // the root's is the one that counts
  const std::string from = "rank " + std::to_string(root);
  std::vector<StateTensor> tensors;
  size_t total = 0;
  for (StateTensor& t : trainable_->StateTensors()) {
    if (per_rank_only && !t.per_rank) continue;
    total += t.bytes;
    tensors.push_back(std::move(t));
  }
  if (trainable_->on_device() && DeviceComm()) {
    // Device memory: the header first (checked before any tensor is written), then every tensor
    // in one BroadcastAll (NCCL: grouped, one wait at the end).
    SyncHeader h = header;
    EDL_RETURN_IF_ERROR(Comm(comm_->Broadcast(h.data(), h.size(), root)));
    EDL_RETURN_IF_ERROR(DecodeSyncHeader(h, from, synced));
    std::vector<BroadcastBuffer> buffers;
    buffers.reserve(tensors.size());
    for (const StateTensor& t : tensors) buffers.push_back({t.data, t.bytes});
    return Comm(comm_->BroadcastAll(buffers, root));
  }
  // Host memory (Gloo; device tensors are copied out and back): one broadcast of the header and
  // every tensor packed into the host staging buffer (a Gloo broadcast costs a round trip each,
  // which dominated the re-form of a ResNet with ~200 tensors). Never a device pointer to Gloo.
  // The header is checked before any tensor is written.
  char* packed = host_.Get(kSyncHeaderBytes + total);
  if (packed == nullptr) {
    return Status::Internal("out of host memory for the " +
                            std::to_string(kSyncHeaderBytes + total) +
                            "-byte state broadcast buffer");
  }
  if (rank_ == root) {
    std::memcpy(packed, header.data(), kSyncHeaderBytes);
    size_t off = kSyncHeaderBytes;
    for (const StateTensor& t : tensors) {
      EDL_RETURN_IF_ERROR(trainable_->CopyToHost(t, packed + off));
      off += t.bytes;
    }
  }
  EDL_RETURN_IF_ERROR(Comm(comm_->Broadcast(packed, kSyncHeaderBytes + total, root)));
  SyncHeader h;
  std::memcpy(h.data(), packed, kSyncHeaderBytes);
  EDL_RETURN_IF_ERROR(DecodeSyncHeader(h, from, synced));
  if (rank_ == root) return Status::OK();
  size_t off = kSyncHeaderBytes;
  for (const StateTensor& t : tensors) {
    EDL_RETURN_IF_ERROR(trainable_->CopyFromHost(t, packed + off));
    off += t.bytes;
  }
  return Status::OK();
}

// The gradients and in-band words, SUM over the generation. NCCL (and Gloo on host tensors)
// reduces GradientBuffer() in place; Gloo with device tensors reduces a host copy, copied back
// (the result is bit-identical to the in-place path: same bytes, same reduction).
Status ElasticTrainer::Impl::AllReduceGradients(float* grad, size_t count) {
  const size_t n = count + Trainable::kInbandSlots;
  if (!StageGradients()) {
    return Comm(comm_->AllReduce(grad, n, DataType::kFloat32, ReduceOp::kSum));
  }
  const StateTensor view = trainable_->GradientTensor();
  char* host = host_.Get(view.bytes);
  if (host == nullptr) {
    return Status::Internal("out of host memory for the " + std::to_string(view.bytes) +
                            "-byte gradient staging buffer");
  }
  EDL_RETURN_IF_ERROR(trainable_->CopyToHost(view, host));
  EDL_RETURN_IF_ERROR(Comm(comm_->AllReduce(host, n, DataType::kFloat32, ReduceOp::kSum)));
  return trainable_->CopyFromHost(view, host);
}

// ---------------------------------------------------------------------------------------------
// One step.

double ElasticTrainer::Impl::StepLr(int64_t global_batch) {
  const double target = schedule_.At(plan_.EpochProgress(state_.position), global_batch);
  return schedule_.Ramp(target, state_.ramp_from_lr, state_.steps_since_reform);
}

Status ElasticTrainer::Impl::Step(StepResult* r) {
  DCHECK(phase_ == TrainerPhase::kResuming || phase_ == TrainerPhase::kTraining) << NameOf(phase_);
  r->batches = Batches();
  const std::vector<int64_t>& b = r->batches;
  r->planned = plan_.StepSamples(state_.position, b);
  const std::vector<std::vector<int64_t>> all = plan_.Step(state_.position, b);
  r->indices = all[rank_];
  const std::vector<int64_t>& indices = r->indices;
  size_t count = 0;
  float* grad = trainable_->GradientBuffer(&count);  // device memory when on_device(): no access
  // Start loading this rank's next slice (as planned for the current world) while this step runs.
  const DataPosition next = plan_.Advance(state_.position, b);
  if (plan_.EpochProgress(next) < o_.epochs &&
      (o_.max_steps == 0 || state_.step + 1 < o_.max_steps)) {
    trainable_->Prefetch(next.epoch, plan_.Slice(next, b, rank_));
  }
  if (const int ahead = trainable_->lookahead_steps(); ahead > 0) {
    std::vector<Trainable::UpcomingStep> next;
    DataPosition pos = state_.position;
    for (int k = 0; k < ahead; ++k) {
      pos = plan_.Advance(pos, b);
      if (plan_.EpochProgress(pos) >= o_.epochs) break;
      next.push_back({pos.epoch, plan_.Slice(pos, b, rank_)});
    }
    trainable_->Lookahead(next);
  }
  Trainable::StepPlan step_plan;
  step_plan.step = state_.step;
  step_plan.position = state_.position;
  step_plan.batch_sizes = b;
  step_plan.rank = rank_;
  step_plan.world_size = gen_.world_size();
  step_plan.generation = gen_.number;
  trainable_->BeginStep(step_plan);
  // The gradient noise scale needs the gradients on the host (a device Trainable's are not
  // measured) and two ranks with samples.
  for (const auto& slice : all) {
    if (!slice.empty()) r->rank_samples.push_back(static_cast<int64_t>(slice.size()));
  }
  const bool measure_noise = !trainable_->on_device() && r->rank_samples.size() >= 2;
  double local_sq = 0;
  if (!indices.empty()) {
    trainable_->SetEpoch(state_.position.epoch);
    const int64_t t0 = clock_->NowMicros();
    EDL_RETURN_IF_ERROR(trainable_->ForwardBackward(indices, &r->stats));
    compute_s_per_sample_.Add(MicrosToSeconds(clock_->NowMicros() - t0) /
                              static_cast<double>(indices.size()));
    // |g_i|^2 of this rank's mean gradient, before its share scales it.
    if (measure_noise) local_sq = SquaredNorm(grad, count);
    const float share = static_cast<float>(indices.size()) / r->planned;
    EDL_RETURN_IF_ERROR(trainable_->ScaleGradients(share));
  } else {
    // A short last step: contribute zeros. The lowest rank with samples lends them as a stand-in.
    const auto lender =
        std::find_if(all.begin(), all.end(), [](const auto& s) { return !s.empty(); });
    EDL_RETURN_IF_ERROR(
        trainable_->EmptyStep(lender != all.end() ? *lender : std::vector<int64_t>()));
  }
  Generation latest;
  membership_->Latest(&latest);
  float* inband = r->inband;
  inband[kSwitchVotes] = latest.number > gen_.number ? SwitchVote(latest) : 0.0f;
  inband[kLossSum] = static_cast<float>(r->stats.loss_sum);
  inband[kCorrect] = static_cast<float>(r->stats.correct);
  inband[kSamples] = static_cast<float>(r->stats.samples);
  inband[kLocalGradSq] = static_cast<float>(local_sq);
  EDL_RETURN_IF_ERROR(trainable_->WriteInband(inband));
  if (sample_log_fd_ >= 0) {
    for (const auto& slice : all) {
      r->global_indices.insert(r->global_indices.end(), slice.begin(), slice.end());
    }
  }
  pending_ = {state_.step + 1, state_.position.epoch, r->global_indices};
  const int64_t sync_t0 = clock_->NowMicros();
  EDL_RETURN_IF_ERROR(AllReduceGradients(grad, count));
  sync_s_.Add(MicrosToSeconds(clock_->NowMicros() - sync_t0));
  EDL_RETURN_IF_ERROR(trainable_->ReadInband(inband));
  // |g_B|^2 of the all-reduced mean gradient: with the sum of the |g_i|^2, one step of the noise
  // scale (identical on every rank). Not a failed step when it cannot tell (GradientNoise::Add).
  if (measure_noise) noise_.Add(r->rank_samples, inband[kLocalGradSq], SquaredNorm(grad, count));
  r->switch_seen = inband[kSwitchVotes] >= static_cast<float>(gen_.world_size());
  r->global_batch = std::accumulate(b.begin(), b.end(), int64_t{0});
  r->lr = StepLr(r->global_batch);
  return trainable_->ApplyUpdate(r->lr);
}

void ElasticTrainer::Impl::CommitStep(const StepResult& r) {
  pending_.step = -1;
  const int64_t epoch = state_.position.epoch;
  state_.step++;
  state_.position = plan_.Advance(state_.position, r.batches);
  state_.last_lr = r.lr;
  state_.last_global_batch = r.global_batch;
  state_.steps_since_reform++;
  if (r.inband[kSamples] > 0) last_loss_ = r.inband[kLossSum] / r.inband[kSamples];
  LogSamples(state_.step, epoch, r.global_indices, last_loss_, &r.indices, &r.stats);
}

Status ElasticTrainer::Impl::ReportStep(const StepResult& r) {
  const int64_t now = clock_->NowMicros();
  // A trainer that never stepped (a joiner whose generation was superseded) has no stall.
  if (phase_ == TrainerPhase::kResuming && last_step_end_us_ > 0) {
    Event(StallEvent(now));
  } else if (last_step_end_us_ == 0 && o_.joining) {
    Event({{"event", "joiner_first_step"},
           {"generation", gen_.number},
           {"since_start_s", MicrosToSeconds(now - start_us_)}});
  }
  if (phase_ == TrainerPhase::kResuming) Enter(TrainerPhase::kTraining);
  last_step_end_us_ = now;
  eval_kept_us_ = 0;
  if (o_.observer != nullptr) {
    StepReport report;
    report.step = state_.step;
    report.position = state_.position;
    report.epochs_done = plan_.EpochProgress(state_.position);
    report.loss = last_loss_;
    report.correct = static_cast<int64_t>(r.inband[kCorrect]);
    report.samples = static_cast<int64_t>(r.inband[kSamples]);
    report.planned = r.planned;
    report.lr = r.lr;
    report.generation = gen_.number;
    report.world_size = gen_.world_size();
    report.rank = rank_;
    o_.observer->OnStep(report);
  }
  if (rank_ == 0 && o_.loader != nullptr) {
    EDL_RETURN_IF_ERROR(o_.loader->AfterStep(trainable_, state_, Context()));
    ReportLoaderEvents();
  }
  // This rank's own samples: the control plane sums the members' rates into the job's rate.
  progress_samples_ += static_cast<int64_t>(r.indices.size());
  if (o_.progress_every > 0 && state_.step % o_.progress_every == 0) {
    ProgressInfo p;
    p.generation = gen_.number;
    p.step = state_.step;
    p.epoch = state_.position.epoch;
    p.loss = last_loss_;
    p.world_size = gen_.world_size();
    p.accuracy = accuracy_;
    p.samples = state_.position.epoch * plan_.num_samples() + state_.position.cursor;
    const double secs = MicrosToSeconds(now - progress_t0_us_);
    p.images_per_sec = secs > 0 ? progress_samples_ / secs : 0;
    if (noise_.ready()) {
      p.noise_steps = noise_.steps();
      p.grad_sqr = noise_.grad_sqr();
      p.grad_var = noise_.grad_var();
      p.noise_scale = noise_.noise_scale();
    }
    p.compute_s_per_sample = compute_s_per_sample_.value();
    p.sync_s = gen_.world_size() > 1 ? sync_s_.value() : -1;
    p.batch = o_.batch;
    p.batch_policy = o_.batch_policy;
    progress_t0_us_ = now;
    progress_samples_ = 0;
    // Best effort: progress is advisory; a broken channel fails the next membership wait.
    (void)membership_->ReportProgress(p);
  }
  return Status::OK();
}

Status ElasticTrainer::Impl::SwitchGeneration() {
  Enter(TrainerPhase::kSwitching);
  stall_ = StallPhases();
  Generation latest;
  membership_->Latest(&latest);
  int64_t target = latest.number;
  Status s = Comm(comm_->AllReduce(&target, 1, DataType::kInt64, ReduceOp::kMax));
  if (!s.ok()) return Recover(s);
  const int64_t agreed = clock_->NowMicros();
  if (latest.number < target) {
    EDL_RETURN_IF_ERROR(WaitNewer(target - 1, &latest));
    stall_.wait_gen_us += clock_->NowMicros() - agreed;
  }
  switch_step_ = state_.step;
  reform_was_failure_ = false;
  LOG(INFO) << me_ << ": switching from generation " << gen_.number << " to " << latest.number
            << " after step " << state_.step;
  // Everything up to the re-form but the wait (the log line included: it may block on a loaded
  // machine, and the phases must cover the stall).
  stall_.mark_us = clock_->NowMicros();
  stall_.eval_us = eval_kept_us_;
  eval_kept_us_ = 0;
  stall_.agree_us = stall_.mark_us - last_step_end_us_ - stall_.wait_gen_us - stall_.eval_us;
  Enter(TrainerPhase::kReforming);
  return Reform(latest);
}

Status ElasticTrainer::Impl::Recover(const Status& cause) {
  DCHECK(comm_failed_) << cause.ToString();
  Enter(TrainerPhase::kRecovering);
  const int64_t failed_at = clock_->NowMicros();
  LOG(WARNING) << me_ << ": generation " << gen_.number << " failed at step " << state_.step + 1
               << " (" << cause.ToString() << "); discarding the step and re-forming";
  const int64_t failed_gen = gen_.number;
  stall_ = StallPhases();
  stall_.eval_us = eval_kept_us_;  // an evaluation done (or the part of it kept) is not lost
  eval_kept_us_ = 0;
  stall_.lost_us = failed_at - last_step_end_us_ - stall_.eval_us;
  switch_step_ = state_.step;
  reform_was_failure_ = true;
  {
    MutexLock lock(&comm_mu_);  // the watcher may be aborting it too
    if (watched_comm_ != nullptr) watched_comm_->Abort();
  }
  // The server may not know yet that a peer died (its client died with it): this report and the
  // closed connection of the peer's node let it drop that node's trainers at once
  // (JobMembership::CommFailed). Also when a newer generation is known: another trainer's exit may
  // have committed it, with the dead client's trainers still in.
  Event({{"event", "comm_failed"}, {"generation", failed_gen}});
  Generation next;
  if (!membership_->Latest(&next) || next.number <= failed_gen) {
    EDL_RETURN_IF_ERROR(WaitNewer(failed_gen, &next));
  }
  stall_.mark_us = clock_->NowMicros();
  stall_.wait_gen_us += stall_.mark_us - failed_at;
  Enter(TrainerPhase::kReforming);
  return Reform(next);
}

Status ElasticTrainer::Impl::Evaluate(double* accuracy) {
  const int64_t t0 = clock_->NowMicros();
  const int64_t n = trainable_->test_size();
  EvalPartial& part = eval_partial_;
  if (part.step != state_.step) part = EvalPartial{state_.step, {}, {0, 0, 0, 0}};
  int64_t computed_us = 0;  // this call's evaluation work, kept in `part` whatever happens next
  auto cut = [&](Status s) {
    eval_kept_us_ += computed_us;
    return s;
  };
  // After a failure cut this step's evaluation short, the survivors hold what they evaluated:
  // the samples nobody holds are left (in order), and the members share those instead of all n.
  double held_any = part.samples.empty() ? 0 : 1;
  if (Status s = Comm(comm_->AllReduce(&held_any, 1, DataType::kFloat64, ReduceOp::kMax));
      !s.ok()) {
    return cut(s);
  }
  std::vector<int64_t> left;
  if (held_any > 0) {
    std::vector<float> held(static_cast<size_t>(n), 0.f);
    for (int64_t i : part.samples) held[static_cast<size_t>(i)] = 1.f;
    Status s = Comm(comm_->AllReduce(held.data(), held.size(), DataType::kFloat32, ReduceOp::kMax));
    if (!s.ok()) return cut(s);
    for (int64_t i = 0; i < n; ++i) {
      if (held[static_cast<size_t>(i)] == 0.f) left.push_back(i);
    }
  }
  // Without a cut evaluation: the same even shards of 0..n-1 as ever.
  int64_t begin = 0, end = 0;
  EvenShard(held_any > 0 ? static_cast<int64_t>(left.size()) : n, rank_, gen_.world_size(), &begin,
            &end);
  const int64_t chunk = std::max<int64_t>(1, o_.eval_batch);
  std::vector<int64_t> idx;
  for (int64_t b0 = begin; b0 < end; b0 += chunk) {
    // A failure generation superseded this one: its communicator is (about to be) aborted, so
    // the all-reduce below would fail anyway; the rest of the shard is not worth computing first.
    // (The watcher's newest_failure_, or the newest generation itself before the watcher woke.)
    Generation newest;
    if (newest_failure_.load() > gen_.number ||
        (membership_->Latest(&newest) && newest.number > gen_.number && newest.failure)) {
      return cut(Comm(Status::Aborted("a failure generation superseded generation " +
                                      std::to_string(gen_.number) + " during the evaluation")));
    }
    const int64_t c0 = clock_->NowMicros();
    idx.resize(std::min(end, b0 + chunk) - b0);
    if (held_any > 0) {
      std::copy(left.begin() + b0, left.begin() + b0 + static_cast<int64_t>(idx.size()),
                idx.begin());
    } else {
      std::iota(idx.begin(), idx.end(), b0);
    }
    StepStats stats;
    if (Status s = trainable_->Evaluate(idx, &stats); !s.ok()) return cut(s);
    part.sums[0] += stats.loss_sum;
    part.sums[1] += static_cast<double>(stats.correct);
    part.sums[2] += static_cast<double>(stats.samples);
    part.sums[3] += stats.correct_top5 >= 0 ? static_cast<double>(stats.correct_top5) : -1e18;
    part.samples.insert(part.samples.end(), idx.begin(), idx.end());
    computed_us += clock_->NowMicros() - c0;
  }
  double v[4];
  std::copy(part.sums, part.sums + 4, v);
  if (Status s = Comm(comm_->AllReduce(v, 4, DataType::kFloat64, ReduceOp::kSum)); !s.ok()) {
    return cut(s);
  }
  part = EvalPartial();  // complete: nothing is held any more
  eval_kept_us_ += clock_->NowMicros() - t0;
  *accuracy = v[2] > 0 ? v[1] / v[2] : -1;
  last_eval_step_ = state_.step;
  if (o_.observer != nullptr) {
    EvalReport r;
    r.step = state_.step;
    r.epoch = state_.position.epoch;
    r.loss = v[2] > 0 ? v[0] / v[2] : 0.0;
    r.accuracy = *accuracy;
    r.accuracy_top5 = v[2] > 0 && v[3] >= 0 ? v[3] / v[2] : -1;
    r.samples = static_cast<int64_t>(v[2]);
    r.generation = gen_.number;
    r.world_size = gen_.world_size();
    r.rank = rank_;
    r.seconds = MicrosToSeconds(clock_->NowMicros() - t0);
    o_.observer->OnEval(r);
  }
  Event({{"event", "eval"},
         {"generation", gen_.number},
         {"step", state_.step},
         {"loss", v[2] > 0 ? v[0] / v[2] : 0.0},
         {"accuracy", *accuracy}});
  return Status::OK();
}

bool ElasticTrainer::Impl::Done() const {
  if (o_.max_steps > 0 && state_.step >= o_.max_steps) return true;
  return plan_.EpochProgress(state_.position) >= o_.epochs;
}

void ElasticTrainer::Impl::LogSamples(int64_t step, int64_t epoch,
                                      const std::vector<int64_t>& indices, double loss,
                                      const std::vector<int64_t>* fed, const StepStats* fed_stats) {
  if (sample_log_fd_ < 0) return;
  nlohmann::json j = {{"trainer", me_}, {"generation", gen_.number},
                      {"rank", rank_},  {"world", gen_.world_size()},
                      {"step", step},   {"epoch", epoch},
                      {"idx", indices}, {"time", MicrosToSeconds(Clock::Real()->NowMicros())}};
  j["loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json();
  if (fed != nullptr) j["fed_idx"] = *fed;
  if (fed_stats != nullptr && fed_stats->label_hash != 0) {
    j["label_hash"] = std::to_string(fed_stats->label_hash);
  }
  const std::string line = j.dump() + "\n";
  // One write(2) with O_APPEND: lines of trainers sharing the file never interleave.
  if (::write(sample_log_fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    LOG(WARNING) << me_ << ": short write to sample log " << o_.sample_log_path;
  }
}

void ElasticTrainer::Impl::ReportLoaderEvents() {
  for (nlohmann::json& e : o_.loader->TakeEvents()) {
    e["generation"] = gen_.number;
    if (!e.contains("step")) e["step"] = state_.step;
    Event(std::move(e));
  }
}

void ElasticTrainer::Impl::Event(nlohmann::json e) {
  e["trainer"] = me_;
  e["pid"] = static_cast<int64_t>(::getpid());
  (void)membership_->ReportEvent(e);  // best effort, as progress (ReportStep)
}

// ---------------------------------------------------------------------------------------------

ElasticTrainer::ElasticTrainer(ElasticOptions options, Trainable* trainable,
                               MembershipSource* membership)
    : impl_(std::make_unique<Impl>(std::move(options), trainable, membership)) {}
ElasticTrainer::~ElasticTrainer() = default;
Status ElasticTrainer::Run(ElasticResult* result) { return impl_->Run(result); }

}  // namespace edl::runtime
