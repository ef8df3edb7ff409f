#include "edl/runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace edl::runtime {

Status LrSchedule::Validate() const {
  const LrScheduleOptions& o = options_;
  if (!(o.base_lr > 0)) return Status::InvalidArgument("--lr must be > 0");
  if (o.warmup_epochs < 0) return Status::InvalidArgument("--warmup_epochs must be >= 0");
  if (o.decay != "constant" && o.decay != "step" && o.decay != "cosine") {
    return Status::InvalidArgument("--lr_decay '" + o.decay +
                                   "': expected constant, step or cosine");
  }
  if (o.decay == "cosine" && !(o.total_epochs > 0)) {
    return Status::InvalidArgument("--epochs must be > 0 for cosine decay");
  }
  if (o.rescale_ramp_steps < 0) {
    return Status::InvalidArgument("--rescale_ramp_steps must be >= 0");
  }
  return Status::OK();
}

double LrSchedule::At(double epoch, int64_t global_batch) const {
  const LrScheduleOptions& o = options_;
  double peak = o.base_lr;
  if (o.base_batch > 0) peak *= static_cast<double>(global_batch) / o.base_batch;
  if (epoch < o.warmup_epochs) {
    const double t = epoch / o.warmup_epochs;
    return peak * (o.warmup_start_factor + (1.0 - o.warmup_start_factor) * t);
  }
  if (o.decay == "step") {
    double lr = peak;
    for (double m : o.milestones) {
      if (epoch >= m) lr *= o.gamma;
    }
    return lr;
  }
  if (o.decay == "cosine") {
    const double span = std::max(o.total_epochs - o.warmup_epochs, 1e-9);
    const double t = std::clamp((epoch - o.warmup_epochs) / span, 0.0, 1.0);
    const double factor =
        o.final_factor + (1.0 - o.final_factor) * 0.5 * (1.0 + std::cos(M_PI * t));
    return peak * factor;
  }
  return peak;
}

double LrSchedule::Ramp(double target, double previous_lr, int64_t steps_since_reform) const {
  const int64_t k = options_.rescale_ramp_steps;
  if (k <= 0 || steps_since_reform >= k || previous_lr <= 0) return target;
  const double t = static_cast<double>(steps_since_reform + 1) / static_cast<double>(k);
  return previous_lr + (target - previous_lr) * t;
}

}  // namespace edl::runtime
