// TeacherSource: where a distilling student gets a teacher's logits for its training batches
// (docs/DISTILLATION.md). Two implementations: TeacherClient (teacher_client.h), which asks
// `edl teacher` services over the network, and the in-process teacher of `edl train
// --distill_local` (resnet50/local_teacher.h), the baseline that runs the teacher's forward in
// the student's own process.
//
// A batch is named by its sample indices (in batch order) and the augmentation seed its loader
// uses; the teacher reads the same dataset and fills the same augmented images, so no pixels
// travel.
//
// Thread-safety: Request and Get are called from the training thread; implementations are
// internally synchronised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::runtime {

// Counters of a source, cumulative since it was created.
struct TeacherCounters {
  int64_t answered = 0;   // samples whose teacher logits arrived in time
  int64_t fallback = 0;   // samples trained on labels only (no answer within the bound)
  int64_t resent = 0;     // requests sent again to another teacher (one died, was removed or slow)
  int64_t requests = 0;   // requests sent
  int64_t cancelled = 0;  // requests given up on (re-sent elsewhere, or the step went on): the
                          // teacher was told (teacher_cancel) so it drops them if not started
};

class TeacherSource {
 public:
  virtual ~TeacherSource() = default;
  // Starts fetching the logits of a batch the training loop will need soon (a window ahead).
  // Idempotent; returns at once.
  virtual void Request(const std::vector<int64_t>& indices, uint64_t aug_seed) = 0;
  // The batch's teacher logits: logits [n, classes] row-major and has[n] (1: row i holds the
  // teacher's logits, possibly -inf for classes a top-k answer left out; 0: no answer in time,
  // train sample i on labels only). Waits at most the source's bound. A non-OK status is a fatal
  // misconfiguration (e.g. no teacher of the service ever appeared), never a slow teacher.
  virtual Status Get(const std::vector<int64_t>& indices, uint64_t aug_seed, int classes,
                     float* logits, uint8_t* has) = 0;
  virtual TeacherCounters counters() const = 0;
  // One line for logs: "answered=.. fallback=.. resent=.. requests=.. cancelled=..".
  std::string CountersLine() const {
    const TeacherCounters c = counters();
    return "answered=" + std::to_string(c.answered) + " fallback=" + std::to_string(c.fallback) +
           " resent=" + std::to_string(c.resent) + " requests=" + std::to_string(c.requests) +
           " cancelled=" + std::to_string(c.cancelled);
  }
};

}  // namespace edl::runtime
