// The standalone training loop (world size 1): sample order from runtime::DataPlan, learning rate
// from runtime::LrSchedule, progress lines every log_every steps, test-split evaluation after every
// epoch and one summary line. It drives the model only through runtime::Trainable, so the elastic
// runtime can replace it without touching the Trainer.
//
// Thread-safety: runs on the calling thread.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/lr_schedule.h"
#include "edl/runtime/trainable.h"

namespace edl::resnet50 {

struct LoopOptions {
  int64_t batch_size = 128;  // per trainer (> 0)
  int64_t epochs = 1;
  int64_t max_steps = 0;     // 0 = no limit
  int64_t log_every = 50;    // 0 = no progress lines
  bool eval = true;          // evaluate on the test split after every epoch
  uint64_t seed = 1;         // data order
  runtime::LrScheduleOptions lr;  // total_epochs is set from `epochs`
  std::string label;         // e.g. "resnet20 fashion-mnist", shown in the summary
  int threads = 0;           // shown in the summary
};

struct LoopResult {
  int64_t steps = 0;
  double first_loss = 0;        // mean loss of the first step
  double last_window_loss = 0;  // mean training loss over the last log window
  double train_images_per_sec = 0;
  double seconds = 0;
  std::vector<double> test_accuracy;  // after each epoch (fractions)
  double test_loss = 0;               // last evaluation
};

// Evaluates the whole test split in batches of batch_size; *accuracy in [0, 1].
Status EvaluateAll(runtime::Trainable* t, int64_t batch_size, double* loss, double* accuracy);

Status RunStandaloneLoop(runtime::Trainable* t, const LoopOptions& options, std::ostream& out,
                         LoopResult* result);

}  // namespace edl::resnet50
