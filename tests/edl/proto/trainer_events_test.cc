// Trainer events decode once, at the edge, into typed bodies (edl/proto/trainer_events.h): every
// kind the server reads, with strict types and bounded strings; unknown kinds stay opaque; an
// invalid object is Malformed naming the field, and never fails the frame that carries it.
#include "edl/proto/trainer_events.h"

#include <string>

#include <gtest/gtest.h>

#include "edl/proto/messages.h"
#include "tests/testutil.h"

namespace edl::proto {
namespace {

using nlohmann::json;

// The body's T (a copy), or a default T and a test failure.
template <typename T>
T As(const TrainerEventBody& b) {
  EXPECT_TRUE(std::holds_alternative<T>(b)) << "holds alternative " << b.index();
  const T* p = std::get_if<T>(&b);
  return p != nullptr ? *p : T{};
}
std::string WhyMalformed(const json& e) {
  const TrainerEventBody b = DecodeTrainerEvent(e);
  const auto* m = std::get_if<ev::Malformed>(&b);
  return m == nullptr ? "" : m->why.message();
}

TEST(TrainerEventsTest, EveryKindTheServerReadsDecodesTyped) {
  EXPECT_EQ(
      As<ev::Config>(DecodeTrainerEvent({{"event", "config"}, {"fingerprint", "a=1"}})).fingerprint,
      "a=1");
  EXPECT_EQ(As<ev::JoinerFirstStep>(
                DecodeTrainerEvent({{"event", "joiner_first_step"}, {"generation", 4}}))
                .generation,
            4);
  const auto rf = As<ev::ReformFailed>(
      DecodeTrainerEvent({{"event", "reform_failed"}, {"generation", 3}, {"error", "x"}}));
  EXPECT_EQ(rf.generation, 3);
  EXPECT_EQ(rf.error, "x");
  EXPECT_EQ(As<ev::CommFailed>(DecodeTrainerEvent({{"event", "comm_failed"}, {"generation", 9}}))
                .generation,
            9);
  const auto saved = As<ev::CheckpointSaved>(DecodeTrainerEvent(
      {{"event", "checkpoint_saved"}, {"ok", true}, {"saves", 2}, {"seconds", 0.5}}));
  EXPECT_EQ(saved.saves, 2);
  EXPECT_DOUBLE_EQ(saved.seconds, 0.5);
  const auto cf = As<ev::CheckpointFailed>(DecodeTrainerEvent(
      {{"event", "checkpoint_failed"}, {"step", -1}, {"refused", true}, {"error", "fenced"}}));
  EXPECT_EQ(cf.step, -1);
  EXPECT_TRUE(cf.refused);
  EXPECT_EQ(cf.error, "fenced");
  const auto stop = As<ev::StopCheckpoint>(DecodeTrainerEvent({{"event", "stop_checkpoint"},
                                                               {"generation", 2},
                                                               {"step", 8},
                                                               {"ok", false},
                                                               {"error", "full"}}));
  EXPECT_FALSE(stop.ok);
  EXPECT_EQ(stop.error, "full");
  const auto stall = As<ev::Stall>(DecodeTrainerEvent({{"event", "stall"},
                                                       {"world_before", 4},
                                                       {"world_after", 3},
                                                       {"failure", true},
                                                       {"stall_s", 0.25}}));
  EXPECT_EQ(stall.world_before, 4);
  EXPECT_EQ(stall.world_after, 3);
  EXPECT_TRUE(stall.failure);
}

TEST(TrainerEventsTest, OtherKindsStayOpaque) {
  EXPECT_EQ(As<ev::Other>(DecodeTrainerEvent({{"event", "sync"}, {"state_hash", 5}})).kind, "sync");
  EXPECT_EQ(As<ev::Other>(DecodeTrainerEvent({{"event", "my_own_event"}})).kind, "my_own_event");
}

TEST(TrainerEventsTest, AnInvalidEventIsMalformedNamingTheField) {
  EXPECT_NE(WhyMalformed(json::array()).find("not a JSON object"), std::string::npos);
  EXPECT_NE(WhyMalformed({{"event", 5}}).find("field 'event' is not a string"), std::string::npos);
  EXPECT_NE(WhyMalformed({{"x", 1}}).find("field 'event' is missing"), std::string::npos);
  EXPECT_NE(WhyMalformed({{"event", "not a name!"}}).find("not a valid name"), std::string::npos);
  EXPECT_NE(WhyMalformed({{"event", "checkpoint_failed"}, {"step", "x"}, {"error", "e"}})
                .find("trainer event 'checkpoint_failed' field 'step' is not an integer"),
            std::string::npos);
  EXPECT_NE(
      WhyMalformed({{"event", "stall"}, {"world_before", 1}, {"world_after", 2}, {"stall_s", -1}})
          .find("'stall_s' is negative"),
      std::string::npos);
  EXPECT_NE(WhyMalformed({{"event", "stall"},
                          {"world_before", 1},
                          {"world_after", int64_t{1} << 40},
                          {"stall_s", 1}})
                .find("'world_after' is out of range"),
            std::string::npos);
  EXPECT_NE(WhyMalformed({{"event", "comm_failed"}}).find("'generation' is missing"),
            std::string::npos);
  // Bounded strings: an error or fingerprint longer than the bound is refused, not cut.
  EXPECT_NE(WhyMalformed({{"event", "reform_failed"},
                          {"generation", 1},
                          {"error", std::string(kMaxEventErrorBytes + 1, 'e')}})
                .find("longer than"),
            std::string::npos);
  EXPECT_NE(WhyMalformed(
                {{"event", "config"}, {"fingerprint", std::string(kMaxFingerprintBytes + 1, 'f')}})
                .find("longer than"),
            std::string::npos);
}

TEST(TrainerEventsTest, AMalformedEventDoesNotFailItsFrame) {
  Event e;
  ASSERT_OK(
      e.DecodeFrom({{"type", "event"}, {"trainer_id", "n1-s0-1"}, {"event", {{"event", 5}}}}));
  EXPECT_TRUE(std::holds_alternative<ev::Malformed>(e.body));
  EXPECT_EQ(e.event, json({{"event", 5}}));  // kept as sent, read by nobody
  // The frame itself must still be an object with an object "event".
  EXPECT_FALSE(e.DecodeFrom({{"type", "event"}, {"event", 5}}).ok());
}

}  // namespace
}  // namespace edl::proto
