// Tests of `edl launch` run as a real process (the built binary) with /bin/sh trainers: ranks and
// env, fail-fast when a rank fails, stop on SIGTERM, usage errors. Every process is checked by pid.
#include <signal.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/launcher.h"
#include "tests/launcher/launcher_util.h"
#include "tests/testutil.h"

namespace edl::launcher {
namespace {

using test::ProcessAlive;
using test::ReadFile;
using test::ReadPid;
using test::WaitExit;
using test::WaitUntil;

class LaunchTest : public testing::Test {
 protected:
  // Starts `edl launch ARGS` with its output in launch.log.
  std::unique_ptr<TrainerProcess> StartLaunch(const std::vector<std::string>& args) {
    TrainerSpec spec;
    spec.argv = {edl::test::EdlBinary(), "launch"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.log_path = dir_.Join("launch.log");
    spec.working_dir = dir_.path();
    spec.env["EDL_CLIENT_SOCKET"] = "/tmp/must-not-reach-trainers.sock";
    auto p = NewProcessLauncher()->Start(spec);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }
  std::string LaunchLog() { return ReadFile(dir_.Join("launch.log")); }
  std::string D() const { return dir_.path(); }

  edl::test::ScratchDir dir_{"launch"};
};

TEST_F(LaunchTest, RunsNRanksWithTorchrunEnv) {
  auto launch = StartLaunch({"-n", "3", "--log_dir", D() + "/logs", "--", "/bin/sh", "-c",
                             "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                             "$EDL_GENERATION $EDL_JOB_ID $EDL_TRAINER_ID "
                             "${EDL_CLIENT_SOCKET-nosocket} $MASTER_PORT\" > out.$RANK; echo hi"});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value()) << "edl launch did not finish";
  EXPECT_TRUE(info->success()) << info->ToString() << "\n" << LaunchLog();
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::istringstream line(ReadFile(D() + "/out." + std::to_string(r)));
    std::vector<std::string> f;
    for (std::string w; line >> w;) f.push_back(w);
    ASSERT_EQ(f.size(), 10u) << "rank " << r << " wrote no env line";
    const std::string rank = std::to_string(r);
    EXPECT_EQ(f[0], rank);
    EXPECT_EQ(f[1], "3");
    EXPECT_EQ(f[2], rank);
    EXPECT_EQ(f[3], "3");
    EXPECT_EQ(f[4], "127.0.0.1");
    EXPECT_EQ(f[5], "0");
    EXPECT_EQ(f[6], "local");
    EXPECT_EQ(f[7], "local-" + rank);
    EXPECT_EQ(f[8], "nosocket") << "static mode must not see EDL_CLIENT_SOCKET";
    if (r == 0) port = f[9];
    EXPECT_EQ(f[9], port) << "every rank gets the same MASTER_PORT";
    EXPECT_EQ(ReadFile(D() + "/logs/trainer-" + rank + ".log"), "hi\n");
  }
  EXPECT_GT(std::stoi(port), 0);
}

TEST_F(LaunchTest, TeePrefixesEachRanksOutput) {
  auto launch = StartLaunch({"-n", "2", "--tee", "--log_dir", D() + "/logs", "--", "/bin/sh", "-c",
                             "echo line-$RANK; printf partial-$RANK"});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success()) << LaunchLog();
  const std::string log = LaunchLog();
  for (const char* want :
       {"[rank 0] line-0\n", "[rank 1] line-1\n", "[rank 0] partial-0\n", "[rank 1] partial-1\n"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << " missing from:\n" << log;
  }
}

TEST_F(LaunchTest, FailsFastWhenOneRankFailsAndLeavesNoProcess) {
  // Ranks 0 and 2 record their pid and sleep; rank 1 waits (bounded) until they have, then fails.
  // Rank 2 ignores SIGTERM, so the launcher must escalate to SIGKILL.
  const std::string script =
      "echo $$ > pid.$RANK\n"
      "if [ \"$RANK\" = 1 ]; then\n"
      "  i=0; while { [ ! -s pid.0 ] || [ ! -s pid.2 ]; } && [ $i -lt 600 ]; do sleep 0.05; "
      "i=$((i+1)); done\n"
      "  exit 3\n"
      "fi\n"
      "if [ \"$RANK\" = 2 ]; then trap '' TERM; while :; do sleep 1; done; fi\n"
      "exec sleep 1000\n";
  auto launch = StartLaunch({"-n", "3", "--stop_grace_s", "0.5", "--log_dir", D() + "/logs", "--",
                             "/bin/sh", "-c", script});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value()) << "edl launch did not stop after a rank failed";
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->code, 3) << LaunchLog();
  const std::string log = LaunchLog();
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("exit 3"), std::string::npos) << log;
  for (int r : {0, 1, 2}) {
    const int pid = ReadPid(D() + "/pid." + std::to_string(r));
    ASSERT_GT(pid, 0) << "rank " << r << " never started";
    EXPECT_FALSE(ProcessAlive(pid)) << "rank " << r << " (pid " << pid << ") left behind";
    if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
  }
}

TEST_F(LaunchTest, SigtermStopsEveryTrainer) {
  const std::string script =
      "echo $$ > pid.$RANK\n"
      "if [ \"$RANK\" = 0 ]; then trap '' TERM; while :; do sleep 1; done; fi\n"
      "exec sleep 1000\n";
  auto launch = StartLaunch({"-n", "2", "--stop_grace_s", "0.5", "--log_dir", D() + "/logs", "--",
                             "/bin/sh", "-c", script});
  ASSERT_NE(launch, nullptr);
  ASSERT_TRUE(
      WaitUntil([&] { return ReadPid(D() + "/pid.0") > 0 && ReadPid(D() + "/pid.1") > 0; }));
  ::kill(launch->pid(), SIGTERM);  // the launcher only, as a user or service manager would
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value()) << "edl launch ignored SIGTERM";
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->code, 128 + SIGTERM) << LaunchLog();
  for (int r : {0, 1}) {
    const int pid = ReadPid(D() + "/pid." + std::to_string(r));
    EXPECT_FALSE(ProcessAlive(pid)) << "rank " << r << " (pid " << pid << ") left behind";
    if (ProcessAlive(pid)) ::kill(pid, SIGKILL);
  }
}

TEST_F(LaunchTest, UsageErrorsExit2WithAHint) {
  struct Case {
    std::vector<std::string> args;
    std::string hint;
  };
  const std::vector<Case> cases = {
      {{"-n", "2"}, "after `--`"},
      {{"-n", "2", "sh", "-c", "true"}, "after `--`"},
      {{"-n", "0", "--", "true"}, "-n 0"},
      {{"--", "true"}, "nproc_per_node"},
      {{"-n", "1", "--no_such_flag", "--", "true"}, "no_such_flag"},
      {{"-n", "x", "--", "true"}, "nproc_per_node"},
      // torchrun's flags
      {{"-n", "1", "--nnodes", "2", "--", "true"}, "--rdzv_endpoint"},
      {{"-n", "1", "--nnodes", "3:2", "--", "true"}, "--nnodes 3:2"},
      {{"-n", "1", "--nnodes", "0:2", "--", "true"}, "--nnodes 0:2"},
      {{"-n", "1", "--rdzv_endpoint", "node0", "--", "true"}, "HOST:PORT"},
      {{"-n", "1", "--rdzv_endpoint", "node0:99999", "--", "true"}, "HOST:PORT"},
      {{"-n", "1", "--standalone", "--rdzv_endpoint", "node0:8180", "--", "true"}, "--standalone"},
      {{"-n", "1", "--rdzv_backend", "etcd", "--", "true"}, "--rdzv_backend etcd"},
      {{"-n", "1", "--max_restarts", "-1", "--", "true"}, "--max_restarts -1"},
      {{"-n", "1", "--secret_file", "s", "--", "true"}, "--rdzv_endpoint"},
      {{"-n", "1", "--rdzv_endpoint", "node0:8180", "--master_port", "5", "--", "true"},
       "--master_port"},
  };
  for (const Case& c : cases) {
    auto launch = StartLaunch(c.args);
    ASSERT_NE(launch, nullptr);
    auto info = WaitExit(launch.get());
    ASSERT_TRUE(info.has_value());
    const std::string log = LaunchLog();
    EXPECT_EQ(info->ShellStatus(), 2) << log;
    EXPECT_NE(log.find(c.hint), std::string::npos) << c.hint << " not in:\n" << log;
    std::filesystem::remove(D() + "/launch.log");
  }
}

// What torchrun sets beyond RANK/WORLD_SIZE, with --rdzv_id naming the job.
TEST_F(LaunchTest, SetsTorchrunsVariablesAndTheRunId) {
  auto launch = StartLaunch({"--nnodes", "1:4", "--nproc_per_node", "2", "--rdzv_id", "job7",
                             "--rdzv_backend", "c10d", "--max_restarts", "3", "--log_dir",
                             D() + "/logs", "--", "/bin/sh", "-c",
                             "echo \"$GROUP_RANK $GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE "
                             "$ROLE_NAME $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS "
                             "$TORCHELASTIC_RUN_ID $EDL_JOB_ID "
                             "${TORCHELASTIC_USE_AGENT_STORE-unset}\" > out.$RANK"});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success()) << LaunchLog();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ReadFile(D() + "/out." + std::to_string(r)),
              "0 1 " + std::to_string(r) + " 2 default 0 3 job7 job7 unset\n")
        << "rank " << r;
  }
}

// --max_restarts: a failure restarts every trainer (restart count, MASTER_PORT fresh) until the
// restarts run out.
TEST_F(LaunchTest, MaxRestartsRestartsEveryTrainerAfterAFailure) {
  // Rank 1 fails in its first two starts, once rank 0 has recorded that start (bounded wait);
  // the third start succeeds.
  const std::string script =
      "echo \"$TORCHELASTIC_RESTART_COUNT $MASTER_PORT\" >> starts.$RANK\n"
      "if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ]; then\n"
      "  i=0; while ! grep -q \"^$TORCHELASTIC_RESTART_COUNT \" starts.0 2>/dev/null && [ $i -lt "
      "600 ]; do\n"
      "    sleep 0.05; i=$((i+1)); done\n"
      "  exit 5\n"
      "fi\n"
      "exit 0\n";
  auto launch = StartLaunch({"-n", "2", "--max_restarts", "2", "--stop_grace_s", "0.5", "--log_dir",
                             D() + "/logs", "--", "/bin/sh", "-c", script});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value()) << "edl launch did not finish";
  EXPECT_TRUE(info->success()) << info->ToString() << "\n" << LaunchLog();
  for (int r = 0; r < 2; ++r) {
    std::istringstream in(ReadFile(D() + "/starts." + std::to_string(r)));
    std::vector<int> counts;
    for (int count, port; in >> count >> port;) counts.push_back(count);
    // Rank 0 may have exited 0 before rank 1 failed: it is started again all the same.
    EXPECT_EQ(counts, (std::vector<int>{0, 1, 2})) << "rank " << r << "\n" << LaunchLog();
  }
  EXPECT_NE(LaunchLog().find("restarting every trainer (2 of --max_restarts 2)"), std::string::npos)
      << LaunchLog();

  // Out of restarts: the failed rank's status.
  std::filesystem::remove(D() + "/launch.log");
  auto again = StartLaunch(
      {"-n", "2", "--max_restarts", "1", "--stop_grace_s", "0.5", "--log_dir", D() + "/logs2", "--",
       "/bin/sh", "-c",
       "echo $TORCHELASTIC_RESTART_COUNT >> fails.$RANK; [ $RANK = 1 ] && exit 4; exit 0"});
  ASSERT_NE(again, nullptr);
  info = WaitExit(again.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->ShellStatus(), 4) << LaunchLog();
  EXPECT_EQ(ReadFile(D() + "/fails.1"), "0\n1\n");
  EXPECT_NE(LaunchLog().find("no restarts left"), std::string::npos) << LaunchLog();
}

TEST_F(LaunchTest, MissingTrainerCommandNamesIt) {
  auto launch = StartLaunch({"-n", "2", "--log_dir", D() + "/logs", "--", "edl-no-such-trainer"});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->ShellStatus(), 1);
  EXPECT_NE(LaunchLog().find("edl-no-such-trainer"), std::string::npos) << LaunchLog();
}

}  // namespace
}  // namespace edl::launcher
