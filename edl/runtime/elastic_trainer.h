// ElasticTrainer: the in-place elastic training loop (docs/ARCHITECTURE.md, "Generations and the
// re-form"). It drives a Trainable through steps over a communicator of the current generation and,
// when the MembershipSource commits a newer generation, switches at a step every rank agrees on:
//
//   - in-band agreement: the spare slot GradientBuffer()[count] carries "a newer committed
//     generation was seen" (1.0) and is SUM-reduced with the gradients, so the step after which
//     it is > 0 is the switch step on every rank; one tiny MAX all-reduce then fixes the target
//     generation number;
//   - re-form: a new communicator under "gen/<n>/<backend>"; a trainer that is not a member of
//     the target finishes the switch step and returns (left = true, exit 0); for a planned
//     change (not a failure) the members build it ahead, on a helper thread while they train on
//     the current one (make-before-break, Gloo), and switch to it at the agreed step;
//   - failure: a generation marked failure aborts the communicator (from a watcher thread), the
//     step in flight is discarded where it did not complete, and the survivors re-form;
//   - state sync: MAX-reduce the committed step; the lowest rank holding it broadcasts every
//     StateTensor (packed into one broadcast on host memory) plus the step, data position and
//     LR-ramp state; when every rank already holds that step (e.g. a pure shrink) only the
//     tensors marked per_rank (BN running statistics); if nobody holds state (first start, or
//     every trainer died) rank 0 cold-starts from the StateLoader, then broadcasts.
//
// Data: DataPlan (exactly once per epoch), gradients weighted by each rank's sample count, LR by
// LrSchedule with linear scaling against the current global batch and a ramp after re-forms.
//
// Thread-safety: Run() is called once, from the thread that owns the Trainable. Internally a
// watcher thread reads the MembershipSource and may Abort() the current communicator, and a
// helper thread builds the next generation's communicator ahead of the switch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/runtime/data_plan.h"
#include "edl/runtime/lr_schedule.h"
#include "edl/runtime/membership.h"
#include "edl/runtime/trainable.h"
#include "edl/runtime/training_state.h"

namespace edl::runtime {

// Where a committed step happened (checkpoint fencing and metadata).
struct StepContext {
  int64_t generation = 0;
  int world_size = 0;
  int rank = 0;
};

// Checkpoint hook (CheckpointLoader over edl/ckpt in production; tests use their own).
class StateLoader {
 public:
  virtual ~StateLoader() = default;
  // Cold start, on rank 0 only: loads the latest checkpoint into the Trainable's tensors and
  // *state. NotFound when there is none (the trainer's fresh initialisation is used); any other
  // error fails the start.
  virtual Status Load(Trainable* trainable, TrainingState* state) = 0;
  // Called on rank 0 of the current generation after each committed step; may snapshot (the
  // loader decides how often). An error stops training.
  virtual Status AfterStep(Trainable* trainable, const TrainingState& state,
                           const StepContext& ctx) {
    return Status::OK();
  }
  // Called on rank 0 when training completes (not when the trainer leaves): a final save.
  virtual Status Finish(Trainable* trainable, const TrainingState& state, const StepContext& ctx) {
    return Status::OK();
  }
  // Records for the job's events log (each a trainer event's payload with its "event" name) of
  // what happened since the last call: saves that finished ("checkpoint_saved", counted by the
  // server's metrics: jobserver/http/metrics.h) and saves the checkpoint fence refused or that
  // failed
  // ("checkpoint_failed"). Called on rank 0 after AfterStep and Finish; the trainer adds the
  // generation, the step (when the record has none), trainer and pid.
  virtual std::vector<nlohmann::json> TakeEvents() { return {}; }
};

// What a committed step looked like across the whole generation (every rank gets the same).
struct StepReport {
  int64_t step = 0;        // committed steps so far
  DataPosition position;   // after the step
  double epochs_done = 0;  // fractional epochs after the step
  double loss = 0;         // mean training loss of the step over all ranks' samples
  int64_t correct = 0;     // top-1 correct of the step, all ranks
  int64_t samples = 0;     // samples of the step, all ranks
  // Samples the data plan gave the step, all ranks: more than `samples` when some could not be
  // loaded and were skipped (--data imagefolder skips unreadable files).
  int64_t planned = 0;
  double lr = 0;
  int64_t generation = 0;
  int world_size = 0;
  int rank = 0;
};

struct EvalReport {
  int64_t step = 0;
  int64_t epoch = 0;  // epochs completed when evaluated
  double loss = 0, accuracy = 0;
  double accuracy_top5 = -1;  // -1 when the Trainable computes no top-5
  int64_t samples = 0;        // test samples evaluated, all ranks
  int64_t generation = 0;
  int world_size = 0;
  int rank = 0;
  double seconds = 0;
};

// Progress output (e.g. `edl train`'s progress lines on rank 0). Called on the training thread.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  virtual void OnStep(const StepReport& report) {}
  virtual void OnEval(const EvalReport& report) {}
};

struct ElasticOptions {
  int64_t batch = 32;  // per-rank (fixed-local) or global (fixed-global) batch
  BatchPolicy batch_policy = BatchPolicy::kFixedLocal;
  uint64_t seed = 1;      // epoch permutations
  double epochs = 1;      // train until this many epochs (samples seen / N) ...
  int64_t max_steps = 0;  // ... or this many steps, when > 0
  LrScheduleOptions lr;
  bool joining = false;         // a hot joiner (EDL_JOINING=1): report ready, wait to be committed
  int64_t join_generation = 0;  // the pending generation a joiner was started for
                                // (EDL_GENERATION); 0: newest known + 1
  int join_world = 0;  // that generation's size (WORLD_SIZE), for the warm-up; 0: newest known + 1
  int64_t start_micros = 0;  // Clock time preparation began, for time-to-ready (0: Run())
  // The batch a warm spare already ran WarmUpTrainable with (0: none): a joiner whose warm-up
  // batch is the same skips its own.
  int64_t warmed_samples = 0;
  std::string backend = "gloo";  // "gloo" or "nccl" (SelectCommBackend resolves --comm)
  std::string host;              // address the communicator binds (empty: loopback)
  int cuda_device = -1;          // NCCL only
  // Stage the gradient all-reduce through a host buffer even when the Trainable's memory is host
  // memory (tests: the path a Gloo job with device tensors takes, checked on CPU). Staging is
  // automatic whenever the Trainable is on_device() and the communicator reads host memory.
  bool stage_through_host = false;
  std::chrono::milliseconds comm_timeout{30000};     // rendezvous and every collective
  std::chrono::milliseconds generation_wait{60000};  // wait for a new generation after a failure
                                                     // or, for a joiner, to be committed
  // Broadcast every state tensor at each re-form even when all ranks hold the same step. Without
  // it such a re-form (e.g. a pure shrink) broadcasts only the StateTensors marked per_rank.
  bool always_broadcast_state = false;
  bool evaluate_each_epoch = false;  // sharded evaluation at every epoch end and at the end
  int64_t eval_batch = 256;          // test samples per Evaluate call
  int progress_every = 10;           // ReportProgress every this many steps
  // What every member of one job must share (the model's shapes, the data, the seed, the batch),
  // as ";"-separated "name=value" fields (empty: not reported); reported once as a "config"
  // event, and the server refuses a joiner whose value differs from the job's (PROTOCOL.md
  // "Trainer events").
  std::string config_fingerprint;
  // Tests: append one JSON line per committed step with the GLOBAL step's indices (every rank's
  // slice, which each rank derives from the DataPlan): {"trainer","generation","rank","world",
  // "step","epoch","loss","idx":[...]}, plus what this rank fed its model in that step when it
  // applied the step itself: "fed_idx" (its slice) and "label_hash" (StepStats::label_hash, when
  // the Trainable computes one); one write(2) per line, so trainers may share the file.
  std::string sample_log_path;
  StateLoader* loader = nullptr;         // not owned; may be null (no checkpoints)
  TrainingObserver* observer = nullptr;  // not owned; may be null
  Clock* clock = nullptr;                // null: Clock::Real()
};

struct ElasticResult {
  bool left = false;        // this trainer was not in a newer generation and stopped
  int64_t step = 0;         // committed steps at return
  int64_t generation = 0;   // generation trained in last
  double last_loss = 0;     // mean training loss of the last step (global)
  double accuracy = -1;     // last evaluation, -1 if none
  uint64_t state_hash = 0;  // StateHash() at return
};

// --comm: "auto" picks "nccl" for device tensors (Trainable::on_device()) and "gloo" for host
// ones; "nccl" and "gloo" are taken as given. InvalidArgument for an unknown name or "nccl" with
// host tensors (NCCL reduces device memory only); FailedPrecondition for "nccl" when
// `nccl_available` is false (no CUDA plugin with NCCL), naming the fix. "auto" with device tensors
// and no NCCL also picks "gloo" (its gradients are staged through host memory).
StatusOr<std::string> SelectCommBackend(const std::string& comm, bool on_device,
                                        bool nccl_available);

// Whether the CUDA plugin (edl/runtime/cuda_plugin.h) loads and carries the NCCL communicator.
bool NcclAvailable();

// An FNV-1a-style hash (over 8-byte words) of every StateTensor's name and bytes (via
// CopyToHost): equal on two trainers iff their states are bit-identical (up to hash collisions).
StatusOr<uint64_t> StateHash(Trainable* trainable);

// A trainer's first step is its slowest (buffers allocated, kernels chosen, primitives built on
// first use). WarmUpTrainable runs one forward/backward on `samples` samples and puts the state
// back as it was (gradients zeroed): a joiner runs it before reporting ready, a warm spare before
// waiting (ElasticOptions::warmed_samples). WarmUpSamples: the batch the last rank of `world`
// gets, which is what a joiner (ranked last) trains with.
int64_t WarmUpSamples(int64_t train_size, BatchPolicy policy, int64_t batch, int world);
Status WarmUpTrainable(Trainable* trainable, int64_t samples);

class ElasticTrainer {
 public:
  // Neither pointer is owned; both must outlive the trainer.
  ElasticTrainer(ElasticOptions options, Trainable* trainable, MembershipSource* membership);
  ~ElasticTrainer();
  ElasticTrainer(const ElasticTrainer&) = delete;
  ElasticTrainer& operator=(const ElasticTrainer&) = delete;

  // Trains until the epoch/step budget is reached (OK), this trainer leaves (OK, left = true), or
  // an error: the Trainable failed, no usable generation arrived within generation_wait, or the
  // options are invalid.
  Status Run(ElasticResult* result);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edl::runtime
