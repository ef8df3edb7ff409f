#include "tools/sched_sim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/testutil.h"

namespace edl::schedsim {
namespace {

TraceJob Job(const std::string& name, double arrival_s, int requested, int min, int max,
             double duration_s, bool elastic = true, int priority = 1) {
  TraceJob j;
  j.name = name;
  j.arrival_us = static_cast<int64_t>(arrival_s * 1e6);
  j.requested = requested;
  j.min = min;
  j.max = max;
  j.elastic = elastic;
  j.priority = priority;
  j.duration_s = duration_s;
  return j;
}

SimOptions Tiny(Variant v) {
  SimOptions o;
  o.variant = v;
  o.nodes = 4;
  o.slots_per_node = 4;
  o.min_change_interval_us = 10'000'000;
  return o;
}

TEST(SchedSimTest, EveryJobOfATinyTraceFinishesWithinTheSlotsInEveryVariant) {
  TraceOptions t;
  t.seed = 7;
  t.jobs = 30;
  t.mean_interarrival_s = 20;
  t.max_trainers = 16;
  const auto trace = GenerateTrace(t);
  ASSERT_EQ(trace.size(), 30u);
  for (Variant v : {Variant::kStatic, Variant::kStaticEasy, Variant::kElastic, Variant::kFull}) {
    SCOPED_TRACE(VariantName(v));
    SimResult r;
    // Simulate checks the policy's invariants and the slot count after every step itself.
    ASSERT_OK(Simulate(trace, Tiny(v), &r));
    ASSERT_EQ(r.jobs.size(), trace.size());
    for (size_t i = 0; i < trace.size(); ++i) {
      EXPECT_GE(r.jobs[i].start_us, trace[i].arrival_us) << trace[i].name;
      EXPECT_GT(r.jobs[i].finish_us, r.jobs[i].start_us) << trace[i].name;
      if (v == Variant::kStatic || v == Variant::kStaticEasy || !trace[i].elastic) {
        EXPECT_EQ(r.jobs[i].resizes, 0) << trace[i].name;
      }
    }
    EXPECT_LE(r.max_used_slots, 16);
    EXPECT_GT(r.max_used_slots, 0);
    EXPECT_GT(r.utilisation, 0);
    EXPECT_LE(r.utilisation, 1.0);
    if (v == Variant::kStatic || v == Variant::kStaticEasy) {
      EXPECT_EQ(r.resizes, 0);
    }
  }
}

TEST(SchedSimTest, ProgressFollowsTheThroughputModel) {
  // One job alone: static runs it at its requested 2; elastic starts it at its share, max 4.
  const std::vector<TraceJob> trace = {Job("a", 0, 2, 1, 4, 100)};
  SimResult r;
  ASSERT_OK(Simulate(trace, Tiny(Variant::kStatic), &r));
  EXPECT_NEAR(r.jobs[0].finish_us * 1e-6, 30 + 100, 1e-3);  // start-up, then the duration
  ASSERT_OK(Simulate(trace, Tiny(Variant::kFull), &r));
  // Work 100 * 2^0.9 at 4^0.9 per second.
  EXPECT_NEAR(r.jobs[0].finish_us * 1e-6, 30 + 100 * std::pow(0.5, 0.9), 1e-3);
  EXPECT_EQ(r.jobs[0].resizes, 0);
}

TEST(SchedSimTest, AResizeCostsTheReformTime) {
  // b arrives while a holds all 16 slots: a shrinks to make room (one resize, 30 s without
  // progress), and grows back when b finishes (another).
  const std::vector<TraceJob> trace = {Job("a", 0, 8, 4, 16, 1000), Job("b", 100, 4, 4, 4, 50)};
  SimOptions o = Tiny(Variant::kFull);
  o.min_change_interval_us = 0;
  SimResult r;
  ASSERT_OK(Simulate(trace, o, &r));
  EXPECT_EQ(r.jobs[0].resizes, 2);
  EXPECT_EQ(r.jobs[1].start_us, 100'000'000);
  const double speed16 = std::pow(16, 0.9), speed12 = std::pow(12, 0.9);
  const double work = 1000 * std::pow(8, 0.9);
  // a: 70 s at 16 (after its 30 s start), 30 s stalled, then at 12 until b ends at 100+30+50 = 180,
  // 30 s stalled, then at 16.
  const double done = 70 * speed16 + 50 * speed12;
  const double expect = 210 + (work - done) / speed16;
  EXPECT_NEAR(r.jobs[0].finish_us * 1e-6, expect, 1e-3);
}

// EASY backfill on 16 slots: a holds 12 until 30 + 100 s; b (16) waits for it at the head and
// reserves t = 130 s. c (4 slots) ends by then (30 + 50 s from t = 20): it starts at once; d (4
// slots, long) would hold slots b needs at its reservation: it waits for b. FIFO (static) starts
// neither before b.
TEST(SchedSimTest, EasyBackfillStartsOnlyJobsThatDoNotDelayTheHead) {
  const std::vector<TraceJob> trace = {
      Job("a", 0, 12, 12, 12, 100, false), Job("b", 10, 16, 16, 16, 100, false),
      Job("c", 20, 4, 4, 4, 50, false), Job("d", 20, 4, 4, 4, 1000, false)};
  SimResult easy, fifo;
  ASSERT_OK(Simulate(trace, Tiny(Variant::kStaticEasy), &easy));
  ASSERT_OK(Simulate(trace, Tiny(Variant::kStatic), &fifo));
  EXPECT_EQ(easy.jobs[0].finish_us, 130'000'000);
  EXPECT_EQ(easy.jobs[2].start_us, 20'000'000) << "c fits and ends by b's reservation";
  EXPECT_EQ(easy.jobs[1].start_us, 130'000'000) << "b starts at its reservation";
  EXPECT_EQ(easy.jobs[3].start_us, 260'000'000) << "d waits for b";
  EXPECT_EQ(fifo.jobs[1].start_us, 130'000'000);
  EXPECT_GE(fifo.jobs[2].start_us, 130'000'000) << "FIFO: c queues behind b";
  EXPECT_LT(easy.mean_pending_s, fifo.mean_pending_s);
  EXPECT_EQ(easy.max_used_slots, 16);
}

TEST(SchedSimTest, AJobLargerThanTheClusterIsReportedNotHung) {
  const std::vector<TraceJob> trace = {Job("huge", 0, 32, 32, 32, 10, /*elastic=*/false)};
  SimResult r;
  const Status s = Simulate(trace, Tiny(Variant::kStatic), &r);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("can never run"), std::string::npos) << s.ToString();
}

TEST(SchedSimTest, TraceIsAFunctionOfTheSeed) {
  TraceOptions t;
  const auto a = GenerateTrace(t);
  const auto b = GenerateTrace(t);
  ASSERT_EQ(a.size(), 200u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_us, b[i].arrival_us);
    EXPECT_EQ(a[i].requested, b[i].requested);
    EXPECT_EQ(a[i].duration_s, b[i].duration_s);
    EXPECT_LE(a[i].min, a[i].requested);
    EXPECT_GE(a[i].max, a[i].requested);
    EXPECT_GE(a[i].duration_s, 120);
    EXPECT_LE(a[i].duration_s, 86400);
  }
  t.seed = 14;
  EXPECT_NE(GenerateTrace(t)[1].arrival_us, a[1].arrival_us);
}

}  // namespace
}  // namespace edl::schedsim
