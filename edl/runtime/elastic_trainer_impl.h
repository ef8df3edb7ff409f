// Internal to edl/runtime: the elastic loop's implementation class, shared by
// elastic_trainer.cc (run, re-form, state sync, steps) and elastic_trainer_switch.cc (prepared
// communicators, the watcher, stall events). Not part of the public API: include elastic_trainer.h.
// The loop's invariants are stated at the top of elastic_trainer.cc; its phases and their
// transitions (TrainerPhase) in trainer_phase.h.
//
// Thread-safety: Run() and everything it calls run on the training thread, which owns every member
// not marked otherwise, the phase included. The watcher thread and the helper threads that build
// or tear down communicators touch only the members annotated GUARDED_BY (with their mutex held),
// the atomics and the members fixed at construction.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/nccl_reform.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/host_staging.h"
#include "edl/runtime/self_measure.h"
#include "edl/runtime/trainer_phase.h"

namespace edl::runtime {

class ElasticTrainer::Impl {
 public:
  Impl(ElasticOptions o, Trainable* t, MembershipSource* m)
      : o_(std::move(o)),
        trainable_(t),
        membership_(m),
        me_(m->trainer_id()),
        clock_(o_.clock ? o_.clock : Clock::Real()),
        plan_(t->train_size(), o_.seed),
        schedule_(o_.lr) {}
  ~Impl() {
    StopWatcher();
    JoinPrepared();
    if (sample_log_fd_ >= 0) ::close(sample_log_fd_);
  }

  Status Run(ElasticResult* result);

 private:
  // ---- membership and communicator
  Status FirstGeneration(Generation* gen);
  Status WaitNewer(int64_t after, Generation* out);
  Status Reform(Generation target);
  StatusOr<std::unique_ptr<Communicator>> BuildComm(const Generation& target, int rank);
  // NCCL: whether `target`'s communicator is a ncclCommShrink of the current one (a planned
  // shrink with NCCL >= 2.27, survivors in order; nccl_reform.h) or a fresh init.
  NcclBuildPlan PlanNccl(const Generation& target);
  // The shrink of `plan` (REQUIRES: comm_ is the healthy communicator of gen_).
  StatusOr<std::unique_ptr<Communicator>> ShrinkComm(const Generation& target, int rank,
                                                     const NcclBuildPlan& plan);
  // Make-before-break: see "Prepared communicators" below.
  // A planned generation with this trainer in it whose communicator is built ahead (Gloo, and
  // NCCL unless it is a shrink of the current one).
  bool BuildsAhead(const Generation& g);                      // watcher or training thread
  void MaybePrepare(const Generation& g) EXCLUDES(prep_mu_);  // watcher thread; SwitchVote
  // Training thread: true and the communicator built ahead for `*target` (or for a newer
  // generation, which then replaces *target), or false when there is none; either way no
  // prepared build of `*target` starts afterwards.
  bool TakePrepared(Generation* target, StatusOr<std::unique_ptr<Communicator>>* comm)
      EXCLUDES(prep_mu_);
  void JoinPrepared() EXCLUDES(prep_mu_);  // waits for a prepared build in flight (shutdown)
  // Training thread: this trainer's vote on the switch to `latest` (newer than gen_), carried
  // in-band and SUM-reduced; the switch step is the first whose sum reaches the world size. See
  // "Prepared communicators" in elastic_trainer_switch.cc.
  float SwitchVote(const Generation& latest);
  void Retire(std::unique_ptr<Communicator> old);  // destroys `old` on a helper thread
  void JoinRetired(bool all);  // joins finished teardowns (all: every one, at shutdown)
  // CommOptions::interrupt of generation `number`'s communicator: Aborted at shutdown, when a
  // newer generation supersedes it while it is built, or when a failure generation newer than it
  // is committed (then also while it runs collectives). Reads the watcher's atomics only.
  std::function<Status(CommPhase)> Interrupt(int64_t number);
  Status WarmUp(int world);  // a joiner's first forward/backward, before it reports ready
  void InstallComm(std::unique_ptr<Communicator> comm, const Generation& gen, int rank)
      EXCLUDES(comm_mu_);
  void StartWatcher();
  void StopWatcher();
  void WatchLoop();
  Status Comm(Status s) {  // records that a communicator call failed (comm_failed_)
    if (!s.ok()) comm_failed_ = true;
    return s;
  }

  // ---- steps and state
  // Syncs state_ and the tensors from the member holding the newest state. *evaluated: some member
  // completed the evaluation of the synced step before this re-form (the same on every member).
  Status SyncState(int64_t* newest_seen, bool* evaluated);
  // A hash of Trainable::Fingerprint() in [0, 2^63) (computed once), which SyncState compares.
  int64_t FingerprintWord();
  Status FingerprintMismatch(int root);  // the ranks' fingerprints differ; see the definition
  // Broadcasts the training state's header and the StateTensors (only the per_rank ones when
  // `per_rank_only`) from `root`, in one collective on the host path; *synced gets the root's
  // header, checked before any tensor is written.
  Status BroadcastState(int root, bool per_rank_only, TrainingState* synced);
  // ---- phases (trainer_phase.h)
  // The one place the phase changes: CHECKs that phase_ -> next is legal and logs it (VLOG(1)).
  void Enter(TrainerPhase next);
  // resuming or training: one step (Step, CommitStep, ReportStep), then the switch when the step's
  // votes carried one (SwitchGeneration), or the evaluation of the epoch the step ended
  // (EvaluateThen). A failed collective re-forms (Recover); any other error is returned.
  Status TrainOneStep();
  // evaluating: Evaluate(), then the phase `next` (training after an epoch end's evaluation,
  // resuming after a re-form's). A failed collective re-forms (Recover); any other error (the
  // Trainable's) is returned.
  Status EvaluateThen(TrainerPhase next);
  // What Step() computed, which CommitStep() and ReportStep() take.
  struct StepResult {
    std::vector<int64_t> batches;         // each rank's batch in gen_ (Batches())
    int64_t planned = 0;                  // samples the data plan gave the step, all ranks
    int64_t global_batch = 0;             // sum of `batches`
    std::vector<int64_t> indices;         // this rank's slice
    std::vector<int64_t> global_indices;  // every rank's slices; only with a sample log
    StepStats stats;                      // of this rank's forward/backward
    // The in-band words (InbandSlot); after the all-reduce, summed over the ranks.
    float inband[Trainable::kInbandSlots] = {};
    std::vector<int64_t> rank_samples;  // the samples of each rank that had some (the noise scale)
    double lr = 0;                      // the update's learning rate
    bool switch_seen = false;  // the members' votes reached the world size: switch after it
  };
  // REQUIRES: phase resuming or training. Runs the next step of the data plan: this rank's
  // forward/backward, the all-reduce of the gradients and the in-band words, the update. Commits
  // nothing: state_ is as before, and pending_ holds the step in flight (a sync after a failure
  // logs its samples if other ranks committed it). An error is the communicator's (comm_failed_
  // set: the step is discarded) or the Trainable's.
  Status Step(StepResult* r);
  // REQUIRES: Step(r) returned OK. Commits the step: advances state_ (step, data position, LR and
  // re-form bookkeeping), takes its global loss, logs its samples and clears pending_. Cannot
  // fail: a step whose all-reduce and update completed on this rank is committed on it.
  void CommitStep(const StepResult& r);
  // REQUIRES: CommitStep(r) just ran. Reports the committed step: ends phase resuming (its stall,
  // or a joiner's first step), then the observer, the loader's AfterStep on rank 0 (whose error,
  // returned, stops training) and, every progress_every steps, progress to the control plane.
  Status ReportStep(const StepResult& r);
  // REQUIRES: phase training (after the switch step's report). switching, then reforming (or
  // recovering, when the agreement's collective fails).
  Status SwitchGeneration();
  // REQUIRES: a collective of gen_ failed (comm_failed_), in phase resuming, training, evaluating
  // or switching. recovering: aborts the communicator, reports it, waits for a newer generation;
  // then reforming.
  Status Recover(const Status& cause);
  Status Evaluate(double* accuracy);
  bool Done() const;
  std::vector<int64_t> Batches() const {
    return BatchSizes(o_.batch_policy, o_.batch, gen_.world_size());
  }
  double StepLr(int64_t global_batch);
  // Appends the global step's indices (all ranks) to the sample log; loss NaN when unknown.
  // `fed`: this rank's slice and the StepStats of feeding it, when it applied the step itself.
  void LogSamples(int64_t step, int64_t epoch, const std::vector<int64_t>& indices, double loss,
                  const std::vector<int64_t>* fed = nullptr, const StepStats* fed_stats = nullptr);
  StepContext Context() const { return {gen_.number, gen_.world_size(), rank_}; }
  void Event(nlohmann::json e);
  // The loader's events (e.g. checkpoint_failed), with this generation: rank 0, loader set.
  void ReportLoaderEvents();

  const ElasticOptions o_;
  Trainable* const trainable_;          // not owned
  MembershipSource* const membership_;  // not owned
  const std::string me_;
  Clock* const clock_;
  DataPlan plan_;
  const LrSchedule schedule_;

  // The communicator and the generation it belongs to are the training thread's: it alone
  // replaces them (InstallComm) and reads them without a lock. The watcher sees them through the
  // copies under comm_mu_, which InstallComm publishes with every replacement.
  std::unique_ptr<Communicator> comm_;
  Generation gen_;
  int rank_ = -1;
  // Whether a call on the communicator in hand (or, while comm_ is null in a re-form, on the last
  // one) failed; InstallComm clears it with each new one. Data about the communicator, not a
  // phase: a collective may fail in every phase that runs one (joining's and reforming's syncs
  // too, which go on to the next generation in the same phase), and it stays set across a re-form
  // attempt whose build fails. It classifies an error (the communicator's: re-form; anything
  // else: the Trainable failed) and tells a re-form that the old communicator cannot be shrunk and
  // that the state in hand is not an agreed one (no stop checkpoint).
  bool comm_failed_ = false;
  Mutex comm_mu_;  // also serialises the Abort() of the training thread and of the watcher
  Communicator* watched_comm_ GUARDED_BY(comm_mu_) = nullptr;      // comm_.get()
  std::vector<std::string> watched_members_ GUARDED_BY(comm_mu_);  // gen_.members
  std::atomic<int64_t> gen_number_{0};                             // gen_.number

  // What the trainer is doing (trainer_phase.h); changed only by Enter(). Training thread only.
  TrainerPhase phase_ = TrainerPhase::kJoining;
  // Synced from the generation's root at each re-form; holds no step in phase joining.
  TrainingState state_;
  int64_t fingerprint_word_ = -1;  // FingerprintWord(); -1 until computed
  struct Pending {
    int64_t step = -1, epoch = 0;
    std::vector<int64_t> indices;  // the whole step's (every rank's)
  } pending_;
  // The step whose evaluation this rank completed; after each re-form the members' agreed value
  // (the synced step when some member had completed its evaluation, else -1: Reform).
  int64_t last_eval_step_ = -1;
  // What this rank evaluated of the evaluation at `step` while it is not complete: a failure that
  // cuts it short keeps it, and after the re-form the members evaluate only the test samples no
  // survivor holds (Evaluate). Its size is bounded by the test set.
  struct EvalPartial {
    int64_t step = -1;
    std::vector<int64_t> samples;   // the test samples this rank evaluated
    double sums[4] = {0, 0, 0, 0};  // their loss sum, correct, samples, top-5 correct (< 0: none)
  } eval_partial_;
  // Evaluation work done since the last step ended whose results are kept (a whole evaluation,
  // or the part of a cut one this rank holds): a stall reports it as `eval_s`, not as time lost.
  int64_t eval_kept_us_ = 0;

  // Events: stall of a survivor (StallEvent, reported by the step that ends phase resuming) / time
  // to first step of a joiner. The fields after last_step_end_us_ describe the last re-form for
  // its stall event: reporting data, kept from the re-form to the step after it.
  int64_t start_us_ = 0;
  int64_t last_step_end_us_ = 0;  // 0: no step yet
  int64_t reform_from_gen_ = 0;   // the generation before the last re-form, and its size
  int reform_from_world_ = 0;
  int64_t switch_step_ = 0;
  // Whether the last re-form answered a failure (recovering) or a planned change (switching);
  // only the stall event reads it.
  bool reform_was_failure_ = false;
  // The stall's breakdown (docs/ARCHITECTURE.md, "The stall and its phases"): microseconds this
  // survivor spent in each phase of the re-form in progress, each measured between its own
  // readings, so time outside every phase shows up as a gap between their sum and the stall. (The
  // stall's phases, not TrainerPhase: these are times, several per re-form.)
  struct StallPhases {
    int64_t lost_us = 0;      // failure: end of the last step to the failed collective (the
                              // step in flight, lost), per-step hooks included
    int64_t wait_gen_us = 0;  // waiting for the next (or a newer) generation to arrive
    int64_t agree_us = 0;     // planned: end of the switch step to the agreed target, hooks too
    int64_t reform_us = 0;    // closing the old communicator and building the new one(s)
    int64_t sync_us = 0;      // state sync: the root's agreement and the broadcasts
    int64_t eval_us = 0;      // evaluation work kept before the re-form (eval_kept_us_)
    int64_t sync_end_us = 0;  // when the last sync ended (the first step starts there)
    int64_t mark_us = 0;      // the clock reading that ended the latest phase (0: none yet): the
                              // next phase starts at it, so the phases are contiguous and add up
                              // to the stall exactly, whatever preemption lands between them
    int attempts = 0;         // communicators built (> 1: superseded or failed meanwhile)
    bool prepared = false;    // the last one was built ahead, while training (make-before-break)
  } stall_;
  // When this trainer first saw each generation newer than gen_ (monotonic and wall-clock
  // micros), recorded by the watcher; bounded: entries up to gen_ are dropped at each re-form.
  Mutex seen_mu_;
  std::map<int64_t, std::pair<int64_t, int64_t>> seen_at_ GUARDED_BY(seen_mu_);
  void NoteSeen(int64_t number) EXCLUDES(seen_mu_);
  // And forgets generations up to `number`.
  std::pair<int64_t, int64_t> SeenAt(int64_t number) EXCLUDES(seen_mu_);
  nlohmann::json StallEvent(int64_t now);

  double last_loss_ = 0, accuracy_ = -1;
  // The communicator reads device memory (NCCL); Gloo reads host memory.
  bool DeviceComm() const { return comm_->backend() == std::string("nccl"); }
  // The gradient all-reduce copies through host_ rather than handing GradientBuffer() to comm_.
  bool StageGradients() const {
    return o_.stage_through_host || (trainable_->on_device() && !DeviceComm());
  }
  Status AllReduceGradients(float* grad, size_t count);
  // Staged gradients and packed state (kept: steps and re-forms recur).
  HostStaging host_{trainable_};
  int64_t progress_t0_us_ = 0, progress_samples_ = 0;
  // What the job measures of itself (self_measure.h): the gradient noise scale (the same on every
  // rank: its inputs are all-reduced), and this rank's compute and all-reduce time per step.
  GradientNoise noise_;
  Ema compute_s_per_sample_{0.9}, sync_s_{0.9};
  int sample_log_fd_ = -1;

  std::thread watcher_;
  std::atomic<bool> stop_watcher_{false};
  // Newest committed generation and newest failure generation the watcher has seen.
  std::atomic<int64_t> newest_seen_{0};
  std::atomic<int64_t> newest_failure_{0};

  std::atomic<int> nccl_version_{0};  // NcclRuntimeVersion() (NCCL jobs; set once in Run())
  std::vector<std::string> GenMembers() EXCLUDES(comm_mu_) {  // gen_.members, for the watcher
    MutexLock lock(&comm_mu_);
    return watched_members_;
  }
  // Prepared communicators: prep_thread_ is started by the watcher (or the training thread) and
  // joined by the training thread (or at shutdown), each moving it out under prep_mu_ to join it.
  Mutex prep_mu_;
  std::atomic<bool> cancel_prep_{false};  // shutdown: rendezvous waits give up
  // Highest generation a communicator build was started for.
  int64_t claimed_ GUARDED_BY(prep_mu_) = 0;
  Generation prep_gen_ GUARDED_BY(prep_mu_);  // number 0: no prepared build
  std::thread prep_thread_ GUARDED_BY(prep_mu_);
  bool prep_done_ GUARDED_BY(prep_mu_) = false;
  StatusOr<std::unique_ptr<Communicator>> prep_comm_ GUARDED_BY(prep_mu_){
      Status::Unavailable("not built")};
  // Teardowns of old communicators in flight (training thread only), each with its done flag.
  struct Retiring {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Retiring> retiring_;
};

}  // namespace edl::runtime
