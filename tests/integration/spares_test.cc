// Warm spares (docs/TRAINERS.md "Warm spares"): a real `edl server` and `edl client` whose stand-in
// trainers (tests/integration/stand_in_trainer.cc) record every spare, assignment and start with
// their pid. A killed trainer's replacement is the spare's process; a spare that fails or cannot
// wait costs the job nothing, and the replacement then starts cold.
#include <signal.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

class SparesTest : public itest::ControlPlaneHarness {
 protected:
  // The stand-ins' records of `event` (and, when given, of spare `spare`).
  std::vector<json> Records(const std::string& event, const std::string& spare = "") {
    std::vector<json> out;
    for (const json& r : itest::ReadLines(records_)) {
      if (r.value("event", "") == event && (spare.empty() || r.value("spare", "") == spare))
        out.push_back(r);
    }
    return out;
  }
  std::string ClientLog() { return itest::Slurp(dir_.Join("n1.log")); }
  int CountInClientLog(const std::string& text) {
    const std::string log = ClientLog();
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
    return n;
  }
  bool AnyFailure() {
    for (const json& g : Generations()) {
      if (g.value("failure", false)) return true;
    }
    return false;
  }
  // SIGKILLs one trainer of the first generation; its start record.
  json KillAFirstTrainer() {
    json victim;
    for (const json& r : Records("start")) {
      const std::string id = r["trainer_id"];
      if (r["generation"] == 1 && r.value("spare", "").empty() &&
          id.find("-spare-") == std::string::npos)
        victim = r;
    }
    EXPECT_TRUE(victim.is_object()) << Diagnostics();
    if (victim.is_object()) ::kill(victim["pid"].get<int>(), SIGKILL);
    return victim;
  }
  // Waits for the job to be back at 2 trainers after the kill, both through a KV round there.
  void WaitForGrowBackToTwo() {
    int64_t grown = 0;
    ASSERT_TRUE(itest::WaitFor(
        [&] {
          grown = FirstGeneration([](const json& g) {
            return g["reason"] == "grow_back" && g["world_size_after"] == 2;
          });
          return grown > 0;
        },
        milliseconds(60000)))
        << Diagnostics();
    ASSERT_TRUE(itest::WaitFor([&] { return KvRounds(grown) == 2; }, milliseconds(60000)))
        << Diagnostics();
  }
  void StopJob(std::unique_ptr<itest::Proc>* client) {
    std::string out;
    ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
    EXPECT_EQ(server_->Wait(milliseconds(15000)), 0);
    EXPECT_EQ((*client)->Wait(milliseconds(20000)), 0) << ClientLog();
  }
};

TEST_F(SparesTest, AKilledTrainerIsReplacedByTheWarmSpare) {
  StartServer("0 set 2\n", 2);
  if (HasFatalFailure()) return;
  auto client = StartClient("n1", "inplace");
  // The spare connected and waits (its spare_hello), after the two trainers trained.
  ASSERT_TRUE(itest::WaitFor(
      [&] { return CountInClientLog("spare n1-spare-1 of job itest is prepared") == 1; },
      milliseconds(60000)))
      << ClientLog() << Diagnostics();
  const std::vector<json> spare = Records("spare", "n1-spare-1");
  ASSERT_EQ(spare.size(), 1u) << Diagnostics();
  EXPECT_EQ(spare[0]["world_size"], 2) << "a spare warms up for the job's largest world";

  const json victim = KillAFirstTrainer();
  ASSERT_FALSE(HasFailure());
  // The replacement is the spare's process, started as a joiner under a new trainer id.
  std::vector<json> assigned;
  ASSERT_TRUE(itest::WaitFor([&] { return !(assigned = Records("start", "n1-spare-1")).empty(); },
                             milliseconds(60000)))
      << Diagnostics();
  EXPECT_EQ(assigned[0]["pid"], spare[0]["pid"]);
  EXPECT_NE(assigned[0]["trainer_id"], victim["trainer_id"]);
  EXPECT_TRUE(assigned[0]["joining"].get<bool>()) << assigned[0].dump();
  WaitForGrowBackToTwo();
  if (HasFatalFailure()) return;
  EXPECT_EQ(
      CountInClientLog("is spare n1-spare-1 (pid " + std::to_string(spare[0]["pid"].get<int>())), 1)
      << ClientLog();
  // No cold start: every start record after the first generation's is a spare's.
  for (const json& r : Records("start")) {
    if (r["generation"] != 1) {
      EXPECT_FALSE(r.value("spare", "").empty()) << r.dump();
    }
  }
  // The client keeps the next spare, which is released (exit 0) when the job stops: by the stop
  // generation or by the client's own shutdown, whichever comes first; both log the same line.
  ASSERT_TRUE(itest::WaitFor(
      [&] { return CountInClientLog("spare n1-spare-2 of job itest is prepared") == 1; },
      milliseconds(60000)))
      << ClientLog();
  StopJob(&client);
  EXPECT_EQ(Records("spare_released", "n1-spare-2").size(), 1u) << Diagnostics();
  EXPECT_EQ(CountInClientLog("spare n1-spare-2 released: exit 0"), 1) << ClientLog();
}

TEST_F(SparesTest, ASpareThatFailsCostsTheJobNothing) {
  StartServer("0 set 2\n", 2);
  if (HasFatalFailure()) return;
  auto client = StartClient("n1", "inplace", "", {},
                            {{"STANDIN_SPARE_FAIL_WITH", "spare cannot map its dataset"}});
  // Two spares fail, the second after a back-off; each says why, with its own last log line.
  ASSERT_TRUE(itest::WaitFor([&] { return CountInClientLog("ended before it was assigned") >= 2; },
                             milliseconds(60000)))
      << ClientLog();
  EXPECT_GE(CountInClientLog("its last log line: \"spare cannot map its dataset\""), 2)
      << ClientLog();
  EXPECT_EQ(CountInClientLog("2 spare failure(s) in a row, next spare in 2 s"), 1) << ClientLog();
  EXPECT_FALSE(AnyFailure()) << "a spare's failure is none of the job's" << Diagnostics();
  // A trainer's replacement then starts cold, and the job grows back.
  const json victim = KillAFirstTrainer();
  ASSERT_FALSE(HasFailure());
  WaitForGrowBackToTwo();
  if (HasFatalFailure()) return;
  int cold = 0;
  for (const json& r : Records("start"))
    cold += r["generation"] != 1 && r.value("spare", "").empty();
  EXPECT_EQ(cold, 1) << Diagnostics();
  StopJob(&client);
}

TEST_F(SparesTest, ACommandThatCannotWaitTurnsSparesOffAndCostsTheJobNothing) {
  StartServer("0 set 2\n", 2);
  if (HasFatalFailure()) return;
  auto client = StartClient("n1", "inplace", "", {}, {{"STANDIN_IGNORE_SPARE", "1"}});
  ASSERT_TRUE(itest::WaitFor([&] { return CountInClientLog("no more spares for job itest") == 1; },
                             milliseconds(60000)))
      << ClientLog();
  EXPECT_EQ(CountInClientLog("spare n1-spare-1 said trainer_hello"), 1) << ClientLog();
  EXPECT_FALSE(AnyFailure()) << Diagnostics();
  // Many client ticks later (a kill, a cold start and a grow-back), still no second spare.
  KillAFirstTrainer();
  ASSERT_FALSE(HasFailure());
  WaitForGrowBackToTwo();
  if (HasFatalFailure()) return;
  EXPECT_EQ(CountInClientLog("started spare "), 1) << ClientLog();
  StopJob(&client);
}

}  // namespace
}  // namespace edl
