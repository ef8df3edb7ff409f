// Gloo communicator: collectives with N ranks as threads over an in-process store (gloo
// base_test style), abort of a blocked collective, and a dead or stopped peer process (forked,
// then SIGKILLed / SIGSTOPped) that must turn into an error rather than a hang.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/comm/file_kv_store.h"
#include "edl/runtime/comm/memory_kv_store.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

using std::chrono::milliseconds;

CommOptions Options(KvStore* store, int rank, int world, const std::string& prefix,
                    milliseconds timeout = milliseconds(20000)) {
  CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.key_prefix = prefix;
  o.timeout = timeout;
  return o;
}

// Runs fn(rank, comm) on `world` threads, each with its own communicator.
void RunRanks(int world, const std::function<void(int, Communicator*)>& fn) {
  MemoryKvStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = CreateGlooCommunicator(Options(&store, r, world, "test/gloo"));
      ASSERT_OK(comm.status());
      fn(r, comm.value().get());
    });
  }
  for (auto& t : threads) t.join();
}

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectiveTest, AllReduceSumAndMaxForEveryType) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Communicator* comm) {
    EXPECT_EQ(comm->world_size(), world);
    EXPECT_STREQ(comm->backend(), "gloo");
    std::vector<float> f(1000);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(rank + i);
    ASSERT_OK(comm->AllReduce(f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum));
    for (size_t i = 0; i < f.size(); i += 97) {
      EXPECT_FLOAT_EQ(f[i], world * (world - 1) / 2.0f + world * static_cast<float>(i));
    }
    std::vector<double> d = {static_cast<double>(rank), -static_cast<double>(rank)};
    ASSERT_OK(comm->AllReduce(d.data(), d.size(), DataType::kFloat64, ReduceOp::kMax));
    EXPECT_EQ(d[0], world - 1);
    EXPECT_EQ(d[1], 0);
    std::vector<int64_t> l = {int64_t{1} << 40, rank};
    ASSERT_OK(comm->AllReduce(l.data(), l.size(), DataType::kInt64, ReduceOp::kSum));
    EXPECT_EQ(l[0], world * (int64_t{1} << 40));
    EXPECT_EQ(l[1], world * (world - 1) / 2);
    int32_t i32 = 10 * rank;
    ASSERT_OK(comm->AllReduce(&i32, 1, DataType::kInt32, ReduceOp::kMax));
    EXPECT_EQ(i32, 10 * (world - 1));
  });
}

TEST_P(GlooCollectiveTest, BroadcastFromEveryRootAndBarrier) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Communicator* comm) {
    for (int root = 0; root < world; ++root) {
      std::vector<uint8_t> buf(100003, static_cast<uint8_t>(rank == root ? root + 1 : 0));
      ASSERT_OK(comm->Broadcast(buf.data(), buf.size(), root));
      EXPECT_EQ(buf.front(), root + 1);
      EXPECT_EQ(buf.back(), root + 1);
    }
    ASSERT_OK(comm->Barrier());
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCollectiveTest, ::testing::Values(1, 2, 3, 4));

TEST(GlooCommunicatorTest, RejectsBadOptions) {
  MemoryKvStore store;
  EXPECT_EQ(CreateGlooCommunicator(Options(&store, 2, 2, "p")).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(Options(nullptr, 0, 1, "p")).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(Options(&store, 0, 1, "")).status().code(),
            Status::Code::kInvalidArgument);
}

TEST(GlooCommunicatorTest, RendezvousWithAMissingPeerTimesOut) {
  MemoryKvStore store;
  auto comm = CreateGlooCommunicator(Options(&store, 0, 2, "lonely", milliseconds(300)));
  EXPECT_EQ(comm.status().code(), Status::Code::kTimeout) << comm.status().ToString();
}

// A KvStore whose Wait for one key fails at once: a rank that publishes its address and then
// gives up before it connects (a member of a superseded generation).
class RefusingKvStore : public KvStore {
 public:
  RefusingKvStore(KvStore* base, std::string refused) : base_(base), refused_(std::move(refused)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(key, value);
  }
  Status Get(const std::string& key, std::string* value) override {
    if (key == refused_) return Status::NotFound(key + " refused by the test");
    return base_->Get(key, value);
  }
  Status Wait(const std::string& key, milliseconds timeout, std::string* value) override {
    if (key == refused_) return Status::Timeout(key + " refused by the test");
    return base_->Wait(key, timeout, value);
  }

 private:
  KvStore* const base_;
  const std::string refused_;
};

// Rank 0 (127.0.0.1) sorts below rank 1 (127.0.0.2), so gloo makes it the listening side of their
// pair: it waits for rank 1 to connect. Rank 1 publishes its address and gives up before it
// connects. Rank 0's timeout is far beyond the test's own (ctest's TIMEOUT), so only its
// CommOptions::interrupt, turned to Aborted once rank 1 has given up, can end the wait: the
// rendezvous must return that Aborted.
TEST(GlooCommunicatorTest, InterruptEndsARendezvousWaitingForAPeerThatGaveUp) {
  MemoryKvStore store;
  RefusingKvStore refusing(&store, "gone/0");
  Status peer;
  std::thread t1([&] {
    CommOptions o = Options(&refusing, 1, 2, "gone", milliseconds(3'600'000));
    o.host = "127.0.0.2";
    peer = CreateGlooCommunicator(o).status();
  });
  std::atomic<bool> superseded{false};
  std::atomic<int> asked{0};
  CommOptions o = Options(&store, 0, 2, "gone", milliseconds(3'600'000));
  o.interrupt = [&](CommPhase phase) {
    EXPECT_EQ(phase, CommPhase::kConstruct);
    ++asked;
    return superseded.load() ? Status::Aborted("generation 1 was superseded by 2") : Status::OK();
  };
  std::thread trigger([&] {
    t1.join();
    std::string address;
    EXPECT_OK(store.Wait("gone/0", milliseconds(3'600'000), &address));  // rank 0 is connecting
    superseded.store(true);
  });
  auto comm = CreateGlooCommunicator(o);
  trigger.join();
  EXPECT_FALSE(peer.ok());
  EXPECT_TRUE(comm.status().IsAborted()) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("superseded"), std::string::npos)
      << comm.status().ToString();
  EXPECT_GT(asked.load(), 0);
}

// Rank 0's collective timeout is far beyond the test's own (ctest's TIMEOUT): only the abort can
// end its wait, so an Aborted result proves the abort unblocked it (a timeout would also read
// Aborted). Rank 1 keeps a short one: its next collective fails, at once when it sees rank 0's
// sockets close, else by that timeout (gloo's sender waits for the receiver's recv, which an
// aborted rank never posts: about one run in five here).
TEST(GlooCommunicatorTest, AbortUnblocksACollectiveWaitingOnAStalledPeer) {
  const milliseconds never(3'600'000);
  MemoryKvStore store;
  std::unique_ptr<Communicator> comms[2];
  std::thread t1([&] {
    comms[1] =
        std::move(CreateGlooCommunicator(Options(&store, 1, 2, "a", milliseconds(3000))).value());
  });
  auto c0 = CreateGlooCommunicator(Options(&store, 0, 2, "a", never));
  t1.join();
  ASSERT_OK(c0.status());
  ASSERT_NE(comms[1], nullptr);
  comms[0] = std::move(c0.value());

  // Rank 1 never joins the all-reduce; rank 0 blocks until the abort from another thread.
  Status result;
  std::atomic<bool> entering{false};
  std::thread blocked([&] {
    std::vector<float> x(1 << 16, 1.0f);
    entering.store(true);
    result = comms[0]->AllReduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  // The abort lands just before or during the all-reduce: either way it must return Aborted.
  while (!entering.load()) std::this_thread::yield();
  comms[0]->Abort();
  blocked.join();
  EXPECT_TRUE(result.IsAborted()) << result.ToString();
  EXPECT_TRUE(comms[0]->aborted());
  // Failure is sticky, and the peer's next collective fails as well rather than hanging.
  float y = 1;
  EXPECT_TRUE(comms[0]->AllReduce(&y, 1, DataType::kFloat32, ReduceOp::kSum).IsAborted());
  EXPECT_FALSE(comms[1]->AllReduce(&y, 1, DataType::kFloat32, ReduceOp::kSum).ok());
  comms[0]->Abort();  // idempotent
}

// Parent is rank 0, a forked child rank 1 (a real process, so a SIGKILL closes its sockets the
// way a crash does). After one good all-reduce the child waits; the parent harms it with `sig`
// and its next all-reduce must fail: for a killed peer on the closed connection, without waiting
// for the timeout (set far beyond the test's own, ctest's TIMEOUT), for a stopped one (its
// sockets stay open) by the communicator timeout. Told apart by the error, not by the clock.
void ExpectPeerLossFails(int sig, milliseconds timeout) {
  test::ScratchDir dir("gloo-peer");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileKvStore store(dir.path());
    auto comm = CreateGlooCommunicator(Options(&store, 1, 2, "peer", timeout));
    if (!comm.ok()) _exit(2);
    float x = 1;
    if (!comm.value()->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum).ok()) _exit(3);
    pause();
    _exit(0);
  }
  FileKvStore store(dir.path());
  auto comm = CreateGlooCommunicator(Options(&store, 0, 2, "peer", timeout));
  ASSERT_OK(comm.status());
  float x = 1;
  ASSERT_OK(comm.value()->AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(x, 2);
  ASSERT_EQ(kill(child, sig), 0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> y(1024, 1.0f);
  Status s = comm.value()->AllReduce(y.data(), y.size(), DataType::kFloat32, ReduceOp::kSum);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  const bool timed_out = s.message().find("Timed out") != std::string::npos;
  EXPECT_EQ(timed_out, sig == SIGSTOP) << s.ToString();
  std::cout << "failed after " << std::chrono::duration<double>(waited).count()
            << " s: " << s.ToString() << "\n";
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the child ended otherwise: " << status;
}

TEST(GlooCommunicatorTest, KilledPeerFailsFast) {
  ExpectPeerLossFails(SIGKILL, milliseconds(3'600'000));
}
TEST(GlooCommunicatorTest, StoppedPeerFailsWithinTheTimeout) {
  ExpectPeerLossFails(SIGSTOP, milliseconds(3000));
}

TEST(FileKvStoreTest, SetGetWait) {
  test::ScratchDir dir("kv");
  FileKvStore store(dir.path() + "/sub");
  std::string v;
  EXPECT_TRUE(store.Get("gen/1/x", &v).IsNotFound());
  EXPECT_TRUE(store.Wait("gen/1/x", milliseconds(20), &v).IsTimeout());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_OK(store.Set("gen/1/x", std::string("a\0b", 3)));
  });
  ASSERT_OK(store.Wait("gen/1/x", milliseconds(5000), &v));
  setter.join();
  EXPECT_EQ(v, std::string("a\0b", 3));
}

}  // namespace
}  // namespace edl::runtime
