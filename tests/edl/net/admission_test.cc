#include "edl/net/admission.h"

#include <gtest/gtest.h>

namespace edl::net {
namespace {

TEST(AdmissionControlTest, PerSourceBoundEvictsThatSourcesOldest) {
  AdmissionControl ac({/*max_total=*/10, /*max_per_source=*/3});
  EXPECT_EQ(ac.Admit(1, "a"), 0u);
  EXPECT_EQ(ac.Admit(2, "b"), 0u);
  EXPECT_EQ(ac.Admit(3, "a"), 0u);
  EXPECT_EQ(ac.Admit(4, "a"), 0u);
  EXPECT_EQ(ac.pending_from("a"), 3u);
  // A fourth from "a" pushes out a's oldest, never b's.
  EXPECT_EQ(ac.Admit(5, "a"), 1u);
  EXPECT_EQ(ac.Admit(6, "a"), 3u);
  EXPECT_EQ(ac.pending_from("a"), 3u);
  EXPECT_EQ(ac.pending_from("b"), 1u);
  EXPECT_EQ(ac.pending(), 4u);
}

TEST(AdmissionControlTest, TotalBoundEvictsTheOldestAndRemoveFreesRoom) {
  AdmissionControl ac({/*max_total=*/3, /*max_per_source=*/3});
  EXPECT_EQ(ac.Admit(1, "a"), 0u);
  EXPECT_EQ(ac.Admit(2, "b"), 0u);
  EXPECT_EQ(ac.Admit(3, "c"), 0u);
  EXPECT_EQ(ac.Admit(4, "d"), 1u);
  ac.Remove(2);  // authenticated: no longer counts
  ac.Remove(2);  // idempotent
  ac.Remove(99);
  EXPECT_EQ(ac.Admit(5, "e"), 0u);
  EXPECT_EQ(ac.pending(), 3u);
  EXPECT_EQ(ac.pending_from("a"), 0u);
  EXPECT_EQ(ac.Admit(6, "f"), 3u);
}

TEST(AdmissionControlTest, DefaultsLeaveMostFilesToAuthenticatedPeers) {
  const auto l = AdmissionControl::FromFileLimit();
  EXPECT_GE(l.max_total, 8u);
  EXPECT_LE(l.max_total, 128u);
  EXPECT_GE(l.max_per_source, 4u);
  EXPECT_LE(l.max_per_source, l.max_total);
}

TEST(LogLimiterTest, BurstThenSuppressedCountOnTheNextWindow) {
  LogLimiter lim(2, std::chrono::seconds(10));
  const auto t0 = LogLimiter::Clock::time_point() + std::chrono::hours(1);
  size_t suppressed = 99;
  EXPECT_TRUE(lim.Allow(t0, &suppressed));
  EXPECT_EQ(suppressed, 0u);
  EXPECT_TRUE(lim.Allow(t0, &suppressed));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(lim.Allow(t0 + std::chrono::seconds(1), &suppressed));
  EXPECT_TRUE(lim.Allow(t0 + std::chrono::seconds(11), &suppressed));
  EXPECT_EQ(suppressed, 1000u);
  EXPECT_TRUE(lim.Allow(t0 + std::chrono::seconds(11), &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace edl::net
