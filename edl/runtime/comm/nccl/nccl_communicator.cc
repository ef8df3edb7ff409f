// NCCL implementation of Communicator (GPU data plane), built only with EDL_HAVE_NCCL, into the
// CUDA plugin libedl_cuda.so (edl/runtime/cuda_plugin.h); libedl reaches it through
// CreateNcclCommunicator / ShrinkNcclCommunicator (comm/nccl_plugin.cc), which load the plugin.
//
// No call here blocks the host past its bound (docs/ARCHITECTURE.md, "The NCCL re-form state
// machine", lists every NCCL and CUDA call and what bounds it):
//   - the communicator is non-blocking (ncclConfig_t.blocking = 0): init, shrink, finalize and
//     every collective return at once (possibly ncclInProgress);
//   - every wait is nccl::PollUntil: it polls its own completion (ncclCommGetAsyncError for init
//     and enqueue, cudaEventQuery for the stream), the communicator's asynchronous error, the abort
//     flag, CommOptions::interrupt (a newer or failure generation, shutdown) and the deadline;
//   - host arguments (the runtime's scalars on the stack) go through a pinned block owned by the
//     communicator and a device slot: both copies are asynchronous for the host, so a collective
//     stuck on a dead peer leaves the host in PollUntil, never inside a cudaMemcpy;
//   - nothing on the collective or teardown path synchronises the device: no cudaMalloc/cudaFree
//     or cudaFreeHost after construction (the device slot is stream-ordered, the pinned block goes
//     back to nccl::PinnedPool), and teardown is bounded (see ~NcclCommunicator).
//
// Rendezvous: rank 0 creates the ncclUniqueId and publishes it (hex) under
// "<key_prefix>/nccl_unique_id" in options.store; the other ranks Wait() for it with
// options.timeout. A shrink needs no rendezvous (ncclCommShrink over the parent).
//
// Abort (from any thread): sets aborted_. The thread that owns the handle at that moment gives it
// to nccl::Reaper, which calls ncclCommAbort on its own thread: the collective thread, which
// checks the flag every poll (<= 1 ms), or Abort() itself when no collective is in flight. So
// ncclCommAbort never runs concurrently with another NCCL call on the same handle (NCCL forbids
// that), yet a collective stuck on a dead peer returns Aborted within one poll: ncclCommAbort frees
// device memory, and those frees wait until the device has drained the work queued before them
// (measured on an H100: a stream held by a host function kept ncclCommAbort, and with it the
// collective that called it, for as long as the stream was held). ncclCommAbort also stops the
// NCCL kernels stuck on the GPU, which lets the stream drain.
//
// Failure is sticky: the first error is kept in failed_ and returned by every later call; the
// owner destroys the communicator and builds the next generation's.
#include "edl/runtime/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <glog/logging.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>

#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/comm/nccl/nccl_util.h"
#include "edl/runtime/comm/nccl_reform.h"

namespace edl::runtime {
namespace {

using nccl::Clock;
using nccl::CudaStatus;
using nccl::NcclStatus;

// Teardown of a healthy communicator: ncclCommFinalize gets this long (at most the communicator
// timeout) to quiesce before it is aborted instead.
constexpr std::chrono::milliseconds kFinalizeBound{5000};
// The oldest NCCL this code runs with: ncclCommInitRankConfig, ncclCommFinalize and
// ncclGetLastError (2.14), ncclCommGetAsyncError in non-blocking mode for every call (2.18).
constexpr int kMinNcclVersion = 21800;

class NcclCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (initialised, non-blocking), of `own_stream` when set, of the
  // pinned block and the device slot (both kHostArgBytes) and of `done`.
  NcclCommunicator(const CommOptions& options, ncclComm_t comm, cudaStream_t stream,
                   bool own_stream, void* pinned, void* slot, cudaEvent_t done)
      : rank_(options.rank),
        world_(options.world_size),
        generation_(options.generation),
        device_(options.cuda_device),
        timeout_(options.timeout),
        stream_(stream),
        own_stream_(own_stream),
        interrupt_(options.interrupt),
        pinned_(pinned),
        slot_(slot),
        done_(done),
        comm_(comm) {}
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status BroadcastAll(const std::vector<BroadcastBuffer>& buffers, int root) override;
  Status Barrier() override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(); }

  // ShrinkNcclCommunicator: hands the live handle to `shrink` (which calls ncclCommShrink on it)
  // as the collective thread would, so an Abort() meanwhile waits for it; Aborted when the
  // communicator failed or was aborted. With `terminated` (NCCL_SHRINK_ABORT ended the parent's
  // operations) the parent is marked aborted: its teardown aborts instead of finalising.
  Status ShrinkFrom(const std::function<Status(ncclComm_t)>& shrink, bool terminated);

 private:
  std::string Name() const {
    return "NCCL communicator (generation " + std::to_string(generation_) + ", rank " +
           std::to_string(rank_) + "/" + std::to_string(world_) + ")";
  }
  nccl::WaitScope Scope(const char* what, Clock::time_point deadline) const {
    nccl::WaitScope s;
    s.name = Name();
    s.what = what;
    s.comm = comm_;
    s.aborted = &aborted_;
    s.interrupt = &interrupt_;
    s.phase = CommPhase::kCollective;
    s.deadline = deadline;
    s.timeout = timeout_;
    return s;
  }
  // Claims comm_ for one operation (in_flight_), runs `body`, releases it; on error aborts comm_
  // and makes the error sticky.
  Status Run(const std::function<Status(Clock::time_point)>& body);
  // Polls until the NCCL calls just issued have been enqueued (state leaves ncclInProgress).
  Status WaitEnqueued(const char* what, Clock::time_point deadline);
  // Records done_ on the stream and polls until the stream has reached it.
  Status WaitDone(const char* what, Clock::time_point deadline);
  // `count` elements of `elem` bytes at `data` through `collective`(device pointer, elements):
  // device memory directly; host memory in slices through pinned_ and slot_.
  Status OnBuffer(const char* what, void* data, size_t count, size_t elem,
                  Clock::time_point deadline,
                  const std::function<ncclResult_t(void*, size_t)>& collective);
  static bool OnDevice(const void* p);

  const int rank_;
  const int world_;
  const int64_t generation_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const cudaStream_t stream_;  // the trainer's stream (not owned) unless own_stream_
  const bool own_stream_;
  const std::function<Status(CommPhase)> interrupt_;
  void* const pinned_;      // kHostArgBytes page-locked (nccl::PinnedPool)
  void* const slot_;        // kHostArgBytes on the device, stream-ordered
  const cudaEvent_t done_;  // recorded after each operation; polled instead of the stream

  std::atomic<bool> aborted_{false};
  Mutex mu_;         // guards comm_ against Abort() and in_flight_
  ncclComm_t comm_;  // written under mu_; nullptr once aborted/destroyed. The collective thread
                     // reads it unlocked while in_flight_.
  bool in_flight_ GUARDED_BY(mu_) = false;  // a collective thread owns comm_ right now
  Status failed_;                           // first error; touched only by the collective thread
};

// Teardown, bounded: a healthy communicator is finalised (ncclCommFinalize, non-blocking, polled
// for at most kFinalizeBound) and destroyed (local frees once finalised); one that failed, or
// whose finalize does not quiesce in time (a peer gone), is aborted (ncclCommAbort: local, stops
// its kernels). The device slot is freed in stream order and the pinned block goes back to the
// pool with an event after the last copy: neither waits for the device. The elastic runtime runs
// this on a helper thread, off the re-form's critical path.
NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  MutexLock lock(&mu_);
  if (comm_ != nullptr) {
    bool clean = failed_.ok() && !aborted_.load();
    if (clean) {
      clean = false;
      const ncclResult_t r = ncclCommFinalize(comm_);
      if (r == ncclSuccess || r == ncclInProgress) {
        nccl::WaitScope s;
        s.name = Name();
        s.what = "ncclCommFinalize";
        s.phase = CommPhase::kCollective;
        s.timeout = std::min(timeout_,
                             std::chrono::duration_cast<std::chrono::milliseconds>(kFinalizeBound));
        s.deadline = Clock::now() + s.timeout;
        ncclComm_t c = comm_;
        clean = nccl::PollUntil(s, [c]() -> StatusOr<bool> {
                  ncclResult_t state = ncclInProgress;
                  if (ncclCommGetAsyncError(c, &state) != ncclSuccess) {
                    return Status::Internal("ncclCommGetAsyncError");
                  }
                  if (state == ncclInProgress) return false;
                  if (state != ncclSuccess) return Status::Internal(ncclGetErrorString(state));
                  return true;
                }).ok();
      }
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      nccl::Reaper::Get().Abort(comm_, device_);
    }
    comm_ = nullptr;
  }
  cudaEvent_t last = nullptr;
  if (cudaEventCreateWithFlags(&last, cudaEventDisableTiming) == cudaSuccess &&
      cudaEventRecord(last, stream_) != cudaSuccess) {
    cudaEventDestroy(last);
    last = nullptr;
  }
  nccl::PinnedPool::Get().Give(pinned_, last);
  cudaFreeAsync(slot_, stream_);
  cudaEventDestroy(done_);                      // released by CUDA once it completes
  if (own_stream_) cudaStreamDestroy(stream_);  // returns at once; freed when drained
  cudaGetLastError();
}

void NcclCommunicator::Abort() {
  aborted_.store(true);
  MutexLock lock(&mu_);
  if (!in_flight_ && comm_ != nullptr) {
    nccl::Reaper::Get().Abort(comm_, device_);
    comm_ = nullptr;
  }
  // else: the collective thread sees aborted_ at its next poll and hands comm_ to the reaper.
}

Status NcclCommunicator::Run(const std::function<Status(Clock::time_point)>& body) {
  if (!failed_.ok()) return failed_;
  {
    MutexLock lock(&mu_);
    if (aborted_.load() || comm_ == nullptr) {
      failed_ = Status::Aborted(Name() + " was aborted; build a new one");
      return failed_;
    }
    in_flight_ = true;
  }
  Status s =
      cudaSetDevice(device_) == cudaSuccess
          ? body(Clock::now() + timeout_)
          : Status::Internal(Name() + ": cudaSetDevice(" + std::to_string(device_) + ") failed");
  MutexLock lock(&mu_);
  in_flight_ = false;
  if (!s.ok() && failed_.ok()) failed_ = s;
  if ((!s.ok() || aborted_.load()) && comm_ != nullptr) {  // failed, or Abort() arrived as we ended
    nccl::Reaper::Get().Abort(comm_, device_);
    comm_ = nullptr;
  }
  return s.ok() ? Status::OK() : failed_;
}

Status NcclCommunicator::WaitEnqueued(const char* what, Clock::time_point deadline) {
  ncclComm_t c = comm_;
  return nccl::PollUntil(Scope(what, deadline), [c, what]() -> StatusOr<bool> {
    ncclResult_t state = ncclSuccess;
    EDL_NCCL_CHECK(ncclCommGetAsyncError(c, &state));
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return NcclStatus(state, what, __FILE__, __LINE__);
    return true;
  });
}

Status NcclCommunicator::WaitDone(const char* what, Clock::time_point deadline) {
  EDL_CUDA_CHECK(cudaEventRecord(done_, stream_));
  const cudaEvent_t ev = done_;
  return nccl::PollUntil(Scope(what, deadline), [ev]() -> StatusOr<bool> {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaStatus(e, "cudaEventQuery", __FILE__, __LINE__);
  });
}

bool NcclCommunicator::OnDevice(const void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

Status NcclCommunicator::OnBuffer(const char* what, void* data, size_t count, size_t elem,
                                  Clock::time_point deadline,
                                  const std::function<ncclResult_t(void*, size_t)>& collective) {
  if (count == 0) return Status::OK();
  if (OnDevice(data)) {
    EDL_NCCL_CHECK(collective(data, count));
    EDL_RETURN_IF_ERROR(WaitEnqueued(what, deadline));
    return WaitDone(what, deadline);
  }
  // Host memory: slices of at most kHostArgBytes, each pageable -> pinned (host memcpy), pinned ->
  // device slot, the collective on the slot, slot -> pinned, then pinned -> pageable once the
  // stream has got there. The two cudaMemcpyAsync are page-locked, so they return at once.
  const size_t per = std::max<size_t>(1, nccl::kHostArgBytes / elem);
  auto* host = static_cast<char*>(data);
  for (size_t at = 0; at < count; at += per) {
    const size_t n = std::min(per, count - at), bytes = n * elem;
    std::memcpy(pinned_, host + at * elem, bytes);
    EDL_CUDA_CHECK(cudaMemcpyAsync(slot_, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
    EDL_NCCL_CHECK(collective(slot_, n));
    EDL_RETURN_IF_ERROR(WaitEnqueued(what, deadline));
    EDL_CUDA_CHECK(cudaMemcpyAsync(pinned_, slot_, bytes, cudaMemcpyDeviceToHost, stream_));
    EDL_RETURN_IF_ERROR(WaitDone(what, deadline));
    std::memcpy(host + at * elem, pinned_, bytes);
  }
  return Status::OK();
}

Status NcclCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op) {
  const ncclRedOp_t nop = op == ReduceOp::kSum ? ncclSum : ncclMax;
  const ncclDataType_t nt = nccl::ToNccl(type);
  return Run([&](Clock::time_point deadline) {
    return OnBuffer(
        "ncclAllReduce", data, count, DataTypeSize(type), deadline,
        [&](void* dev, size_t n) { return ncclAllReduce(dev, dev, n, nt, nop, comm_, stream_); });
  });
}

Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_) {
    return Status::InvalidArgument(Name() + ": broadcast root " + std::to_string(root) +
                                   " outside [0, " + std::to_string(world_) + ")");
  }
  // Only the root's bytes matter; the host path copies them in on every rank (harmless).
  return Run([&](Clock::time_point deadline) {
    return OnBuffer("ncclBroadcast", data, bytes, 1, deadline, [&](void* dev, size_t n) {
      return ncclBroadcast(dev, dev, n, ncclUint8, root, comm_, stream_);
    });
  });
}

// Host buffers one by one (through the pinned block); the device buffers as groups of at most
// kGroupOps broadcasts (ncclGroupStart/End), each group waited on only until it is enqueued, and
// one wait for the stream at the end: no drain per tensor.
Status NcclCommunicator::BroadcastAll(const std::vector<BroadcastBuffer>& buffers, int root) {
  constexpr size_t kGroupOps = 256;
  if (root < 0 || root >= world_) {
    return Status::InvalidArgument(Name() + ": broadcast root " + std::to_string(root) +
                                   " outside [0, " + std::to_string(world_) + ")");
  }
  std::vector<const BroadcastBuffer*> device;
  for (const BroadcastBuffer& b : buffers) {
    if (b.bytes == 0) continue;
    if (OnDevice(b.data)) {
      device.push_back(&b);
    } else {
      EDL_RETURN_IF_ERROR(Broadcast(b.data, b.bytes, root));
    }
  }
  if (device.empty()) return Status::OK();
  return Run([&](Clock::time_point deadline) -> Status {
    for (size_t at = 0; at < device.size(); at += kGroupOps) {
      EDL_NCCL_CHECK(ncclGroupStart());
      for (size_t i = at; i < std::min(device.size(), at + kGroupOps); ++i) {
        const ncclResult_t r = ncclBroadcast(device[i]->data, device[i]->data, device[i]->bytes,
                                             ncclUint8, root, comm_, stream_);
        if (r != ncclSuccess && r != ncclInProgress) {
          ncclGroupEnd();
          return NcclStatus(r, "ncclBroadcast (grouped)", __FILE__, __LINE__);
        }
      }
      EDL_NCCL_CHECK(ncclGroupEnd());
      EDL_RETURN_IF_ERROR(WaitEnqueued("ncclGroupEnd (state broadcast)", deadline));
    }
    return WaitDone("state broadcast", deadline);
  });
}

Status NcclCommunicator::Barrier() {
  float one = 1.f;  // a one-float all-reduce through the pinned block
  return AllReduce(&one, 1, DataType::kFloat32, ReduceOp::kSum);
}

Status NcclCommunicator::ShrinkFrom(const std::function<Status(ncclComm_t)>& shrink,
                                    bool terminated) {
  Status s = Run([&](Clock::time_point) { return shrink(comm_); });
  if (s.ok() && terminated) aborted_.store(true);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Creation.

Status CheckNcclVersion() {
  int version = 0;
  EDL_NCCL_CHECK(ncclGetVersion(&version));
  if (version < kMinNcclVersion) {
    return Status::FailedPrecondition(
        "the NCCL library loaded (version code " + std::to_string(version) +
        ") is older than the " + std::to_string(kMinNcclVersion) +
        " edl needs; install a newer NCCL (a current PyTorch's "
        "nvidia-nccl wheel, or the NCCL of the CUDA toolkit) or use --comm gloo");
  }
  return Status::OK();
}

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

// What a communicator owns besides its handle, made before the handle (so that a failure here
// leaves no NCCL communicator behind) and handed to it, or released on failure.
struct Resources {
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  void* pinned = nullptr;
  void* slot = nullptr;
  cudaEvent_t done = nullptr;

  // Resolves the device (cuda_device -1 = current) and the stream (nullptr = a new owned one).
  Status Make(CommOptions* o) {
    int count = 0;
    EDL_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (o->cuda_device < 0) EDL_CUDA_CHECK(cudaGetDevice(&o->cuda_device));
    if (o->cuda_device >= count) {
      return Status::InvalidArgument(
          "NCCL communicator: CUDA device " + std::to_string(o->cuda_device) + " does not exist (" +
          std::to_string(count) + " visible; check --cuda_device and CUDA_VISIBLE_DEVICES)");
    }
    EDL_CUDA_CHECK(cudaSetDevice(o->cuda_device));
    own_stream = o->cuda_stream == nullptr;
    if (own_stream) {
      EDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    } else {
      stream = static_cast<cudaStream_t>(o->cuda_stream);
    }
    auto pinned_block = nccl::PinnedPool::Get().Take();
    EDL_RETURN_IF_ERROR(pinned_block.status());
    pinned = pinned_block.value();
    EDL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    EDL_CUDA_CHECK(cudaMallocAsync(&slot, nccl::kHostArgBytes, stream));
    return Status::OK();
  }
  void Release() {
    nccl::PinnedPool::Get().Give(pinned, nullptr);  // never used for a copy yet
    if (slot != nullptr) cudaFreeAsync(slot, stream);
    if (done != nullptr) cudaEventDestroy(done);
    if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
    cudaGetLastError();
    *this = Resources();
  }
  std::unique_ptr<Communicator> Wrap(const CommOptions& o, ncclComm_t comm) {
    auto c = std::make_unique<NcclCommunicator>(o, comm, stream, own_stream, pinned, slot, done);
    *this = Resources();
    return c;
  }
};

// Publishes (rank 0) or fetches the unique id under the communicator's key.
Status ExchangeUniqueId(const CommOptions& o, ncclUniqueId* id) {
  const std::string key = o.key_prefix + "/nccl_unique_id";
  if (o.rank == 0) {
    EDL_NCCL_CHECK(ncclGetUniqueId(id));
    return o.store->Set(key, nccl::ToHex(id, sizeof(*id)));
  }
  std::string hex;
  EDL_RETURN_IF_ERROR(o.store->Wait(key, o.timeout, &hex));
  if (!nccl::FromHex(hex, id, sizeof(*id))) {
    return Status::Corruption("rendezvous key '" + key + "' does not hold a NCCL unique id (" +
                              std::to_string(hex.size()) +
                              " chars); is another job using the "
                              "same key prefix?");
  }
  return Status::OK();
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Waits for a non-blocking init/shrink of `comm` to finish (polling the interrupt: a newer
// generation or shutdown ends it at once); aborts `comm` on error, timeout or interrupt. Two
// ranks on one GPU come back as FailedPrecondition naming both trainers.
Status WaitInit(ncclComm_t comm, const CommOptions& o, const char* what) {
  nccl::WaitScope scope;
  scope.name = "NCCL communicator (generation " + std::to_string(o.generation) + ", rank " +
               std::to_string(o.rank) + "/" + std::to_string(o.world_size) + ")";
  scope.what = what;
  scope.interrupt = &o.interrupt;
  scope.phase = CommPhase::kConstruct;
  scope.timeout = o.timeout;
  scope.deadline = Clock::now() + o.timeout;
  ncclResult_t state = ncclInProgress;
  Status s = nccl::PollUntil(scope, [comm, what, &state]() -> StatusOr<bool> {
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return NcclStatus(state, what, __FILE__, __LINE__);
    return true;
  });
  if (s.ok()) return s;
  // Read before the abort, and only for NCCL's own refusal: the last error is process-wide.
  const char* last = state == ncclInvalidUsage ? ncclGetLastError(nullptr) : nullptr;
  const std::string dup = DuplicateGpuMessage(last ? last : "", o.rank_names, o.generation);
  nccl::Reaper::Get().Abort(comm, o.cuda_device);
  if (!dup.empty()) return Status::FailedPrecondition(dup);
  return s;
}

// ncclCommShrink is looked up at run time (NCCL >= 2.27): the plugin also loads, and falls back
// to a full init, with an older NCCL.
using ShrinkFn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
ShrinkFn FindShrink() {
  static const ShrinkFn fn = [] {
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess || version < kNcclShrinkMinVersion) {
      return ShrinkFn{nullptr};
    }
    Dl_info info;
    void* lib = nullptr;
    if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr) {
      lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    return lib != nullptr ? reinterpret_cast<ShrinkFn>(dlsym(lib, "ncclCommShrink")) : nullptr;
  }();
  return fn;
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options) {
  EDL_RETURN_IF_ERROR(ValidateOptions(options, /*need_store=*/true));
  EDL_RETURN_IF_ERROR(CheckNcclVersion());
  CommOptions o = options;
  Resources res;
  Status s = res.Make(&o);
  ncclUniqueId id;
  if (s.ok()) {
    s = ExchangeUniqueId(o, &id);
    if (!s.ok()) s = s.WithContext("NCCL rendezvous under '" + o.key_prefix + "'");
  }
  ncclComm_t comm = nullptr;
  if (s.ok()) {
    ncclConfig_t config = NonBlockingConfig();
    const ncclResult_t r = ncclCommInitRankConfig(&comm, o.world_size, id, o.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      s = NcclStatus(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
      nccl::Reaper::Get().Abort(comm, o.cuda_device);
    } else {
      s = WaitInit(comm, o, "ncclCommInitRankConfig");
    }
  }
  if (!s.ok()) {
    res.Release();
    return s;
  }
  return res.Wrap(o, comm);
}

int NcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

StatusOr<std::unique_ptr<Communicator>> NewShrunkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, bool abort_parent,
    const CommOptions& options) {
  EDL_RETURN_IF_ERROR(ValidateOptions(options, /*need_store=*/false));
  auto* p = dynamic_cast<NcclCommunicator*>(parent);
  if (p == nullptr) {
    return Status::InvalidArgument("ShrinkNcclCommunicator: the parent is not a NCCL communicator");
  }
  if (p->world_size() - static_cast<int>(excluded_ranks.size()) != options.world_size) {
    return Status::InvalidArgument("ShrinkNcclCommunicator: world size " +
                                   std::to_string(options.world_size) + " != parent " +
                                   std::to_string(p->world_size()) + " minus " +
                                   std::to_string(excluded_ranks.size()) + " excluded");
  }
  // NCCL's own rules (2.28 answers a breach with ncclInvalidArgument): at least one rank is left
  // out, and the ranks calling are not among them. PlanNcclBuild only plans shrinks that remove
  // ranks, and only survivors build the child.
  if (excluded_ranks.empty()) {
    return Status::InvalidArgument(
        "ShrinkNcclCommunicator: no rank to exclude; a communicator that keeps every rank is its "
        "parent (keep using it, or build a new one for a changed order)");
  }
  for (int r : excluded_ranks) {
    if (r < 0 || r >= p->world_size() || r == p->rank()) {
      return Status::InvalidArgument(
          "ShrinkNcclCommunicator: cannot exclude rank " + std::to_string(r) + " (parent rank " +
          std::to_string(p->rank()) + " of " + std::to_string(p->world_size()) +
          "): only other ranks of the parent can be left out, and only survivors build the child");
    }
  }
  const ShrinkFn shrink = FindShrink();
  if (shrink == nullptr) {
    return Status::FailedPrecondition("ncclCommShrink needs NCCL >= 2.27; this process runs " +
                                      std::to_string(NcclVersion()) + ": use a full init");
  }
  CommOptions o = options;
  Resources res;
  if (Status made = res.Make(&o); !made.ok()) {
    res.Release();
    return made;
  }
  std::vector<int> excluded = excluded_ranks;
  ncclComm_t comm = nullptr;
  // ncclCommShrink runs on the parent's handle as one of its operations (no Abort() meanwhile);
  // the wait for the new communicator polls only the new one.
  Status s = p->ShrinkFrom(
      [&](ncclComm_t handle) -> Status {
        ncclConfig_t config = NonBlockingConfig();
        EDL_NCCL_CHECK(shrink(handle, excluded.data(), static_cast<int>(excluded.size()), &comm,
                              &config, abort_parent ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT));
        return Status::OK();
      },
      abort_parent);
  if (s.ok()) s = WaitInit(comm, o, "ncclCommShrink");
  if (!s.ok()) {
    res.Release();
    return s;
  }
  return res.Wrap(o, comm);
}

}  // namespace edl::runtime

// The plugin's entry points (edl/runtime/comm/nccl_plugin.cc).
extern "C" __attribute__((visibility("default"))) void edl_cuda_new_nccl_communicator_v1(
    const edl::runtime::CommOptions* options,
    edl::StatusOr<std::unique_ptr<edl::runtime::Communicator>>* out) {
  *out = edl::runtime::NewNcclCommunicator(*options);
}

extern "C" __attribute__((visibility("default"))) void edl_cuda_shrink_nccl_communicator_v1(
    edl::runtime::Communicator* parent, const std::vector<int>* excluded, bool abort_parent,
    const edl::runtime::CommOptions* options,
    edl::StatusOr<std::unique_ptr<edl::runtime::Communicator>>* out) {
  *out = edl::runtime::NewShrunkNcclCommunicator(parent, *excluded, abort_parent, *options);
}

extern "C" __attribute__((visibility("default"))) int edl_cuda_nccl_version_v1() {
  return edl::runtime::NcclVersion();
}
