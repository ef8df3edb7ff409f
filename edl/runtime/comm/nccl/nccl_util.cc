#include "edl/runtime/comm/nccl/nccl_util.h"

#include <glog/logging.h>

#include <cstring>
#include <thread>

namespace edl::runtime::nccl {
namespace {

std::string Where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

const char* NcclHint(ncclResult_t r) {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check the GPU with nvidia-smi and "
             "CUDA_VISIBLE_DEVICES";
    case ncclSystemError:
      return "a system or network call failed: check that the peers are reachable, "
             "NCCL_SOCKET_IFNAME, "
             "and run with NCCL_DEBUG=INFO";
    case ncclRemoteError:
      return "a peer failed or disconnected; the job must re-form without it";
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return "invalid use of NCCL (a bug in edl, or two ranks on one GPU); run with "
             "NCCL_DEBUG=WARN";
    default:
      return "run with NCCL_DEBUG=INFO for details";
  }
}

// Sleeps a little longer the longer a wait lasts: spin-yield for the first 200 us (a collective
// of a small model finishes in tens of us), then 50 us, then 1 ms naps.
void Backoff(Clock::time_point start) {
  const auto waited = Clock::now() - start;
  if (waited < std::chrono::microseconds(200)) {
    std::this_thread::yield();
  } else if (waited < std::chrono::milliseconds(20)) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line) {
  std::string msg =
      std::string(expr) + " failed at " + Where(file, line) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') msg += " (" + std::string(last) + ")";
  msg += "; ";
  msg += NcclHint(r);
  if (r == ncclRemoteError || r == ncclSystemError) return Status::Unavailable(msg);
  return Status::Internal(msg);
}

Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line) {
  return Status::Internal(std::string(expr) + " failed at " + Where(file, line) + ": " +
                          cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                          "); check the GPU with nvidia-smi and CUDA_VISIBLE_DEVICES");
}

ncclDataType_t ToNccl(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kUInt8:
      return ncclUint8;
  }
  LOG(FATAL) << "unknown DataType " << static_cast<int>(t);
  return ncclFloat32;
}

std::string ToHex(const void* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

bool FromHex(const std::string& hex, void* data, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

Status PollUntil(const WaitScope& scope, const std::function<StatusOr<bool>()>& done) {
  const auto start = Clock::now();
  auto next_interrupt = start;  // asked on the first round too: a superseded wait ends at once
  for (;;) {
    StatusOr<bool> finished = done();
    if (!finished.ok()) return finished.status();
    if (finished.value()) return Status::OK();
    if (scope.comm != nullptr) {
      ncclResult_t state = ncclSuccess;
      EDL_NCCL_CHECK(ncclCommGetAsyncError(scope.comm, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclStatus(state, scope.what, __FILE__, __LINE__);
      }
    }
    if (scope.aborted != nullptr && scope.aborted->load()) {
      return Status::Aborted(scope.name + ": " + scope.what + " aborted");
    }
    const auto now = Clock::now();
    if (scope.interrupt != nullptr && *scope.interrupt && now >= next_interrupt) {
      next_interrupt = now + kInterruptEvery;
      Status s = (*scope.interrupt)(scope.phase);
      if (!s.ok()) return s.WithContext(scope.name + ": " + scope.what + " interrupted");
    }
    if (now > scope.deadline) {
      return Status::Timeout(scope.name + ": " + scope.what + " did not complete within " +
                             std::to_string(scope.timeout.count()) + " ms; " +
                             (scope.phase == CommPhase::kConstruct
                                  ? "not every rank joined (a peer died or was never started)"
                                  : "a peer is dead or hung (raise --comm_timeout_s if the step "
                                    "itself is that slow)"));
    }
    Backoff(start);
  }
}

PinnedPool& PinnedPool::Get() {
  static PinnedPool* pool = new PinnedPool();  // never destroyed: blocks outlive static teardown
  return *pool;
}

StatusOr<void*> PinnedPool::Take() {
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      cudaEvent_t ev = free_[i].second;
      // cudaErrorNotReady: a copy into the block may still be queued. Any other error means the
      // event (or the context) is gone, and no copy of that context will run any more.
      if (ev != nullptr && cudaEventQuery(ev) == cudaErrorNotReady) continue;
      if (ev != nullptr) cudaEventDestroy(ev);
      cudaGetLastError();  // a failed query must not surface in an unrelated call
      void* block = free_[i].first;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return block;
    }
  }
  void* block = nullptr;
  EDL_CUDA_CHECK(cudaHostAlloc(&block, kHostArgBytes, cudaHostAllocPortable));
  return block;
}

void PinnedPool::Give(void* block, cudaEvent_t last_use) {
  if (block == nullptr) return;
  MutexLock lock(&mu_);
  free_.emplace_back(block, last_use);
}

Reaper& Reaper::Get() {
  static Reaper* reaper = new Reaper();  // never destroyed: its thread may outlive main()
  return *reaper;
}

void Reaper::Abort(ncclComm_t comm, int device) {
  if (comm == nullptr) return;
  MutexLock lock(&mu_);
  queue_.emplace_back(comm, device);
  if (!started_) {
    started_ = true;
    std::thread([this] { Loop(); }).detach();
  }
  cv_.notify_one();
}

void Reaper::Loop() {
  for (;;) {
    std::pair<ncclComm_t, int> job;
    {
      MutexLock lock(&mu_);
      cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return !queue_.empty(); });
      job = queue_.front();
      queue_.pop_front();
    }
    cudaSetDevice(job.second);
    const ncclResult_t r = ncclCommAbort(job.first);
    if (r != ncclSuccess && r != ncclInProgress) {
      LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(r);
    }
    cudaGetLastError();
  }
}

}  // namespace edl::runtime::nccl
