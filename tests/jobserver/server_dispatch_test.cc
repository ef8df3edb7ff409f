// A peer's mistyped message never stops the server (PROTOCOL.md "Trainer events", "Limits"):
// every field of every message a node's client or `edl ctl` sends, replaced by a value of each
// JSON type, removed or given twice, goes through a real Server's decode and dispatch
// (tests/fuzz/server_driver.h, without the connection's safety net) and the server keeps serving.
// A malformed trainer event is dropped and counted and its node stays connected; a correct one
// after it still counts. The deterministic twin of tests/fuzz/server_dispatch_fuzzer.cc.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "edl/proto/trainer_events.h"
#include "tests/fuzz/json_mutation.h"
#include "tests/fuzz/peer_messages.h"
#include "tests/fuzz/server_driver.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;

// The value of a /metrics counter line (its name and labels as printed), or -1.
double Counter(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}
const char kMalformed[] = "edl_server_frames_refused_total{reason=\"malformed_event\"}";

class ServerDispatchTest : public ::testing::Test {
 protected:
  ServerDispatchTest() : driver_(dir_.path()) {}
  void SetUp() override {
    ASSERT_OK(driver_.start_status());
    ASSERT_EQ(driver_.NodeTrainers().size(), 2u)
        << "the job did not place its 2 trainers on the node";
  }
  std::string Trainer() {
    const std::vector<std::string> t = driver_.NodeTrainers();
    return t.empty() ? "n1-s0-1" : t.front();
  }
  std::string EventText(const json& body) {
    proto::Event e;
    e.trainer_id = Trainer();
    e.event = body;
    return e.Encoded().dump();
  }

  test::ScratchDir dir_{"edl-dispatch"};
  ServerDriver driver_;
};

TEST_F(ServerDispatchTest, TheEventsThatStoppedTheServerAreDroppedAndCounted) {
  // Each of these made `edl server` exit 1 ("type must be string, but is number").
  const std::vector<json> bad = {
      {{"event", 5}},
      {{"event", "checkpoint_failed"}, {"step", "x"}, {"error", "e"}},
      {{"event", "checkpoint_failed"}, {"step", 1}, {"refused", "yes"}, {"error", "e"}},
      {{"event", "checkpoint_failed"}, {"step", 1}, {"error", 7}},
      {{"event", "stop_checkpoint"}, {"generation", 1}, {"step", 1}, {"ok", "no"}},
      {{"event", "stop_checkpoint"},
       {"generation", 1},
       {"step", 1},
       {"ok", false},
       {"error", json::array()}},
      {{"event", "reform_failed"}, {"generation", "2"}},
      {{"event", "config"}, {"fingerprint", 3}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    ASSERT_TRUE(driver_.FromNode(EventText(bad[i]))) << bad[i];
    EXPECT_TRUE(driver_.serving()) << bad[i];
    EXPECT_TRUE(driver_.node_connected())
        << "a malformed event closed its node's connection: " << bad[i];
    EXPECT_EQ(Counter(driver_.Metrics(), kMalformed), static_cast<double>(i + 1)) << bad[i];
  }
  // The node and its trainers carry on: a correct event of the same trainer still counts.
  ASSERT_TRUE(driver_.FromNode(EventText(
      {{"event", "checkpoint_failed"}, {"step", 10}, {"refused", true}, {"error", "fenced"}})));
  const json status = driver_.StatusBody();
  ASSERT_TRUE(status.contains("checkpoint_failures")) << status.dump();
  EXPECT_EQ(status["checkpoint_failures"]["failed"], 1) << status.dump();
  EXPECT_EQ(status["checkpoint_failures"]["refused"], 1) << status.dump();
  EXPECT_EQ(status["checkpoint_failures"]["last_step"], 10) << status.dump();
  EXPECT_EQ(Counter(driver_.Metrics(), kMalformed), static_cast<double>(bad.size()));
}

TEST_F(ServerDispatchTest, EveryFieldOfEveryTrainerEventMistypedIsDroppedAndTheNodeStays) {
  size_t dropped = 0;
  for (const json& body : fuzz::TrainerEventBodies(driver_.generation())) {
    const std::string kind = body["event"];
    proto::TrainerEventKind k;
    const bool typed = proto::kTrainerEventKindNames.Parse(kind, &k);
    for (auto it = body.begin(); it != body.end(); ++it) {
      for (const json& v : fuzz::TypeVariants()) {
        const json mutated = fuzz::Replaced(body, json::json_pointer("/" + it.key()), v);
        const bool malformed =
            std::holds_alternative<proto::ev::Malformed>(proto::DecodeTrainerEvent(mutated));
        // What the decoder refuses is exactly what the server drops (and counts); a typed kind
        // refuses a mistyped field it reads.
        const double before = Counter(driver_.Metrics(), kMalformed);
        ASSERT_TRUE(driver_.FromNode(EventText(mutated)));
        ASSERT_TRUE(driver_.serving()) << mutated.dump().substr(0, 200);
        ASSERT_TRUE(driver_.node_connected()) << mutated.dump().substr(0, 200);
        EXPECT_EQ(Counter(driver_.Metrics(), kMalformed), before + (malformed ? 1 : 0))
            << mutated.dump().substr(0, 200);
        dropped += malformed;
      }
    }
    if (typed) {  // a missing field the server reads is refused too
      ASSERT_TRUE(driver_.FromNode(EventText({{"event", kind}})));
      EXPECT_TRUE(driver_.node_connected());
    }
  }
  EXPECT_GT(dropped, 100u);
}

// Every client frame and ctl request: each field of each replaced by each JSON type, removed, or
// given twice in the text; then the server still answers status and takes a correct report.
TEST_F(ServerDispatchTest, EveryMistypedFieldOfEveryMessageLeavesTheServerServing) {
  size_t fed = 0, tried = 0;
  auto feed = [&](bool ctl, const std::string& text) {
    const bool decoded = ctl ? driver_.FromCtl(text) : driver_.FromNode(text);
    fed += decoded;
    ++tried;
    ASSERT_TRUE(driver_.serving()) << text.substr(0, 300);
  };
  for (int ctl = 0; ctl < 2; ++ctl) {
    const std::vector<json> seeds =
        ctl ? fuzz::CtlMessages() : fuzz::NodeMessages(Trainer(), driver_.generation());
    for (const json& seed : seeds) {
      for (const json::json_pointer& p : fuzz::Paths(seed)) {
        for (const json& v : fuzz::TypeVariants()) {
          feed(ctl,
               fuzz::Replaced(seed, p, v).dump(-1, ' ', false, json::error_handler_t::replace));
          if (p.parent_pointer().empty()) feed(ctl, fuzz::WithDuplicate(seed, p.back(), v));
        }
        feed(ctl, fuzz::Removed(seed, p).dump());
      }
    }
  }
  // Most mutations leave "type" alone and reach the server (the others the frame layer refuses).
  EXPECT_GT(fed, tried / 2) << fed << " of " << tried;
  // Still a working control plane: the node attaches again (a refused frame closed it) and its
  // heartbeat keeps it connected; status answers.
  ASSERT_TRUE(driver_.FromNode(proto::Heartbeat().Encoded().dump()));
  EXPECT_TRUE(driver_.node_connected());
  ASSERT_TRUE(driver_.FromCtl(fuzz::CtlMessages().front().dump()));
  EXPECT_TRUE(driver_.serving());
  EXPECT_TRUE(driver_.StatusBody().is_object());
}

}  // namespace
}  // namespace edl::jobserver
