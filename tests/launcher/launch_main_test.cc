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
  auto launch = StartLaunch({"-n", "2", "--tee", "--log_dir", D() + "/logs", "--", "/bin/sh",
                             "-c", "echo line-$RANK; printf partial-$RANK"});
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success()) << LaunchLog();
  const std::string log = LaunchLog();
  for (const char* want : {"[rank 0] line-0\n", "[rank 1] line-1\n", "[rank 0] partial-0\n",
                           "[rank 1] partial-1\n"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << " missing from:\n" << log;
  }
}

TEST_F(LaunchTest, FailsFastWhenOneRankFailsAndLeavesNoProcess) {
  // Ranks 0 and 2 record their pid and sleep; rank 1 waits (bounded) until they have, then fails.
  // Rank 2 ignores SIGTERM, so the launcher must escalate to SIGKILL.
  const std::string script =
      "echo $$ > pid.$RANK\n"
      "if [ \"$RANK\" = 1 ]; then\n"
      "  i=0; while { [ ! -s pid.0 ] || [ ! -s pid.2 ]; } && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n"
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
  ASSERT_TRUE(WaitUntil([&] { return ReadPid(D() + "/pid.0") > 0 && ReadPid(D() + "/pid.1") > 0; }));
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
