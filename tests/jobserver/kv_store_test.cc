#include "jobserver/kv_store.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

TEST(KvStoreTest, SetGetWaitExpire) {
  KvStore kv;
  std::string v;
  EXPECT_TRUE(kv.Get("j/k", &v).IsNotFound());
  int woken = 0;
  std::string got;
  kv.Wait("j/k", 100, [&](const Status& s, const std::string& value) {
    EXPECT_OK(s);
    got = value;
    ++woken;
  });
  Status late;
  kv.Wait("j/other", 50, [&](const Status& s, const std::string&) { late = s; });
  EXPECT_EQ(kv.waiters(), 2u);
  kv.Expire(49);
  EXPECT_OK(late);
  kv.Expire(50);
  EXPECT_TRUE(late.IsTimeout());
  kv.Set("j/k", "v1");
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(got, "v1");
  ASSERT_OK(kv.Get("j/k", &v));
  EXPECT_EQ(v, "v1");
  kv.Wait("j/k", 0, [&](const Status& s, const std::string& value) { got = value + "!"; });
  EXPECT_EQ(got, "v1!");  // present: answered at once
  EXPECT_EQ(kv.waiters(), 0u);
}

TEST(KvStoreTest, GarbageCollectsOldGenerations) {
  KvStore kv;
  kv.Set("j/g1/nccl", "a");
  kv.Set("j/g4/nccl", "b");
  kv.Set("j/g5/x", "c");
  kv.Set("j/global", "d");
  kv.Set("j/gx/y", "e");
  EXPECT_EQ(kv.CollectGarbage(6), 1u);  // g1 < 6-2; g4 kept
  std::string v;
  EXPECT_TRUE(kv.Get("j/g1/nccl", &v).IsNotFound());
  EXPECT_OK(kv.Get("j/g4/nccl", &v));
  EXPECT_OK(kv.Get("j/global", &v));
  EXPECT_OK(kv.Get("j/gx/y", &v));
}

}  // namespace
}  // namespace edl::jobserver
