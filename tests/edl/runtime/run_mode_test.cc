// Static mode's run-scoped rendezvous (edl/runtime/run_mode.h, NewRunScopedKvStore): a run never
// reads a key an earlier run left in the shared FileKvStore directory, whichever rank starts first.
// Each "rank" opens its own FileKvStore over one directory, as separate processes would.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "edl/runtime/comm/file_kv_store.h"
#include "edl/runtime/run_mode.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kBound{60000};

std::unique_ptr<KvStore> Rank(const std::string& dir, int rank, int world,
                              milliseconds bound = kBound) {
  return NewRunScopedKvStore(std::make_unique<FileKvStore>(dir), rank, world, bound);
}

// What an earlier run on the same directory left: its handshake and a NCCL unique id, both scoped
// to its run id and (as before run ids existed) unscoped.
void LeaveStaleRun(const std::string& dir) {
  FileKvStore old(dir);
  ASSERT_OK(old.Set("run/hello/1", "0ldn0nce"));
  ASSERT_OK(old.Set("run/welcome/1/0ldn0nce", "0ldrun"));
  ASSERT_OK(old.Set("run/joined/0ldrun/1", "1"));
  ASSERT_OK(old.Set("run/0ldrun/gen/1/nccl/nccl_unique_id", "stale"));
  ASSERT_OK(old.Set("gen/1/nccl/nccl_unique_id", "stale"));
}

TEST(RunScopedKvTest, ALateRankZeroIsWaitedForAndTheStaleRunIsNeverRead) {
  test::ScratchDir dir("edl-rdzv");
  LeaveStaleRun(dir.path());
  // Rank 1 starts first and waits for the unique id; the stale one must not satisfy it.
  auto r1 = Rank(dir.path(), 1, 2);
  std::string got;
  Status wait;
  std::thread waiter([&] { wait = r1->Wait("gen/1/nccl/nccl_unique_id", kBound, &got); });
  // Observable: rank 1 said hello with a fresh nonce (it replaced the stale one).
  FileKvStore raw(dir.path());
  std::string hello = "0ldn0nce";
  const auto deadline = std::chrono::steady_clock::now() + kBound;
  while (hello == "0ldn0nce" && std::chrono::steady_clock::now() < deadline) {
    (void)raw.Wait("run/hello/1", milliseconds(100), &hello);  // Timeout until it is written
    std::this_thread::yield();
  }
  EXPECT_NE(hello, "0ldn0nce");
  auto r0 = Rank(dir.path(), 0, 2);
  ASSERT_OK(r0->Set("gen/1/nccl/nccl_unique_id", "fresh"));
  waiter.join();
  ASSERT_OK(wait);
  EXPECT_EQ(got, "fresh");
  // Both ranks see the same keys from now on, in both directions.
  ASSERT_OK(r1->Set("gen/1/gloo/addr/1", "10.0.0.2:4000"));
  ASSERT_OK(r0->Wait("gen/1/gloo/addr/1", kBound, &got));
  EXPECT_EQ(got, "10.0.0.2:4000");
}

TEST(RunScopedKvTest, TwoRunsInARowOnOneDirectoryNeverMix) {
  test::ScratchDir dir("edl-rdzv");
  for (const std::string run : {"first", "second"}) {
    auto r0 = Rank(dir.path(), 0, 3);
    auto r1 = Rank(dir.path(), 1, 3);
    auto r2 = Rank(dir.path(), 2, 3);
    std::string got1, got2;
    Status s1, s2;
    std::thread t1([&] { s1 = r1->Wait("gen/1/nccl/nccl_unique_id", kBound, &got1); });
    std::thread t2([&] { s2 = r2->Wait("gen/1/nccl/nccl_unique_id", kBound, &got2); });
    ASSERT_OK(r0->Set("gen/1/nccl/nccl_unique_id", run));
    t1.join();
    t2.join();
    ASSERT_OK(s1);
    ASSERT_OK(s2);
    EXPECT_EQ(got1, run);
    EXPECT_EQ(got2, run);
    // A key only the earlier run wrote is not there for this one.
    if (run == "second") {
      EXPECT_TRUE(r1->Get("only/first", &got1).IsNotFound());
    } else {
      ASSERT_OK(r0->Set("only/first", "x"));
    }
  }
}

TEST(RunScopedKvTest, StaticConnectScopesTheRendezvousToTheRun) {
  test::ScratchDir dir("edl-rdzv");
  LeaveStaleRun(dir.path());
  EnvContract e;
  e.has_world = true;
  e.world_size = 2;
  e.rendezvous_dir = dir.path();
  e.rank = 0;
  auto m0 = Connect(PlanRun(e));
  e.rank = 1;
  auto m1 = Connect(PlanRun(e));
  ASSERT_OK(m0.status());
  ASSERT_OK(m1.status());
  ASSERT_OK(m0.value()->kv()->Set("gen/1/nccl/nccl_unique_id", "fresh"));
  std::string got;
  ASSERT_OK(m1.value()->kv()->Wait("gen/1/nccl/nccl_unique_id", kBound, &got));
  EXPECT_EQ(got, "fresh");
}

TEST(RunScopedKvTest, NoRankZeroIsATimeoutThatSaysWhatToCheck) {
  test::ScratchDir dir("edl-rdzv");
  LeaveStaleRun(dir.path());
  auto r1 = Rank(dir.path(), 1, 2, milliseconds(300));
  std::string got;
  const Status s = r1->Wait("gen/1/nccl/nccl_unique_id", milliseconds(300), &got);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.message().find("MASTER_PORT"), std::string::npos) << s.ToString();
  EXPECT_TRUE(r1->Set("k", "v").IsTimeout());
}

TEST(RunScopedKvTest, AWorldOfOneNeedsNoHandshake) {
  test::ScratchDir dir("edl-rdzv");
  auto r0 = Rank(dir.path(), 0, 1);
  ASSERT_OK(r0->Set("k", "v"));
  std::string got;
  ASSERT_OK(r0->Get("k", &got));
  EXPECT_EQ(got, "v");
  FileKvStore raw(dir.path());
  EXPECT_TRUE(raw.Get("k", &got).IsNotFound()) << "keys must be scoped to the run";
}

}  // namespace
}  // namespace edl::runtime
