// Learning-rate policy (docs/ARCHITECTURE.md, "Data plan and the exactly-once cursor").
// Schedules are functions of fractional epochs (samples seen / N), so they do not depend on the
// world size. The peak rate follows the linear scaling rule against a base batch:
// lr = base_lr * global_batch / base_batch.
// After a re-form that changes the global batch, an optional ramp moves linearly from the rate in
// use before the change to the new target over `rescale_ramp_steps` steps.
//
// Thread-safety: immutable after construction; safe to share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::runtime {

struct LrScheduleOptions {
  double base_lr = 0.1;      // rate at a global batch of base_batch (after warm-up)
  int64_t base_batch = 256;  // linear scaling reference; <= 0 disables scaling
  double warmup_epochs = 0;  // linear warm-up from warmup_start_factor * peak to peak
  double warmup_start_factor = 0.1;
  std::string decay = "cosine";    // "constant", "step" or "cosine"
  std::vector<double> milestones;  // step decay: epochs at which the rate is multiplied by gamma
  double gamma = 0.1;
  double total_epochs = 1;  // cosine: the rate reaches final_factor * peak at this epoch
  double final_factor = 0.0;
  int64_t rescale_ramp_steps = 0;  // ramp length after a re-form; 0 = jump at once
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {}

  // InvalidArgument naming the bad field (negative epochs, unknown decay, ...).
  Status Validate() const;

  // Target rate at fractional epoch `epoch` for a global batch of `global_batch` samples.
  double At(double epoch, int64_t global_batch) const;

  // Rate to use `steps_since_reform` steps after a re-form, moving from `previous_lr` (the rate in
  // use just before it) to `target`. Returns `target` once the ramp is over or when disabled.
  double Ramp(double target, double previous_lr, int64_t steps_since_reform) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  const LrScheduleOptions options_;
};

}  // namespace edl::runtime
