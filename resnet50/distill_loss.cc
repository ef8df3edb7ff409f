#include "resnet50/distill_loss.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace edl::resnet50 {

Status ValidateDistillLossParams(const DistillLossParams& p) {
  if (!(p.temperature > 0) || !std::isfinite(p.temperature)) {
    return Status::InvalidArgument("--distill_temperature must be > 0, got " +
                                   std::to_string(p.temperature));
  }
  if (!(p.alpha >= 0 && p.alpha <= 1)) {
    return Status::InvalidArgument("--distill_alpha must be in [0, 1], got " +
                                   std::to_string(p.alpha));
  }
  if (!(p.label_smoothing >= 0 && p.label_smoothing < 1)) {
    return Status::InvalidArgument("--label_smoothing must be in [0, 1)");
  }
  return Status::OK();
}

namespace {

// out[k] = log softmax(row / t)_k for k < m; -inf entries stay -inf. False when no entry is finite
// or one is NaN / +inf.
bool LogSoftmax(const float* row, int64_t m, double t, double* out) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < m; ++k) {
    const double v = row[k];
    if (std::isnan(v) || v == std::numeric_limits<double>::infinity()) return false;
    if (v / t > mx) mx = v / t;
  }
  if (!std::isfinite(mx)) return false;
  double sum = 0;
  for (int64_t k = 0; k < m; ++k) sum += std::exp(row[k] / t - mx);
  const double lse = mx + std::log(sum);
  for (int64_t k = 0; k < m; ++k) out[k] = row[k] / t - lse;
  return true;
}

}  // namespace

Status DistillLoss(const DistillLossParams& p, const float* logits, const int32_t* labels,
                   const float* teacher, const uint8_t* has_teacher, int64_t n, int64_t m,
                   float grad_scale, float* dlogits, double* loss_sum, int64_t* correct) {
  EDL_RETURN_IF_ERROR(ValidateDistillLossParams(p));
  const double t = p.temperature, a = p.alpha, eps = p.label_smoothing;
  std::vector<double> ls(m), ls_t(m), lt_t(m);
  double loss = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * m;
    float* dz = dlogits + i * m;
    const int32_t label = labels[i];
    if (label < 0 || label >= m) {
      return Status::InvalidArgument("DistillLoss: label " + std::to_string(label) +
                                     " outside [0, " + std::to_string(m) + ")");
    }
    if (!LogSoftmax(z, m, 1.0, ls.data())) {
      return Status::InvalidArgument("DistillLoss: the student's logits of row " +
                                     std::to_string(i) + " are not finite");
    }
    int64_t arg = 0;
    for (int64_t k = 1; k < m; ++k) arg = z[k] > z[arg] ? k : arg;
    hits += arg == label;
    const bool soft = has_teacher[i] != 0;
    // Labels only (a fallback sample) is the same loss with A = 1.
    const double wa = soft ? a : 1.0;
    for (int64_t k = 0; k < m; ++k) {
      const double target = eps / m + (k == label ? 1.0 - eps : 0.0);
      loss -= wa * target * ls[k];
      dz[k] = static_cast<float>(grad_scale * wa * (std::exp(ls[k]) - target));
    }
    if (!soft || a == 1.0) continue;
    if (!LogSoftmax(teacher + i * m, m, t, lt_t.data())) {
      return Status::InvalidArgument("DistillLoss: the teacher's logits of row " +
                                     std::to_string(i) + " hold NaN or +inf, or no finite value");
    }
    LogSoftmax(z, m, t, ls_t.data());
    // d/dz_k of T^2 KL(pt || ps_T) = T (ps_T,k - pt_k).
    const double w = (1.0 - a) * t * t;
    for (int64_t k = 0; k < m; ++k) {
      const double pt = std::exp(lt_t[k]);  // 0 for a -inf entry
      if (pt > 0) loss += w * pt * (lt_t[k] - ls_t[k]);
      dz[k] += static_cast<float>(grad_scale * (1.0 - a) * t * (std::exp(ls_t[k]) - pt));
    }
  }
  *loss_sum = loss;
  *correct = hits;
  return Status::OK();
}

}  // namespace edl::resnet50
