#include "jobserver/kv_store.h"

#include <gtest/gtest.h>

#include "edl/proto/rendezvous_key.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

TEST(KvStoreTest, SetGetWaitExpire) {
  KvStore kv;
  std::string v;
  EXPECT_TRUE(kv.Get("j/k", &v).IsNotFound());
  int woken = 0;
  std::string got;
  ASSERT_OK(kv.Wait("j/k", 100, 1, [&](const Status& s, const std::string& value) {
    EXPECT_OK(s);
    got = value;
    ++woken;
  }));
  Status late;
  ASSERT_OK(kv.Wait("j/other", 50, 1, [&](const Status& s, const std::string&) { late = s; }));
  EXPECT_EQ(kv.waiters(), 2u);
  kv.Expire(49);
  EXPECT_OK(late);
  kv.Expire(50);
  EXPECT_TRUE(late.IsTimeout());
  ASSERT_OK(kv.Set("j/k", "v1"));
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(got, "v1");
  ASSERT_OK(kv.Get("j/k", &v));
  EXPECT_EQ(v, "v1");
  ASSERT_OK(
      kv.Wait("j/k", 0, 1, [&](const Status& s, const std::string& value) { got = value + "!"; }));
  EXPECT_EQ(got, "v1!");  // present: answered at once
  EXPECT_EQ(kv.waiters(), 0u);
}

// The keys the runtime really writes (ElasticTrainer: RendezvousPrefix(generation, backend)),
// scoped by job as the server stores them.
std::string RuntimeKey(int64_t generation, const std::string& rest) {
  return "j/" + proto::RendezvousPrefix(generation, "gloo") + "/" + rest;
}

TEST(KvStoreTest, GarbageCollectsTheRuntimesKeysOfOldGenerations) {
  EXPECT_EQ(RuntimeKey(1, "rank_0"), "j/gen/1/gloo/rank_0");  // the shape on the wire
  KvStore kv;
  ASSERT_OK(kv.Set(RuntimeKey(1, "rank_0"), "a"));
  ASSERT_OK(kv.Set(RuntimeKey(4, "rank_0"), "b"));
  ASSERT_OK(kv.Set(RuntimeKey(5, "nccl_unique_id"), "c"));
  ASSERT_OK(kv.Set("j/global", "d"));
  ASSERT_OK(kv.Set("j/gen/x/y", "e"));
  ASSERT_OK(kv.Set("j/gen/2", "f"));    // no '/' after the number: not a generation's key
  EXPECT_EQ(kv.CollectGarbage(6), 1u);  // gen 1 < 6-2; gen 4 kept
  std::string v;
  EXPECT_TRUE(kv.Get(RuntimeKey(1, "rank_0"), &v).IsNotFound());
  EXPECT_OK(kv.Get(RuntimeKey(4, "rank_0"), &v));
  EXPECT_OK(kv.Get("j/global", &v));
  EXPECT_OK(kv.Get("j/gen/x/y", &v));
  EXPECT_OK(kv.Get("j/gen/2", &v));
}

TEST(KvStoreTest, StaysBoundedOverAThousandGenerations) {
  KvStore kv;
  constexpr int kWorld = 8;
  const std::string addr(200, 'x');  // about a Gloo pair address, hex-encoded
  size_t most_keys = 0, most_bytes = 0;
  for (int64_t g = 1; g <= 1000; ++g) {
    for (int r = 0; r < kWorld; ++r)
      ASSERT_OK(kv.Set(RuntimeKey(g, "rank_" + std::to_string(r)), addr));
    kv.CollectGarbage(g);  // the server does this on every commit
    most_keys = std::max(most_keys, kv.size());
    most_bytes = std::max(most_bytes, kv.bytes());
  }
  // Generations g-2 .. g stay: 3 generations' keys, whatever the number of generations.
  EXPECT_EQ(kv.size(), 3u * kWorld);
  EXPECT_LE(most_keys, 3u * kWorld);
  EXPECT_LE(most_bytes, 3u * kWorld * (addr.size() + RuntimeKey(1000, "rank_0").size()));
}

TEST(KvStoreTest, RefusesWhatPassesItsLimits) {
  KvLimits l;
  l.max_value_bytes = 10;
  l.max_keys = 3;
  l.max_total_bytes = 40;
  l.max_waiters_per_owner = 2;
  l.max_waiters = 3;
  KvStore kv(l);
  Status s = kv.Set("j/a", std::string(11, 'v'));
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("--kv_max_value_bytes"), std::string::npos) << s.ToString();
  ASSERT_OK(kv.Set("j/a", std::string(10, 'v')));
  ASSERT_OK(kv.Set("j/b", std::string(10, 'v')));
  EXPECT_EQ(kv.bytes(), 26u);
  s = kv.Set("j/c", std::string(10, 'v'));  // 26 + 13 = 39 fits; 40 would not
  ASSERT_OK(s);
  s = kv.Set("j/d", "v");
  EXPECT_NE(s.message().find("--kv_max_keys"), std::string::npos) << s.ToString();
  s = kv.Set("j/c", std::string(10, 'w'));  // a replacement counts its old bytes back
  ASSERT_OK(s);
  EXPECT_EQ(kv.bytes(), 39u);
  ASSERT_OK(kv.Set("j/c", "x"));
  EXPECT_EQ(kv.bytes(), 30u);
  s = kv.Set("j/b", std::string(10, 'v') + "");
  ASSERT_OK(s);
  KvStore small([] {
    KvLimits m;
    m.max_total_bytes = 10;
    return m;
  }());
  s = small.Set("j/k", std::string(8, 'v'));
  EXPECT_NE(s.message().find("--kv_max_bytes"), std::string::npos) << s.ToString();
  EXPECT_EQ(small.size(), 0u);

  // Waiters: per owner, then in all; refused ones get no reply.
  int replies = 0;
  auto count = [&](const Status&, const std::string&) { ++replies; };
  ASSERT_OK(kv.Wait("j/w1", 1000, 7, count));
  ASSERT_OK(kv.Wait("j/w2", 1000, 7, count));
  s = kv.Wait("j/w3", 1000, 7, count);
  EXPECT_NE(s.message().find("--kv_max_waiters_per_connection"), std::string::npos) << s.ToString();
  ASSERT_OK(kv.Wait("j/w3", 1000, 8, count));
  s = kv.Wait("j/w4", 1000, 9, count);
  EXPECT_NE(s.message().find("--kv_max_waiters"), std::string::npos) << s.ToString();
  EXPECT_EQ(kv.waiters(), 3u);
  // A closed connection's waits go with it, unanswered; its quota is free again.
  EXPECT_EQ(kv.CancelOwner(7), 2u);
  EXPECT_EQ(kv.waiters(), 1u);
  ASSERT_OK(kv.Wait("j/w5", 1000, 9, count));
  kv.Expire(1000);
  EXPECT_EQ(replies, 2);  // owner 8's and owner 9's, as Timeout
  EXPECT_EQ(kv.waiters(), 0u);
  ASSERT_OK(kv.Wait("j/w1", 2000, 7, count));
  ASSERT_OK(kv.Wait("j/w1", 2000, 7, count));
}

}  // namespace
}  // namespace edl::jobserver
