// The one training loop of `edl train`: runtime::ElasticTrainer drives the Trainable in every mode
// (elastic under an edl client, static under `edl launch`, standalone world size 1). This file
// adds what a user sees: progress lines every log_every steps on rank 0 (epoch, step, loss,
// accuracy, images/s, lr, generation, world size, ETA), an evaluation line after each epoch
// (evaluation is sharded across ranks) and one summary line.
//
// Thread-safety: runs on the calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/data_plan.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/lr_schedule.h"
#include "edl/runtime/membership.h"
#include "edl/runtime/trainable.h"

namespace edl::resnet50 {

// The runtime's options plus what only the user-facing loop needs. RunTraining derives the rest
// of ElasticOptions (lr.total_epochs from epochs, evaluate_each_epoch from `eval`, eval_batch,
// progress_every, observer) and otherwise passes `elastic` through unchanged.
struct LoopOptions {
  runtime::ElasticOptions elastic;  // batch (> 0), epochs (> 0), lr, timeouts, loader, ...
  int64_t log_every = 50;           // 0 = no progress lines
  bool eval = true;                 // evaluate on the test split after every epoch (sharded)
  std::string label;                // e.g. "resnet20 fashion-mnist", shown in the summary
  int threads = 0;                  // shown in the summary
};

struct LoopResult {
  int64_t steps = 0;                // committed steps at the end (including restored ones)
  double first_loss = 0;            // mean loss of the first step this process took
  double last_window_loss = 0;      // mean training loss over the last log window
  double train_images_per_sec = 0;  // all ranks, while this process trained
  int64_t skipped = 0;  // unreadable samples skipped, all ranks, while this process trained
  double seconds = 0;
  std::vector<double> test_accuracy;  // after each evaluation (fractions)
  double test_loss = 0;               // last evaluation
  bool left = false;                  // removed from the job: stopped after the switch step
  int64_t generation = 0;
  uint64_t state_hash = 0;
};

// Trains `t` through ElasticTrainer over `membership` (not owned). Lines go to `out` on rank 0.
Status RunTraining(runtime::Trainable* t, const LoopOptions& options,
                   runtime::MembershipSource* membership, std::ostream& out, LoopResult* result);

// The overhead baseline of bench/rescale.sh (hidden flag --plain_allreduce): a plain
// data-parallel loop with none of the elastic machinery: one Gloo communicator for the membership's
// first generation (static under `edl launch`), the same DataPlan slices, gradients scaled by the
// rank's share and SUM all-reduced (gradients only, no in-band words), SGD at the linearly scaled
// LR schedule. No re-forms, checkpoints, events, progress reports or evaluation. Rank 0 prints
// "plain: ... train_images/s X", X measured from the end of step 5 (start-up excluded) to the last
// step, and `o.elastic.sample_log_path` gets {"rank","step","time"} lines. CPU (Gloo) only.
Status RunPlainAllReduce(runtime::Trainable* t, const LoopOptions& options,
                         runtime::MembershipSource* membership, std::ostream& out,
                         LoopResult* result);

// World size 1 with an in-memory rendezvous store (no server, no RANK/WORLD_SIZE).
Status RunStandaloneLoop(runtime::Trainable* t, const LoopOptions& options, std::ostream& out,
                         LoopResult* result);

}  // namespace edl::resnet50
