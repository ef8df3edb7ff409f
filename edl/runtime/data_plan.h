// DataPlan: which training samples each rank takes at each step, so that every sample is seen
// exactly once per epoch whatever sequence of world sizes the job goes through
// (docs/ARCHITECTURE.md, "Data plan and the exactly-once cursor").
//
// Epoch e visits a permutation of the N samples seeded by (seed, e). The synced training state
// holds a Position (epoch, global cursor into that permutation). At each step rank r takes the next
// b_r indices after the ranks before it; the cursor then advances by the global batch sum(b). A
// step never crosses an epoch boundary: when fewer than sum(b) samples remain, they are split
// across the ranks in proportion to b (some ranks may then get none), and the next step starts
// epoch e+1.
//
// Thread-safety: const methods are safe to call concurrently; Permutation() caches one epoch and is
// not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/batch_policy.h"
#include "edl/base/status.h"

namespace edl::runtime {

struct DataPosition {
  int64_t epoch = 0;   // current epoch (0-based)
  int64_t cursor = 0;  // samples of this epoch's permutation already consumed, 0 <= cursor < N
  bool operator==(const DataPosition& o) const { return epoch == o.epoch && cursor == o.cursor; }
};

using ::edl::BatchPolicy;  // edl/base/batch_policy.h

// Parses "fixed-local" / "fixed-global"; InvalidArgument naming the value otherwise.
Status ParseBatchPolicy(const std::string& text, BatchPolicy* out);

// Per-rank batch sizes for `world` ranks. REQUIRES: batch > 0, world > 0. Under kFixedGlobal with
// batch < world some ranks get 0.
std::vector<int64_t> BatchSizes(BatchPolicy policy, int64_t batch, int world);

class DataPlan {
 public:
  // REQUIRES: num_samples > 0.
  DataPlan(int64_t num_samples, uint64_t seed);

  int64_t num_samples() const { return num_samples_; }

  // The sample order of `epoch`: a permutation of [0, N) that depends only on (seed, epoch).
  const std::vector<int64_t>& Permutation(int64_t epoch);

  // Samples each rank takes at `pos` for the given per-rank batch sizes (sum may exceed what
  // remains in the epoch; see the class comment). Result[r] is rank r's list.
  std::vector<std::vector<int64_t>> Step(const DataPosition& pos,
                                         const std::vector<int64_t>& batch_sizes);
  // The indices of rank `rank` only (same as Step(...)[rank]).
  std::vector<int64_t> Slice(const DataPosition& pos, const std::vector<int64_t>& batch_sizes,
                             int rank);
  // The position after a step at `pos` with these batch sizes.
  DataPosition Advance(const DataPosition& pos, const std::vector<int64_t>& batch_sizes) const;
  // Samples consumed at `pos` with these batch sizes (min(sum(b), N - cursor)).
  int64_t StepSamples(const DataPosition& pos, const std::vector<int64_t>& batch_sizes) const;

  // Fractional epochs elapsed at `pos` (epoch + cursor / N): the clock of every schedule.
  double EpochProgress(const DataPosition& pos) const;

 private:
  // Per-rank counts for a step that takes `take` samples with batch sizes `b`.
  static std::vector<int64_t> Shares(const std::vector<int64_t>& b, int64_t take);

  const int64_t num_samples_;
  const uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_perm_;
};

// Contiguous shard [begin, end) of `n` items for rank `rank` of `world` (evaluation sharding).
void EvenShard(int64_t n, int rank, int world, int64_t* begin, int64_t* end);

}  // namespace edl::runtime
