// NCCL implementation of Communicator (GPU data plane), built only with EDL_HAVE_NCCL, into the
// CUDA plugin libedl_cuda.so (edl/runtime/cuda_plugin.h); libedl reaches it through
// CreateNcclCommunicator (comm/nccl_plugin.cc), which loads the plugin.
//
// Rendezvous: rank 0 creates the ncclUniqueId and publishes it (hex) under
// "<key_prefix>/nccl_unique_id" in options.store; the other ranks Wait() for it with
// options.timeout. The communicator is non-blocking (ncclConfig_t.blocking = 0): every NCCL call
// returns at once (possibly ncclInProgress) and we poll ncclCommGetAsyncError, so that init and
// every collective are bounded by options.timeout and an Abort() is noticed while we wait.
//
// Collectives are enqueued on options.cuda_stream (the trainer's compute stream, so they order
// after the backward that produced the gradients) and each call waits until its work has finished
// on that stream: the interface promises the result on return, and a dead peer must surface here
// as an error, not later in an unrelated cudaStreamSynchronize. Host pointers (the runtime
// reduces a few int64/double scalars from the stack) are staged through a device scratch buffer.
//
// Abort (from any thread): sets aborted_. The thread that owns the handle at that moment calls
// ncclCommAbort: the collective thread, which checks the flag every poll (~50 us to 1 ms), or
// Abort() itself when no collective is in flight. So ncclCommAbort never runs concurrently with
// another NCCL call on the same handle (NCCL forbids that), yet a collective stuck on a dead peer
// returns Aborted within one poll interval. ncclCommAbort also stops the NCCL kernels stuck on the
// GPU, which makes the stream drain.
//
// Failure is sticky: the first error is kept in failed_ and returned by every later call; the
// owner destroys the communicator and builds the next generation's.
#include "edl/runtime/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <glog/logging.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Error helpers: every CUDA/NCCL call goes through these (file:line and a hint in the message).

std::string Where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

const char* NcclHint(ncclResult_t r) {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check the GPU with nvidia-smi and CUDA_VISIBLE_DEVICES";
    case ncclSystemError:
      return "a system or network call failed: check that the peers are reachable, NCCL_SOCKET_IFNAME, "
             "and run with NCCL_DEBUG=INFO";
    case ncclRemoteError:
      return "a peer failed or disconnected; the job must re-form without it";
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return "invalid use of NCCL (a bug in edl, or two ranks on one GPU); run with NCCL_DEBUG=WARN";
    default:
      return "run with NCCL_DEBUG=INFO for details";
  }
}

Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line) {
  std::string msg = std::string(expr) + " failed at " + Where(file, line) + ": " +
                    ncclGetErrorString(r);
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

#define EDL_NCCL_CHECK(expr)                                                          \
  do {                                                                                \
    const ncclResult_t _r = (expr);                                                   \
    if (_r != ncclSuccess && _r != ncclInProgress) {                                  \
      return NcclStatus(_r, #expr, __FILE__, __LINE__);                               \
    }                                                                                 \
  } while (0)
#define EDL_CUDA_CHECK(expr)                                                          \
  do {                                                                                \
    const cudaError_t _e = (expr);                                                    \
    if (_e != cudaSuccess) return CudaStatus(_e, #expr, __FILE__, __LINE__);          \
  } while (0)

ncclDataType_t ToNccl(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt64: return ncclInt64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kUInt8: return ncclUint8;
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

// ---------------------------------------------------------------------------------------------

class NcclCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (initialised, non-blocking) and of `own_stream` when not null.
  NcclCommunicator(const CommOptions& options, ncclComm_t comm, cudaStream_t stream,
                   bool own_stream)
      : rank_(options.rank),
        world_(options.world_size),
        generation_(options.generation),
        device_(options.cuda_device),
        timeout_(options.timeout),
        stream_(stream),
        own_stream_(own_stream),
        comm_(comm) {}
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(); }

  // For ShrinkNcclCommunicator: the live handle, or nullptr when aborted. REQUIRES: no collective
  // in flight (the caller's thread is the collective thread).
  ncclComm_t handle() const { return comm_; }

 private:
  std::string Name() const {
    return "NCCL communicator (generation " + std::to_string(generation_) + ", rank " +
           std::to_string(rank_) + "/" + std::to_string(world_) + ")";
  }
  // Runs `enqueue` (which issues NCCL calls on comm_ and stream_) and waits for its completion.
  template <typename F>
  Status Run(const char* what, void* data, size_t bytes, bool copy_in, F&& enqueue);
  // Polls until the pending NCCL call has been enqueued (state leaves ncclInProgress).
  Status WaitEnqueued(const char* what, Clock::time_point deadline);
  // Polls until stream_ has drained, watching the async error and the abort flag.
  Status WaitStream(const char* what, Clock::time_point deadline);
  // Aborts comm_ from the collective thread and records `why`. Returns failed_.
  Status FailAndAbort(Status why);
  // Returns a device pointer for `data` (itself, or the staging buffer for host memory).
  Status Resolve(void* data, size_t bytes, void** device_ptr, bool* staged);

  const int rank_;
  const int world_;
  const int64_t generation_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const cudaStream_t stream_;  // the trainer's stream (not owned) unless own_stream_
  const bool own_stream_;

  std::atomic<bool> aborted_{false};
  Mutex mu_;                     // guards comm_ against Abort() and in_flight_
  ncclComm_t comm_;              // written under mu_; nullptr once aborted/destroyed. The
                                 // collective thread reads it unlocked while in_flight_.
  bool in_flight_ GUARDED_BY(mu_) = false;  // a collective thread owns comm_ right now
  Status failed_;                // first error; touched only by the collective thread
  void* staging_ = nullptr;      // device scratch for host pointers
  size_t staging_bytes_ = 0;
};

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  MutexLock lock(&mu_);
  if (comm_ != nullptr) {
    // A healthy communicator is finalised (flushes its work) and destroyed; one that failed, or
    // whose finalize does not complete in time (a dead peer), is aborted.
    bool clean = failed_.ok() && !aborted_.load();
    if (clean && ncclCommFinalize(comm_) != ncclSuccess) {
      const auto deadline = Clock::now() + timeout_;
      const auto start = Clock::now();
      ncclResult_t state = ncclInProgress;
      while (Clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
        Backoff(start);
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (staging_ != nullptr) cudaFree(staging_);
  if (own_stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::Abort() {
  aborted_.store(true);
  MutexLock lock(&mu_);
  if (!in_flight_ && comm_ != nullptr) {
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  // else: the collective thread sees aborted_ at its next poll and aborts comm_ itself.
}

Status NcclCommunicator::FailAndAbort(Status why) {
  if (failed_.ok()) failed_ = std::move(why);
  MutexLock lock(&mu_);
  in_flight_ = false;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return failed_;
}

Status NcclCommunicator::WaitEnqueued(const char* what, Clock::time_point deadline) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    EDL_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return Status::OK();
    if (state != ncclInProgress) return NcclStatus(state, what, __FILE__, __LINE__);
    if (aborted_.load()) return Status::Aborted(Name() + ": " + what + " aborted");
    if (Clock::now() > deadline) {
      return Status::Timeout(Name() + ": " + what + " not enqueued within " +
                             std::to_string(timeout_.count()) + " ms; a peer is likely gone");
    }
    Backoff(start);
  }
}

Status NcclCommunicator::WaitStream(const char* what, Clock::time_point deadline) {
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return Status::OK();
    if (e != cudaErrorNotReady) return CudaStatus(e, "cudaStreamQuery", __FILE__, __LINE__);
    ncclResult_t state = ncclSuccess;
    EDL_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclStatus(state, what, __FILE__, __LINE__);
    }
    if (aborted_.load()) return Status::Aborted(Name() + ": " + what + " aborted");
    if (Clock::now() > deadline) {
      return Status::Timeout(Name() + ": " + what + " did not complete within " +
                             std::to_string(timeout_.count()) +
                             " ms; a peer is dead or hung (raise the communicator timeout if the "
                             "step itself is that slow)");
    }
    Backoff(start);
  }
}

Status NcclCommunicator::Resolve(void* data, size_t bytes, void** device_ptr, bool* staged) {
  cudaPointerAttributes attr;
  EDL_CUDA_CHECK(cudaPointerGetAttributes(&attr, data));
  *staged = attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged;
  if (!*staged) {
    *device_ptr = data;
    return Status::OK();
  }
  if (staging_bytes_ < bytes) {
    if (staging_ != nullptr) EDL_CUDA_CHECK(cudaFreeAsync(staging_, stream_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    EDL_CUDA_CHECK(cudaMallocAsync(&staging_, std::max<size_t>(bytes, 256), stream_));
    staging_bytes_ = std::max<size_t>(bytes, 256);
  }
  *device_ptr = staging_;
  return Status::OK();
}

template <typename F>
Status NcclCommunicator::Run(const char* what, void* data, size_t bytes, bool copy_in,
                             F&& enqueue) {
  if (!failed_.ok()) return failed_;
  {
    MutexLock lock(&mu_);
    if (aborted_.load() || comm_ == nullptr) {
      failed_ = Status::Aborted(Name() + " was aborted; build a new one");
      return failed_;
    }
    in_flight_ = true;
  }
  const auto deadline = Clock::now() + timeout_;
  Status s = [&]() -> Status {
    EDL_CUDA_CHECK(cudaSetDevice(device_));
    void* dev = data;
    bool staged = false;
    if (bytes > 0) EDL_RETURN_IF_ERROR(Resolve(data, bytes, &dev, &staged));
    if (staged && copy_in) {
      EDL_CUDA_CHECK(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream_));
    }
    EDL_RETURN_IF_ERROR(enqueue(dev));
    EDL_RETURN_IF_ERROR(WaitEnqueued(what, deadline));
    if (staged) {
      EDL_CUDA_CHECK(cudaMemcpyAsync(data, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    return WaitStream(what, deadline);
  }();
  if (!s.ok()) return FailAndAbort(s);
  MutexLock lock(&mu_);
  in_flight_ = false;
  if (aborted_.load() && comm_ != nullptr) {  // Abort() arrived just as we finished
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return Status::OK();
}

Status NcclCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op) {
  const ncclRedOp_t nop = op == ReduceOp::kSum ? ncclSum : ncclMax;
  return Run("ncclAllReduce", data, count * DataTypeSize(type), true, [&](void* dev) -> Status {
    EDL_NCCL_CHECK(ncclAllReduce(dev, dev, count, ToNccl(type), nop, comm_, stream_));
    return Status::OK();
  });
}

Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_) {
    return Status::InvalidArgument(Name() + ": broadcast root " + std::to_string(root) +
                                   " outside [0, " + std::to_string(world_) + ")");
  }
  // Only the root's bytes matter; staging copies them in on every rank (harmless).
  return Run("ncclBroadcast", data, bytes, true, [&](void* dev) -> Status {
    EDL_NCCL_CHECK(ncclBroadcast(dev, dev, bytes, ncclUint8, root, comm_, stream_));
    return Status::OK();
  });
}

Status NcclCommunicator::Barrier() {
  float one = 1.f;  // a one-float all-reduce through the staging buffer
  return AllReduce(&one, 1, DataType::kFloat32, ReduceOp::kSum);
}

// ---------------------------------------------------------------------------------------------
// Creation.

Status ValidateOptions(const CommOptions& o, bool need_store) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("NCCL communicator: rank " + std::to_string(o.rank) +
                                   " / world size " + std::to_string(o.world_size) +
                                   " is not a valid placement");
  }
  if (need_store && (o.store == nullptr || o.key_prefix.empty())) {
    return Status::InvalidArgument(
        "NCCL communicator: options.store and options.key_prefix are required for the unique-id "
        "rendezvous");
  }
  if (o.timeout.count() <= 0) {
    return Status::InvalidArgument("NCCL communicator: timeout must be > 0 ms");
  }
  return Status::OK();
}

// Resolves the device (cuda_device -1 = current) and the stream (nullptr = a new owned one).
Status PrepareDevice(CommOptions* o, cudaStream_t* stream, bool* own) {
  int count = 0;
  EDL_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (o->cuda_device < 0) EDL_CUDA_CHECK(cudaGetDevice(&o->cuda_device));
  if (o->cuda_device >= count) {
    return Status::InvalidArgument("NCCL communicator: CUDA device " +
                                   std::to_string(o->cuda_device) + " does not exist (" +
                                   std::to_string(count) + " visible; check CUDA_VISIBLE_DEVICES)");
  }
  EDL_CUDA_CHECK(cudaSetDevice(o->cuda_device));
  *own = o->cuda_stream == nullptr;
  if (*own) {
    EDL_CUDA_CHECK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  } else {
    *stream = static_cast<cudaStream_t>(o->cuda_stream);
  }
  return Status::OK();
}

// Publishes (rank 0) or fetches the unique id under the communicator's key.
Status ExchangeUniqueId(const CommOptions& o, ncclUniqueId* id) {
  const std::string key = o.key_prefix + "/nccl_unique_id";
  if (o.rank == 0) {
    EDL_NCCL_CHECK(ncclGetUniqueId(id));
    return o.store->Set(key, ToHex(id, sizeof(*id)));
  }
  std::string hex;
  EDL_RETURN_IF_ERROR(o.store->Wait(key, o.timeout, &hex));
  if (!FromHex(hex, id, sizeof(*id))) {
    return Status::Corruption("rendezvous key '" + key + "' does not hold a NCCL unique id (" +
                              std::to_string(hex.size()) + " chars); is another job using the "
                              "same key prefix?");
  }
  return Status::OK();
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Waits for a non-blocking init/shrink of `comm` to finish; aborts it on error or timeout.
Status WaitInit(ncclComm_t comm, const CommOptions& o, const char* what) {
  const auto start = Clock::now();
  const auto deadline = start + o.timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return Status::OK();
    if (state != ncclInProgress) {
      Status s = NcclStatus(state, what, __FILE__, __LINE__);
      ncclCommAbort(comm);
      return s;
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      return Status::Timeout(std::string(what) + " for generation " +
                             std::to_string(o.generation) + " rank " + std::to_string(o.rank) +
                             "/" + std::to_string(o.world_size) + " did not complete within " +
                             std::to_string(o.timeout.count()) +
                             " ms; not every rank joined (a peer died or was never started)");
    }
    Backoff(start);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options) {
  EDL_RETURN_IF_ERROR(ValidateOptions(options, /*need_store=*/true));
  CommOptions o = options;
  cudaStream_t stream = nullptr;
  bool own = false;
  EDL_RETURN_IF_ERROR(PrepareDevice(&o, &stream, &own));
  auto drop_stream = [&] {
    if (own) cudaStreamDestroy(stream);
  };
  ncclUniqueId id;
  Status s = ExchangeUniqueId(o, &id);
  if (!s.ok()) {
    drop_stream();
    return s.WithContext("NCCL rendezvous under '" + o.key_prefix + "'");
  }
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, o.world_size, id, o.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    s = NcclStatus(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
    if (comm != nullptr) ncclCommAbort(comm);
    drop_stream();
    return s;
  }
  s = WaitInit(comm, o, "ncclCommInitRankConfig");
  if (!s.ok()) {
    drop_stream();
    return s;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(o, comm, stream, own));
}

StatusOr<std::unique_ptr<Communicator>> ShrinkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, const CommOptions& options) {
  EDL_RETURN_IF_ERROR(ValidateOptions(options, /*need_store=*/false));
  auto* p = dynamic_cast<NcclCommunicator*>(parent);
  if (p == nullptr) {
    return Status::InvalidArgument("ShrinkNcclCommunicator: the parent is not a NCCL communicator");
  }
  if (p->handle() == nullptr) {
    return Status::FailedPrecondition(
        "ShrinkNcclCommunicator: the parent was aborted; re-form with CreateNcclCommunicator");
  }
  if (p->world_size() - static_cast<int>(excluded_ranks.size()) != options.world_size) {
    return Status::InvalidArgument("ShrinkNcclCommunicator: world size " +
                                   std::to_string(options.world_size) + " != parent " +
                                   std::to_string(p->world_size()) + " minus " +
                                   std::to_string(excluded_ranks.size()) + " excluded");
  }
  CommOptions o = options;
  cudaStream_t stream = nullptr;
  bool own = false;
  EDL_RETURN_IF_ERROR(PrepareDevice(&o, &stream, &own));
  std::vector<int> excluded = excluded_ranks;
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t r =
      ncclCommShrink(p->handle(), excluded.data(), static_cast<int>(excluded.size()), &comm,
                     &config, NCCL_SHRINK_DEFAULT);
  Status s = r == ncclSuccess || r == ncclInProgress
                 ? WaitInit(comm, o, "ncclCommShrink")
                 : NcclStatus(r, "ncclCommShrink", __FILE__, __LINE__);
  if (!s.ok()) {
    if (own) cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(o, comm, stream, own));
}

}  // namespace edl::runtime

// The plugin's entry point for CreateNcclCommunicator (edl/runtime/comm/nccl_plugin.cc).
extern "C" __attribute__((visibility("default"))) void edl_cuda_new_nccl_communicator_v1(
    const edl::runtime::CommOptions* options,
    edl::StatusOr<std::unique_ptr<edl::runtime::Communicator>>* out) {
  *out = edl::runtime::NewNcclCommunicator(*options);
}
