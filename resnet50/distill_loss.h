// Knowledge-distillation loss of a student's logits against a teacher's (docs/DISTILLATION.md):
//
//   loss_i = A * CE(label_i, softmax(z_i)) + (1 - A) * T^2 * KL(softmax(t_i / T) || softmax(z_i /
//   T))
//
// for a sample i with a teacher answer t_i, and the plain CE (labels only) for a sample without
// one (a fallback: no teacher answered in time). The T^2 factor keeps the soft term's gradient
// magnitude independent of T (Hinton et al., 2015). CE may use label smoothing eps as
// Backend::SoftmaxCrossEntropy does.
//
// Computed on host memory: the logits are [N, M] with M the class count (small next to the
// network), so one device-to-host copy of the logits and one host-to-device copy of dlogits per
// step serve every backend alike.
//
// Numerics: accumulation in double; log-softmax through the row maximum. A teacher row may hold
// -infinity for classes it did not send (a top-k answer): their teacher probability is 0 and they
// add nothing to the KL term (0 log 0 = 0).
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>

#include "edl/base/status.h"

namespace edl::resnet50 {

struct DistillLossParams {
  float temperature = 4.0f;      // T > 0
  float alpha = 0.5f;            // A in [0, 1]: weight of the label term
  float label_smoothing = 0.0f;  // eps of the label term
};

// Checks T > 0 and A in [0, 1]; InvalidArgument naming the flag otherwise.
Status ValidateDistillLossParams(const DistillLossParams& p);

// logits [n, m] (the student's), labels [n] in [0, m), teacher [n, m] (row i read only when
// has_teacher[i] != 0; finite or -inf values, at least one finite per row). Writes
// dlogits [n, m] = grad_scale * d loss_i / d z_i, *loss_sum = sum_i loss_i and *correct = number of
// i whose student argmax equals the label. InvalidArgument for a label out of range or a teacher
// row that is all -inf / holds NaN or +inf.
Status DistillLoss(const DistillLossParams& p, const float* logits, const int32_t* labels,
                   const float* teacher, const uint8_t* has_teacher, int64_t n, int64_t m,
                   float grad_scale, float* dlogits, double* loss_sum, int64_t* correct);

}  // namespace edl::resnet50
