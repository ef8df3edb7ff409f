// What a job that cannot train says about itself (issue "No silent failures"): real `edl server`,
// `edl client`s and stand-in trainers (tests/integration/stand_in_trainer.cc), read through
// `edl ctl` and the events log.
//  - trainers that keep failing the same way mark the job `failing`, with their last log line;
//  - a joiner whose configuration differs from the job's is refused naming the differing field,
//    and its node gets no joiner until its client re-attaches; the job goes on without it;
//  - `edl ctl stop` exits 1 naming the error when rank 0's final checkpoint failed.
#include <gtest/gtest.h>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::Proc;
using itest::Slurp;
using itest::WaitFor;

class JobHealthTest : public itest::ControlPlaneHarness {
 protected:
  json Status() {
    std::string out;
    EXPECT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
    const size_t brace = out.find('{');
    const json j = json::parse(brace == std::string::npos ? "" : out.substr(brace), nullptr, false);
    return j.is_object() ? j : json::object();
  }
  bool HasEvent(const std::string& type) {
    for (const json& e : Events()) {
      if (e.value("type", "") == type) return true;
    }
    return false;
  }
};

TEST_F(JobHealthTest, TrainersThatKeepFailingAlikeMarkTheJobFailingWithTheirLastLogLine) {
  StartServer("", 1, {"--backoff_min_s", "0", "--backoff_max_s", "0"});
  auto client = StartClient("n1", "inplace", "", {},
                            {{"STANDIN_FAIL_WITH", "error: cannot open /data/train.bin"}});
  json st;
  ASSERT_TRUE(WaitFor([&] { return (st = Status()).contains("failing"); }, milliseconds(60000)))
      << Diagnostics();
  EXPECT_GE(st["failing"]["exits"].get<int>(), 3) << st.dump();
  EXPECT_EQ(st["failing"]["how"], "exit 3") << st.dump();
  EXPECT_EQ(st["failing"]["last_error"], "error: cannot open /data/train.bin") << st.dump();
  EXPECT_TRUE(HasEvent("failing")) << Diagnostics();
  std::string out;
  ASSERT_EQ(Ctl({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("failing"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot open /data/train.bin"), std::string::npos) << out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(client->Wait(milliseconds(20000)), 0);
}

TEST_F(JobHealthTest, AJoinerWithAnotherConfigurationIsRefusedNamingWhatDiffers) {
  StartServer("", 2, {"--backoff_min_s", "0", "--backoff_max_s", "0"});
  const std::string job_config = "model=standin:1;seed=1;train=60000;batch=64";
  auto c1 = StartClient("n1", "inplace", "", {}, {{"STANDIN_CONFIG", job_config}});
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 2; }, milliseconds(60000))) << Diagnostics();
  // A second node whose trainers were started with another data size (a client started from a
  // shell whose EDL_TRAINER_CMD differs): its joiners would break the ring.
  auto c2 = StartClient("n2", "inplace", "", {},
                        {{"STANDIN_CONFIG", "model=standin:1;seed=1;train=2048;batch=64"}});
  ASSERT_TRUE(WaitFor(
      [&] {
        return Slurp(dir_.Join("server.log")).find("node n2 registered") != std::string::npos;
      },
      milliseconds(30000)))
      << Diagnostics();
  std::string out;
  ASSERT_EQ(Ctl({"scale", "4"}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return HasEvent("joiner_refused"); }, milliseconds(60000)))
      << Diagnostics();
  std::string why;
  for (const json& e : Events()) {
    if (e.value("type", "") == "joiner_refused") why = e.value("why", "");
  }
  EXPECT_NE(why.find("train: the job's '60000', this trainer's '2048'"), std::string::npos) << why;
  EXPECT_EQ(why.find("batch"), std::string::npos) << "only the differing fields are named: " << why;
  // n2 gets no joiner meanwhile: the job stays at n1's two trainers, with no failure of n1's.
  const json st = Status();
  EXPECT_EQ(st["world_size"], 2) << st.dump();
  ASSERT_TRUE(st.contains("refused_nodes")) << st.dump();
  EXPECT_NE(st["refused_nodes"].value("n2", "").find("train"), std::string::npos) << st.dump();
  for (const json& g : Generations()) EXPECT_NE(g["world_size_after"], 4) << g.dump();
  ASSERT_EQ(Ctl({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("node n2 gets no joiner"), std::string::npos) << out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(20000)), 0);
}

TEST_F(JobHealthTest, StopExitsNonZeroWhenTheFinalCheckpointFailed) {
  StartServer("", 2);
  auto client = StartClient(
      "n1", "inplace", "", {},
      {{"STANDIN_FINAL_CHECKPOINT_ERROR", "this writer is stale: the store holds generation 9"}});
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 2; }, milliseconds(60000))) << Diagnostics();
  std::string out;
  EXPECT_EQ(Ctl({"stop"}, &out), 1) << out;
  EXPECT_NE(out.find("final checkpoint failed: this writer is stale"), std::string::npos) << out;
  EXPECT_EQ(server_->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(client->Wait(milliseconds(20000)), 0);
  bool recorded = false;
  for (const json& e : Events())
    recorded |=
        e.value("type", "") == "stop_complete" && e.value("final_checkpoint", "") == "failed";
  EXPECT_TRUE(recorded) << Diagnostics();
}

}  // namespace
}  // namespace edl
