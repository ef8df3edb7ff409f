#include "edl/runtime/data_plan.h"

#include <algorithm>
#include <numeric>

#include <glog/logging.h>

namespace edl::runtime {
namespace {

// SplitMix64: a small, portable generator (the same stream on every platform and compiler, which
// std::uniform_int_distribution does not promise).
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

Status ParseBatchPolicy(const std::string& text, BatchPolicy* out) {
  if (!kBatchPolicyNames.Parse(text, out)) {
    return Status::InvalidArgument("--batch_policy '" + text + "': expected " +
                                   kBatchPolicyNames.List(""));
  }
  return Status::OK();
}

std::vector<int64_t> BatchSizes(BatchPolicy policy, int64_t batch, int world) {
  CHECK_GT(batch, 0);
  CHECK_GT(world, 0);
  if (policy == BatchPolicy::kFixedLocal) return std::vector<int64_t>(world, batch);
  std::vector<int64_t> sizes(world, batch / world);
  for (int64_t r = 0; r < batch % world; ++r) ++sizes[r];
  return sizes;
}

DataPlan::DataPlan(int64_t num_samples, uint64_t seed) : num_samples_(num_samples), seed_(seed) {
  CHECK_GT(num_samples, 0);
}

const std::vector<int64_t>& DataPlan::Permutation(int64_t epoch) {
  if (epoch == cached_epoch_) return cached_perm_;
  cached_perm_.resize(num_samples_);
  std::iota(cached_perm_.begin(), cached_perm_.end(), 0);
  uint64_t state = seed_ * 0x100000001B3ULL ^ static_cast<uint64_t>(epoch) * 0xD6E8FEB86659FD93ULL;
  for (int64_t i = num_samples_ - 1; i > 0; --i) {  // Fisher-Yates
    const int64_t j = static_cast<int64_t>(SplitMix64(&state) % static_cast<uint64_t>(i + 1));
    std::swap(cached_perm_[i], cached_perm_[j]);
  }
  cached_epoch_ = epoch;
  return cached_perm_;
}

int64_t DataPlan::StepSamples(const DataPosition& pos, const std::vector<int64_t>& b) const {
  const int64_t global = std::accumulate(b.begin(), b.end(), int64_t{0});
  return std::min(global, num_samples_ - pos.cursor);
}

std::vector<int64_t> DataPlan::Shares(const std::vector<int64_t>& b, int64_t take) {
  const int64_t global = std::accumulate(b.begin(), b.end(), int64_t{0});
  if (take >= global) return b;
  // Proportional split of a short last step; the largest remainders get the leftover samples.
  std::vector<int64_t> shares(b.size());
  std::vector<std::pair<int64_t, size_t>> remainders;
  int64_t given = 0;
  for (size_t r = 0; r < b.size(); ++r) {
    shares[r] = take * b[r] / global;
    given += shares[r];
    remainders.push_back({-(take * b[r] % global), r});
  }
  std::sort(remainders.begin(), remainders.end());
  for (size_t i = 0; given < take; ++i, ++given) ++shares[remainders[i].second];
  return shares;
}

std::vector<std::vector<int64_t>> DataPlan::Step(const DataPosition& pos,
                                                 const std::vector<int64_t>& b) {
  const std::vector<int64_t>& perm = Permutation(pos.epoch);
  const std::vector<int64_t> shares = Shares(b, StepSamples(pos, b));
  std::vector<std::vector<int64_t>> out(b.size());
  int64_t at = pos.cursor;
  for (size_t r = 0; r < b.size(); ++r) {
    out[r].assign(perm.begin() + at, perm.begin() + at + shares[r]);
    at += shares[r];
  }
  return out;
}

std::vector<int64_t> DataPlan::Slice(const DataPosition& pos, const std::vector<int64_t>& b,
                                     int rank) {
  CHECK_GE(rank, 0);
  CHECK_LT(static_cast<size_t>(rank), b.size());
  const std::vector<int64_t>& perm = Permutation(pos.epoch);
  const std::vector<int64_t> shares = Shares(b, StepSamples(pos, b));
  const int64_t begin =
      pos.cursor + std::accumulate(shares.begin(), shares.begin() + rank, int64_t{0});
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + shares[rank]);
}

DataPosition DataPlan::Advance(const DataPosition& pos, const std::vector<int64_t>& b) const {
  DataPosition next = pos;
  next.cursor += StepSamples(pos, b);
  if (next.cursor >= num_samples_) {
    next.cursor = 0;
    ++next.epoch;
  }
  return next;
}

double DataPlan::EpochProgress(const DataPosition& pos) const {
  return static_cast<double>(pos.epoch) +
         static_cast<double>(pos.cursor) / static_cast<double>(num_samples_);
}

void EvenShard(int64_t n, int rank, int world, int64_t* begin, int64_t* end) {
  const int64_t base = n / world, extra = n % world;
  *begin = rank * base + std::min<int64_t>(rank, extra);
  *end = *begin + base + (rank < extra ? 1 : 0);
}

}  // namespace edl::runtime
