// NCCL communicator on one GPU: all-reduce / broadcast correctness at world size 1 (device and
// host pointers, BroadcastAll), and that nothing hangs: a collective stuck behind work that never
// finishes returns Aborted when another thread calls Abort() (device and host arguments: a host
// argument must not park the thread in a synchronous copy), Timeout on its own, or the
// interrupt's status; an init whose peer never comes ends on the interrupt or on Timeout; 100
// abort/re-init cycles, and 100 destroy/re-init cycles, leave the device memory where it was
// (EDL_NCCL_TEST_CYCLES sets fewer); a shrink that NCCL would refuse is refused first, leaving the
// parent usable. One GPU cannot hold two ranks of one NCCL communicator, so the "stuck" collective
// is held back by a host callback on its stream that only the test releases. Everything that
// needs a GPU skips, saying why, where none is visible.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/comm/memory_kv_store.h"
#include "edl/runtime/comm/nccl/nccl_communicator.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

using std::chrono::milliseconds;

// Empty when a GPU can be used, else the reason to skip.
std::string NoGpuReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  if (count == 0) return "no CUDA device visible (cudaGetDeviceCount = 0)";
  return "";
}

#define SKIP_WITHOUT_GPU()                 \
  do {                                     \
    const std::string why = NoGpuReason(); \
    if (!why.empty()) GTEST_SKIP() << why; \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

CommOptions Options(KvStore* store, int rank, int world, cudaStream_t stream,
                    milliseconds timeout = milliseconds(20000)) {
  CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.key_prefix = "test/nccl";
  o.timeout = timeout;
  o.cuda_device = 0;
  o.cuda_stream = stream;
  return o;
}

// A stream that owns itself.
struct Stream {
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaStream_t s = nullptr;
};

// Holds a stream in a host callback until Release() (or 60 s, so a broken test cannot hang).
class StreamBlocker {
 public:
  void Block(cudaStream_t stream) {
    ASSERT_CUDA(cudaLaunchHostFunc(stream, &StreamBlocker::Wait, this));
  }
  void Release() { release_.store(true); }

 private:
  static void CUDART_CB Wait(void* arg) {
    auto* self = static_cast<StreamBlocker*>(arg);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!self->release_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
  }
  std::atomic<bool> release_{false};
};

TEST(NcclCommunicatorTest, RejectsBadOptionsWithoutTouchingTheGpu) {
  MemoryKvStore store;
  auto comm = CreateNcclCommunicator(Options(&store, 2, 2, nullptr));
  EXPECT_EQ(comm.status().code(), Status::Code::kInvalidArgument) << comm.status().ToString();
  CommOptions no_store = Options(nullptr, 0, 1, nullptr);
  EXPECT_EQ(CreateNcclCommunicator(no_store).status().code(), Status::Code::kInvalidArgument);
}

TEST(NcclCommunicatorTest, AllReduceAndBroadcastAtWorldSizeOne) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s));
  ASSERT_OK(made.status());
  Communicator* comm = made.value().get();
  EXPECT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);

  // Device fp32, sum and max (world size 1: the data comes back unchanged).
  const size_t n = 1 << 20;
  std::vector<float> host(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) - 500.f;
  float* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, n * sizeof(float)));
  ASSERT_CUDA(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  ASSERT_OK(comm->AllReduce(dev, n, DataType::kFloat32, ReduceOp::kSum));
  ASSERT_OK(comm->AllReduce(dev, n, DataType::kFloat32, ReduceOp::kMax));
  ASSERT_CUDA(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, host);

  // Broadcast of raw bytes from root 0.
  ASSERT_OK(comm->Broadcast(dev, n * sizeof(float), 0));
  ASSERT_CUDA(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, host);
  EXPECT_EQ(comm->Broadcast(dev, 4, 1).code(), Status::Code::kInvalidArgument);
  ASSERT_CUDA(cudaFree(dev));

  // bf16 on the device.
  std::vector<__nv_bfloat16> bf(64, __float2bfloat16(1.5f));
  __nv_bfloat16* dbf = nullptr;
  ASSERT_CUDA(cudaMalloc(&dbf, bf.size() * sizeof(bf[0])));
  ASSERT_CUDA(cudaMemcpy(dbf, bf.data(), bf.size() * sizeof(bf[0]), cudaMemcpyHostToDevice));
  ASSERT_OK(comm->AllReduce(dbf, bf.size(), DataType::kBFloat16, ReduceOp::kSum));
  ASSERT_CUDA(cudaMemcpy(bf.data(), dbf, bf.size() * sizeof(bf[0]), cudaMemcpyDeviceToHost));
  EXPECT_EQ(__bfloat162float(bf[7]), 1.5f);
  ASSERT_CUDA(cudaFree(dbf));

  // Host scalars (the runtime reduces step counters from the stack) go through staging.
  int64_t v[3] = {7, -3, 1LL << 40};
  ASSERT_OK(comm->AllReduce(v, 3, DataType::kInt64, ReduceOp::kMax));
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v[2], 1LL << 40);
  double d[2] = {0.25, 3.5};
  ASSERT_OK(comm->AllReduce(d, 2, DataType::kFloat64, ReduceOp::kSum));
  EXPECT_EQ(d[1], 3.5);
  uint64_t h = 0x1234567890abcdefULL;
  ASSERT_OK(comm->Broadcast(&h, sizeof(h), 0));
  EXPECT_EQ(h, 0x1234567890abcdefULL);
  ASSERT_OK(comm->Barrier());
  EXPECT_FALSE(comm->aborted());
}

TEST(NcclCommunicatorTest, AbortFromAnotherThreadUnblocksAStuckCollective) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s, milliseconds(60000)));
  ASSERT_OK(made.status());
  Communicator* comm = made.value().get();
  float* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, 1024 * sizeof(float)));
  StreamBlocker blocker;
  blocker.Block(stream.s);

  Status result;
  std::atomic<bool> returned{false};
  std::thread collective([&] {
    result = comm->AllReduce(dev, 1024, DataType::kFloat32, ReduceOp::kSum);
    returned.store(true);
  });
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(returned.load()) << "the collective should be held by the blocked stream";
  comm->Abort();
  collective.join();  // bounded: the collective polls the abort flag
  blocker.Release();
  EXPECT_TRUE(result.IsAborted()) << result.ToString();
  std::cout << "  stuck collective returned: " << result.ToString() << "\n";
  EXPECT_TRUE(comm->aborted());
  EXPECT_TRUE(comm->AllReduce(dev, 1, DataType::kFloat32, ReduceOp::kSum).IsAborted());
  comm->Abort();  // idempotent
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));
  ASSERT_CUDA(cudaFree(dev));
}

TEST(NcclCommunicatorTest, StuckCollectiveTimesOut) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s, milliseconds(1500)));
  ASSERT_OK(made.status());
  float* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, 1024 * sizeof(float)));
  StreamBlocker blocker;
  blocker.Block(stream.s);
  const Status s = made.value()->AllReduce(dev, 1024, DataType::kFloat32, ReduceOp::kSum);
  blocker.Release();
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  // Sticky: the communicator stays failed.
  EXPECT_FALSE(made.value()->Barrier().ok());
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));
  ASSERT_CUDA(cudaFree(dev));
}

TEST(NcclCommunicatorTest, RankThatNeverJoinsTimesOutCreation) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  // Rank 0 of 2 publishes the id; rank 1 never starts.
  auto made = CreateNcclCommunicator(Options(&store, 0, 2, stream.s, milliseconds(3000)));
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(made.status().IsTimeout()) << made.status().ToString();
  std::cout << "  creation without rank 1: " << made.status().ToString() << "\n";
  // Rank 1 of a communicator whose rank 0 never published: the rendezvous wait times out.
  MemoryKvStore empty;
  auto joiner = CreateNcclCommunicator(Options(&empty, 1, 2, stream.s, milliseconds(500)));
  EXPECT_TRUE(joiner.status().IsTimeout()) << joiner.status().ToString();
}

TEST(NcclCommunicatorTest, CorruptUniqueIdIsRejected) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  ASSERT_OK(store.Set("test/nccl/nccl_unique_id", "not hex"));
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 1, 2, stream.s, milliseconds(500)));
  EXPECT_TRUE(made.status().IsCorruption()) << made.status().ToString();
}

// The hang of a dead peer, reproduced on one GPU: the stream is held, so the collective can never
// finish; its host argument (a stack scalar, as the runtime's) must not park the thread in a copy.
TEST(NcclCommunicatorTest, HostArgumentCollectiveAbortedWhileStreamBlockedReturnsWithin2s) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s, milliseconds(60000)));
  ASSERT_OK(made.status());
  Communicator* comm = made.value().get();
  StreamBlocker blocker;
  blocker.Block(stream.s);
  std::atomic<bool> started{false}, returned{false};
  Status result;
  std::thread collective([&] {
    int64_t v[3] = {1, 2, 3};
    started.store(true);
    result = comm->AllReduce(v, 3, DataType::kInt64, ReduceOp::kMax);
    returned.store(true);
  });
  while (!started.load()) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(returned.load()) << "the collective should be held by the blocked stream";
  const auto t0 = std::chrono::steady_clock::now();
  comm->Abort();
  while (!returned.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  blocker.Release();  // frees the thread even when the test fails, so join() cannot hang
  collective.join();
  std::cout << "  host-argument collective returned " << took
            << " s after Abort(): " << result.ToString() << "\n";
  EXPECT_LT(took, 2.0);
  EXPECT_TRUE(result.IsAborted()) << result.ToString();
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));
}

TEST(NcclCommunicatorTest, InterruptEndsAStuckCollectiveAndAnInit) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  std::atomic<bool> superseded{false};
  CommOptions o = Options(&store, 0, 1, stream.s, milliseconds(60000));
  o.interrupt = [&](CommPhase) {
    return superseded.load() ? Status::Aborted("test: a failure generation") : Status::OK();
  };
  auto made = CreateNcclCommunicator(o);
  ASSERT_OK(made.status());
  StreamBlocker blocker;
  blocker.Block(stream.s);
  std::thread flip([&] {
    std::this_thread::sleep_for(milliseconds(300));
    superseded.store(true);
  });
  double d = 1.5;
  const Status s = made.value()->AllReduce(&d, 1, DataType::kFloat64, ReduceOp::kSum);
  flip.join();
  blocker.Release();
  EXPECT_TRUE(s.IsAborted()) << s.ToString();
  EXPECT_NE(s.message().find("test: a failure generation"), std::string::npos) << s.ToString();
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));

  // An init whose second rank never comes ends on the interrupt, long before its timeout.
  MemoryKvStore store2;
  CommOptions two = Options(&store2, 0, 2, stream.s, milliseconds(60000));
  std::atomic<int> polls{0};
  two.interrupt = [&](CommPhase phase) {
    EXPECT_EQ(phase, CommPhase::kConstruct);
    return ++polls > 20 ? Status::Aborted("test: superseded") : Status::OK();
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto lonely = CreateNcclCommunicator(two);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(lonely.status().IsAborted()) << lonely.status().ToString();
  EXPECT_LT(took, 30.0);
  std::cout << "  init interrupted after " << took << " s: " << lonely.status().ToString() << "\n";
}

// Cycles of the memory tests: 100 unless EDL_NCCL_TEST_CYCLES says otherwise (a short device
// run); each cycle is a full NCCL init (about a second on an H100).
int Cycles() {
  const char* env = std::getenv("EDL_NCCL_TEST_CYCLES");
  const int n = env != nullptr ? std::atoi(env) : 0;
  return n > 0 ? n : 100;
}

// Free device memory once it has come back to within `slack_mib` of `baseline`, or the last
// reading after `wait`: aborted communicators are freed on the reaper's thread, and NCCL frees
// some resources on threads of its own.
size_t FreeAfterTeardown(size_t baseline, double slack_mib, std::chrono::seconds wait,
                         double* waited_s) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t free_now = 0, total = 0;
  for (;;) {
    EXPECT_EQ(cudaMemGetInfo(&free_now, &total), cudaSuccess);
    const double lost = (static_cast<double>(baseline) - static_cast<double>(free_now)) / (1 << 20);
    const auto waited = std::chrono::steady_clock::now() - t0;
    *waited_s = std::chrono::duration<double>(waited).count();
    if (lost < slack_mib || waited > wait) return free_now;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

// `abort`: each cycle ends in Abort() (the failure path); else in the destructor (finalise and
// destroy, the planned path).
void CyclesKeepDeviceMemory(bool abort) {
  Stream stream;
  float* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, 1024 * sizeof(float)));
  auto cycle = [&](int i) {
    MemoryKvStore store;
    auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s));
    ASSERT_OK(made.status());
    ASSERT_OK(made.value()->AllReduce(dev, 1024, DataType::kFloat32, ReduceOp::kSum));
    int64_t step = i;
    ASSERT_OK(made.value()->AllReduce(&step, 1, DataType::kInt64, ReduceOp::kMax));
    EXPECT_EQ(step, i);
    if (abort) {
      made.value()->Abort();
      EXPECT_TRUE(made.value()->Barrier().IsAborted());
    }
  };
  for (int i = 0; i < 3; ++i) cycle(i);  // NCCL's and CUDA's one-time allocations
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));
  double settle_s = 0;
  size_t free_before = FreeAfterTeardown(0, 0, std::chrono::seconds(0), &settle_s);
  // Let the warm-up cycles' teardown finish before the baseline.
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    size_t f = 0, t = 0;
    ASSERT_CUDA(cudaMemGetInfo(&f, &t));
    free_before = std::max(free_before, f);
  }
  const int n = Cycles();
  for (int i = 0; i < n && !::testing::Test::HasFatalFailure(); ++i) cycle(i);
  ASSERT_CUDA(cudaStreamSynchronize(stream.s));
  double waited_s = 0;
  const size_t free_after =
      FreeAfterTeardown(free_before, 64.0, std::chrono::seconds(20), &waited_s);
  const double lost_mib =
      (static_cast<double>(free_before) - static_cast<double>(free_after)) / (1 << 20);
  std::cout << "  device memory free before " << free_before / (1 << 20) << " MiB, after " << n
            << (abort ? " abort" : " destroy") << "/re-init cycles " << free_after / (1 << 20)
            << " MiB (lost " << lost_mib << " MiB, " << lost_mib / n << " MiB per cycle; waited "
            << waited_s << " s for teardown)\n";
  EXPECT_LT(lost_mib, 64.0) << "each cycle leaks device memory";
  ASSERT_CUDA(cudaFree(dev));
}

TEST(NcclCommunicatorTest, HundredAbortAndReinitCyclesKeepDeviceMemory) {
  SKIP_WITHOUT_GPU();
  CyclesKeepDeviceMemory(/*abort=*/true);
}

TEST(NcclCommunicatorTest, HundredDestroyAndReinitCyclesKeepDeviceMemory) {
  SKIP_WITHOUT_GPU();
  CyclesKeepDeviceMemory(/*abort=*/false);
}

TEST(NcclCommunicatorTest, BroadcastAllMixesHostAndDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto made = CreateNcclCommunicator(Options(&store, 0, 1, stream.s));
  ASSERT_OK(made.status());
  std::vector<float*> devs(300);
  std::vector<BroadcastBuffer> buffers;
  for (size_t i = 0; i < devs.size(); ++i) {
    ASSERT_CUDA(cudaMalloc(&devs[i], 64 * sizeof(float)));
    std::vector<float> v(64, static_cast<float>(i));
    ASSERT_CUDA(cudaMemcpy(devs[i], v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    buffers.push_back({devs[i], 64 * sizeof(float)});
  }
  uint64_t header = 0xfeedULL;
  buffers.push_back({&header, sizeof(header)});
  ASSERT_OK(made.value()->BroadcastAll(buffers, 0));
  EXPECT_EQ(header, 0xfeedULL);
  for (size_t i = 0; i < devs.size(); ++i) {
    std::vector<float> back(64);
    ASSERT_CUDA(
        cudaMemcpy(back.data(), devs[i], back.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(back[63], static_cast<float>(i));
    ASSERT_CUDA(cudaFree(devs[i]));
  }
  EXPECT_EQ(made.value()->BroadcastAll(buffers, 1).code(), Status::Code::kInvalidArgument);
}

// What one GPU can check of ncclCommShrink: NCCL requires at least one excluded rank and the
// caller not among them, so a communicator of one rank cannot be shrunk (a real shrink needs two
// GPUs); the refusals name the rule before NCCL is called, and leave the parent usable.
TEST(NcclCommunicatorTest, ShrinkRefusesWhatNcclWouldRefuseAndKeepsTheParent) {
  SKIP_WITHOUT_GPU();
  MemoryKvStore store;
  Stream stream;
  auto parent = CreateNcclCommunicator(Options(&store, 0, 1, stream.s));
  ASSERT_OK(parent.status());
  CommOptions o = Options(nullptr, 0, 1, stream.s);
  o.generation = 2;
  auto none = ShrinkNcclCommunicator(parent.value().get(), {}, /*abort_parent=*/false, o);
  EXPECT_EQ(none.status().code(), Status::Code::kInvalidArgument) << none.status().ToString();
  EXPECT_NE(none.status().message().find("no rank to exclude"), std::string::npos);
  auto self = ShrinkNcclCommunicator(parent.value().get(), {0}, /*abort_parent=*/false, o);
  EXPECT_EQ(self.status().code(), Status::Code::kInvalidArgument) << self.status().ToString();
  std::cout << "  NCCL " << NcclRuntimeVersion() << ": shrink excluding none -> "
            << none.status().ToString() << "; excluding itself -> " << self.status().ToString()
            << "\n";
  int64_t v = 5;
  ASSERT_OK(parent.value()->AllReduce(&v, 1, DataType::kInt64, ReduceOp::kSum));
  EXPECT_EQ(v, 5);
}

}  // namespace
}  // namespace edl::runtime
