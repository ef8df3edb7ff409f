// The env contract (edl/runtime/env_contract.h) both ways, and the runtime's mode selection from
// it (edl/runtime/run_mode.h).
#include "edl/runtime/env_contract.h"

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "edl/runtime/comm/memory_kv_store.h"
#include "edl/runtime/run_mode.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

using Env = std::map<std::string, std::string>;

EnvContract Full() {
  EnvContract c;
  c.job_id = "job1";
  c.trainer_id = "node1-s2-7";
  c.client_socket = "/tmp/edl-node1.sock";
  c.generation = 5;
  c.slot = 2;
  c.cuda_visible_devices = "2";
  c.rank = 3;
  c.world_size = 8;
  c.local_rank = 2;
  c.local_world_size = 4;
  c.master_addr = "10.0.0.1";
  c.master_port = 29500;
  c.joining = true;
  c.rendezvous_dir = "/tmp/rdzv";
  c.local_trainers = 3;
  c.group_rank = 1;
  c.group_world_size = 2;
  c.restart_count = 4;
  c.max_restarts = 9;
  return c;
}

void ExpectSame(const EnvContract& a, const EnvContract& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.trainer_id, b.trainer_id);
  EXPECT_EQ(a.client_socket, b.client_socket);
  EXPECT_EQ(a.restart_mode, b.restart_mode);
  EXPECT_EQ(a.generation, b.generation);
  EXPECT_EQ(a.slot, b.slot);
  EXPECT_EQ(a.cuda_visible_devices, b.cuda_visible_devices);
  EXPECT_EQ(a.has_world, b.has_world);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.local_rank, b.local_rank);
  EXPECT_EQ(a.local_world_size, b.local_world_size);
  EXPECT_EQ(a.master_addr, b.master_addr);
  EXPECT_EQ(a.master_port, b.master_port);
  EXPECT_EQ(a.joining, b.joining);
  EXPECT_EQ(a.spare, b.spare);
  EXPECT_EQ(a.rendezvous_dir, b.rendezvous_dir);
  EXPECT_EQ(a.local_trainers, b.local_trainers);
  EXPECT_EQ(a.group_rank, b.group_rank);
  EXPECT_EQ(a.group_world_size, b.group_world_size);
  EXPECT_EQ(a.restart_count, b.restart_count);
  EXPECT_EQ(a.max_restarts, b.max_restarts);
}

TEST(EnvContractTest, BuildThenParseRoundTrips) {
  EnvContract c = Full();
  auto got = ParseTrainerEnv(BuildTrainerEnv(c));
  ASSERT_OK(got.status());
  ExpectSame(got.value(), c);
  c.joining = false;
  c.restart_mode = true;
  got = ParseTrainerEnv(BuildTrainerEnv(c));
  ASSERT_OK(got.status());
  ExpectSame(got.value(), c);
  c.restart_mode = false;
  for (SpareKind kind : {SpareKind::kFull, SpareKind::kHost}) {
    c.spare = kind;
    got = ParseTrainerEnv(BuildTrainerEnv(c));
    ASSERT_OK(got.status());
    ExpectSame(got.value(), c);
    EXPECT_TRUE(PlanRun(got.value()).spare());
    EXPECT_FALSE(PlanRun(got.value()).joining());
  }
  EXPECT_EQ(BuildTrainerEnv(c).at("EDL_SPARE"), "host");
}

// The names are a contract with trainer scripts (torchrun's RANK, WORLD_SIZE, ...): pin them.
TEST(EnvContractTest, WritesTheDocumentedNames) {
  const Env env = BuildTrainerEnv(Full());
  const Env want = {{"EDL_JOB_ID", "job1"},
                    {"EDL_TRAINER_ID", "node1-s2-7"},
                    {"EDL_CLIENT_SOCKET", "/tmp/edl-node1.sock"},
                    {"EDL_GENERATION", "5"},
                    {"EDL_SLOT", "2"},
                    {"CUDA_VISIBLE_DEVICES", "2"},
                    {"RANK", "3"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "2"},
                    {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "10.0.0.1"},
                    {"MASTER_PORT", "29500"},
                    {"EDL_JOINING", "1"},
                    // The rest of what torchrun sets, so unmodified torchrun scripts find it.
                    {"GROUP_RANK", "1"},
                    {"GROUP_WORLD_SIZE", "2"},
                    {"ROLE_RANK", "3"},
                    {"ROLE_WORLD_SIZE", "8"},
                    {"ROLE_NAME", "default"},
                    {"TORCHELASTIC_RESTART_COUNT", "4"},
                    {"TORCHELASTIC_MAX_RESTARTS", "9"},
                    {"TORCHELASTIC_RUN_ID", "job1"}};
  for (const auto& [k, v] : want) {
    ASSERT_EQ(env.count(k), 1u) << k;
    EXPECT_EQ(env.at(k), v) << k;
  }
}

TEST(EnvContractTest, OptionalVariablesAreUnsetWhenEmpty) {
  EnvContract c;  // no client socket, no GPU, not joining
  const Env env = BuildTrainerEnv(c);
  EXPECT_EQ(env.count("EDL_CLIENT_SOCKET"), 0u);
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env.count("EDL_JOINING"), 0u);
  EXPECT_EQ(env.at("WORLD_SIZE"), "1");
  EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
  // torchrun's agent store is never claimed: rank 0's init_process_group must host the TCPStore.
  EXPECT_EQ(env.count("TORCHELASTIC_USE_AGENT_STORE"), 0u);
}

// What torchrun itself sets is read too: a trainer started by torchrun gets its job id from
// TORCHELASTIC_RUN_ID (EDL_JOB_ID wins when both are there).
TEST(EnvContractTest, ReadsTorchrunsVariables) {
  Env env = {{"RANK", "5"},
             {"WORLD_SIZE", "8"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "4"},
             {"GROUP_RANK", "1"},
             {"GROUP_WORLD_SIZE", "2"},
             {"ROLE_RANK", "5"},
             {"ROLE_WORLD_SIZE", "8"},
             {"ROLE_NAME", "default"},
             {"TORCHELASTIC_RESTART_COUNT", "2"},
             {"TORCHELASTIC_MAX_RESTARTS", "3"},
             {"TORCHELASTIC_RUN_ID", "run7"},
             {"MASTER_ADDR", "node0"},
             {"MASTER_PORT", "29400"}};
  auto got = ParseTrainerEnv(env);
  ASSERT_OK(got.status());
  EXPECT_EQ(got.value().job_id, "run7");
  EXPECT_EQ(got.value().group_rank, 1);
  EXPECT_EQ(got.value().group_world_size, 2);
  EXPECT_EQ(got.value().restart_count, 2);
  EXPECT_EQ(got.value().max_restarts, 3);
  EXPECT_EQ(PlanRun(got.value()).mode, RunMode::kStatic);
  env["EDL_JOB_ID"] = "edljob";
  got = ParseTrainerEnv(env);
  ASSERT_OK(got.status());
  EXPECT_EQ(got.value().job_id, "edljob");
  // GROUP_RANK alone (no GROUP_WORLD_SIZE) is only checked to be a rank.
  got = ParseTrainerEnv({{"GROUP_RANK", "3"}});
  ASSERT_OK(got.status());
  EXPECT_EQ(got.value().group_rank, 3);
}

TEST(EnvContractTest, BuildUsesOnlyContractNames) {
  // A hot joiner, a restart-mode trainer and a spare (the three are exclusive) write every
  // variable between them, and nothing else.
  EnvContract restart = Full();
  restart.joining = false;
  restart.restart_mode = true;
  EnvContract spare = Full();
  spare.joining = false;
  spare.spare = SpareKind::kFull;
  const std::set<std::string> names(std::begin(env::kAll), std::end(env::kAll));
  std::set<std::string> written;
  for (const EnvContract& c : {Full(), restart, spare}) {
    for (const auto& [k, v] : BuildTrainerEnv(c)) {
      EXPECT_EQ(names.count(k), 1u) << k;
      written.insert(k);
    }
  }
  EXPECT_EQ(written, names);
}

TEST(EnvContractTest, EmptyEnvironmentIsStandalone) {
  auto got = ParseTrainerEnv({});
  ASSERT_OK(got.status());
  EXPECT_FALSE(got.value().has_world);
  EXPECT_EQ(got.value().TrainersOnNode(), 1);
  EXPECT_EQ(PlanRun(got.value()).mode, RunMode::kStandalone);
}

// Each malformed environment is refused with an error naming the variable at fault.
TEST(EnvContractTest, BadValuesNameTheVariable) {
  const std::vector<std::pair<Env, std::string>> cases = {
      {{{"RANK", "1"}}, "WORLD_SIZE"},
      {{{"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT"},
      {{{"EDL_GENERATION", "-1"}}, "EDL_GENERATION"},
      {{{"EDL_GENERATION", "3junk"}}, "EDL_GENERATION"},
      {{{"EDL_GENERATION", "99999999999999999999999"}}, "EDL_GENERATION"},
      {{{"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}}, "LOCAL_RANK"},
      {{{"EDL_JOINING", "yes"}}, "EDL_JOINING"},
      {{{"EDL_LOCAL_TRAINERS", "two"}}, "EDL_LOCAL_TRAINERS"},
      {{{"GROUP_RANK", "2"}, {"GROUP_WORLD_SIZE", "2"}}, "GROUP_RANK"},
      {{{"GROUP_WORLD_SIZE", "0"}}, "GROUP_WORLD_SIZE"},
      {{{"TORCHELASTIC_RESTART_COUNT", "-1"}}, "TORCHELASTIC_RESTART_COUNT"},
      {{{"TORCHELASTIC_MAX_RESTARTS", "many"}}, "TORCHELASTIC_MAX_RESTARTS"},
      {{{"EDL_JOINING", "1"}}, "EDL_CLIENT_SOCKET"},
      {{{"EDL_RESTART_MODE", "1"}}, "EDL_CLIENT_SOCKET"},
      {{{"EDL_CLIENT_SOCKET", "/tmp/s.sock"}}, "EDL_TRAINER_ID"},
      {{{"EDL_SPARE", "yes"}}, "EDL_SPARE"},
      {{{"EDL_SPARE", "full"}}, "EDL_CLIENT_SOCKET"},
      {{{"EDL_CLIENT_SOCKET", "/tmp/s.sock"},
        {"EDL_TRAINER_ID", "t"},
        {"EDL_SPARE", "full"},
        {"EDL_JOINING", "1"}},
       "EDL_JOINING"},
      {{{"EDL_CLIENT_SOCKET", "/tmp/s.sock"},
        {"EDL_TRAINER_ID", "t"},
        {"EDL_JOINING", "1"},
        {"EDL_RESTART_MODE", "1"}},
       "EDL_RESTART_MODE"},
  };
  for (const auto& [env, culprit] : cases) {
    auto got = ParseTrainerEnv(env);
    ASSERT_FALSE(got.ok()) << culprit;
    EXPECT_EQ(got.status().code(), Status::Code::kInvalidArgument) << got.status().ToString();
    EXPECT_NE(got.status().ToString().find(culprit), std::string::npos) << got.status().ToString();
  }
}

TEST(EnvContractTest, TrainersOnNodePrefersTheOverride) {
  EnvContract c;
  c.local_world_size = 4;
  EXPECT_EQ(c.TrainersOnNode(), 4);
  c.local_trainers = 2;
  EXPECT_EQ(c.TrainersOnNode(), 2);
}

TEST(EnvContractTest, ReadsTheProcessEnvironment) {
  ::setenv(env::kRank, "1", 1);
  ::setenv(env::kWorldSize, "3", 1);
  ::setenv(env::kRendezvousDir, "/tmp/edl-test-rdzv", 1);
  auto got = TrainerEnvFromProcess();
  ::unsetenv(env::kRank);
  ::unsetenv(env::kWorldSize);
  ::unsetenv(env::kRendezvousDir);
  ASSERT_OK(got.status());
  EXPECT_EQ(got.value().rank, 1);
  EXPECT_EQ(got.value().world_size, 3);
  EXPECT_EQ(got.value().rendezvous_dir, "/tmp/edl-test-rdzv");
}

TEST(RunModeTest, TheEnvironmentSelectsTheMode) {
  EnvContract c = Full();
  RunPlan p = PlanRun(c);
  EXPECT_EQ(p.mode, RunMode::kElastic);
  EXPECT_TRUE(p.joining());
  ElasticOptions o;
  p.ApplyTo(&o);
  EXPECT_TRUE(o.joining);
  EXPECT_EQ(o.join_generation, 5);

  c.joining = false;
  c.restart_mode = true;
  p = PlanRun(c);
  EXPECT_EQ(p.mode, RunMode::kRestart);
  p.ApplyTo(&o);
  EXPECT_FALSE(o.joining);
  EXPECT_EQ(o.join_generation, 0);

  c.client_socket.clear();
  c.restart_mode = false;
  EXPECT_EQ(PlanRun(c).mode, RunMode::kStatic);
  c.has_world = false;
  EXPECT_EQ(PlanRun(c).mode, RunMode::kStandalone);
  EXPECT_STREQ(RunModeName(RunMode::kRestart), "restart");
}

TEST(RunModeTest, StaticAndStandaloneConnectWithoutAClient) {
  EnvContract c;
  c.rank = 1;
  c.world_size = 2;
  c.generation = 0;                                    // `edl launch`
  c.rendezvous_dir = "/tmp/edl-run-mode-test-unused";  // not touched until a Set
  auto m = Connect(PlanRun(c));
  ASSERT_OK(m.status());
  Generation g;
  ASSERT_TRUE(m.value()->Latest(&g));
  EXPECT_EQ(g.number, 1);
  EXPECT_EQ(g.world_size(), 2);
  EXPECT_EQ(g.RankOf(m.value()->trainer_id()), 1);

  c.has_world = false;
  m = Connect(PlanRun(c));
  ASSERT_OK(m.status());
  ASSERT_TRUE(m.value()->Latest(&g));
  EXPECT_EQ(g.world_size(), 1);
}

TEST(RunModeTest, ElasticWithoutAClientFailsNamingTheSocket) {
  EnvContract c;
  c.client_socket = "/nonexistent/edl-run-mode-test.sock";
  c.trainer_id = "t1";
  auto m = Connect(PlanRun(c), std::chrono::milliseconds(500));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().ToString().find(c.client_socket), std::string::npos)
      << m.status().ToString();
}

// Restart mode sees only the generation it was started for.
TEST(RunModeTest, PinnedMembershipReportsOnlyItsGeneration) {
  auto pinned =
      NewPinnedMembership(NewStaticMembership(0, 2, 7, std::make_unique<MemoryKvStore>()), 7);
  Generation g;
  ASSERT_TRUE(pinned->Latest(&g));
  EXPECT_EQ(g.number, 7);
  ASSERT_OK(pinned->WaitGeneration(0, std::chrono::milliseconds(10), &g));
  EXPECT_EQ(g.number, 7);
  Status s = pinned->WaitGeneration(7, std::chrono::milliseconds(10), &g);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();

  // Started for 6, but the client already committed 7: about to be restarted.
  auto stale =
      NewPinnedMembership(NewStaticMembership(0, 2, 7, std::make_unique<MemoryKvStore>()), 6);
  EXPECT_FALSE(stale->Latest(&g));
  s = stale->WaitGeneration(0, std::chrono::milliseconds(10), &g);
  EXPECT_TRUE(s.IsAborted()) << s.ToString();
}

}  // namespace
}  // namespace edl::runtime
