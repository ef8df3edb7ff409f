// `edl launch`'s torchrun flags (launcher/launch_options.h) parsed in process, and a node joining
// a real `edl server` through `edl launch --rdzv_endpoint` (a real server, the launch process
// becoming its client, /bin/sh trainers), every process checked by pid.
#include "launcher/launch_options.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/launcher.h"
#include "tests/launcher/launcher_util.h"
#include "tests/testutil.h"

namespace edl::launcher {
namespace {

using test::ReadFile;
using test::WaitExit;
using test::WaitUntil;

// ParseLaunchArgs over `args` (after "launch").
Status Parse(std::vector<std::string> args, LaunchOptions* opts) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  return ParseLaunchArgs(static_cast<int>(argv.size()), argv.data(), opts, &help);
}

TEST(LaunchOptionsTest, NodeRanges) {
  int lo = 0, hi = 0;
  ASSERT_OK(ParseNodeRange("3", &lo, &hi));
  EXPECT_EQ(lo, 3);
  EXPECT_EQ(hi, 3);
  ASSERT_OK(ParseNodeRange("1:4", &lo, &hi));
  EXPECT_EQ(lo, 1);
  EXPECT_EQ(hi, 4);
  for (const char* bad :
       {"", ":", "0", "2:1", "1:", ":4", "a:b", "1:4:5", "-1:2", "1:99999999999"}) {
    EXPECT_FALSE(ParseNodeRange(bad, &lo, &hi).ok()) << bad;
  }
}

TEST(LaunchOptionsTest, ALocalJobByDefault) {
  LaunchOptions o;
  ASSERT_OK(Parse({"--nproc_per_node", "4", "--standalone", "--", "python3", "t.py"}, &o));
  EXPECT_EQ(o.num_trainers, 4);
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 1);
  EXPECT_TRUE(o.rdzv_endpoint.empty());
  EXPECT_EQ(o.rdzv_id, "local");
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.command, (std::vector<std::string>{"python3", "t.py"}));
}

// A torchrun multi-node command line becomes an `edl client` joining the endpoint in restart
// mode with N CPU slots; the server-side flags come back as notes with the numbers to give it.
TEST(LaunchOptionsTest, AnEndpointJoinsThatServerAsAClient) {
  LaunchOptions o;
  ASSERT_OK(Parse({"--nnodes",
                   "2:4",
                   "--nproc_per_node",
                   "8",
                   "--rdzv_endpoint",
                   "node0:8180",
                   "--rdzv_id",
                   "r50",
                   "--rdzv_backend",
                   "c10d",
                   "--max_restarts",
                   "3",
                   "--secret_file",
                   "/etc/edl/secret",
                   "--node_name",
                   "gpu07",
                   "--advertise_addr",
                   "10.0.0.7",
                   "--log_dir",
                   "/var/log/edl",
                   "--",
                   "python3",
                   "train.py",
                   "--lr",
                   "0.1"},
                  &o));
  EXPECT_EQ(ClientArgv(o), (std::vector<std::string>{"client",
                                                     "--server",
                                                     "node0:8180",
                                                     "--secret_file",
                                                     "/etc/edl/secret",
                                                     "--node_name",
                                                     "gpu07",
                                                     "--slots",
                                                     "8",
                                                     "--mode",
                                                     "restart",
                                                     "--stop_grace_s",
                                                     "10",
                                                     "--exit_when_done",
                                                     "--advertise_addr",
                                                     "10.0.0.7",
                                                     "--log_dir",
                                                     "/var/log/edl",
                                                     "--",
                                                     "python3",
                                                     "train.py",
                                                     "--lr",
                                                     "0.1"}));
  std::string notes;
  for (const std::string& n : JoinNotes(o)) notes += n + "\n";
  EXPECT_NE(notes.find("--min_trainers 16 --max_trainers 32"), std::string::npos) << notes;
  EXPECT_NE(notes.find("--job_id"), std::string::npos) << notes;
  EXPECT_NE(notes.find("--backoff_min_s"), std::string::npos) << notes;

  // Defaults when joining: the secret ssh_cluster.sh creates, the host name as the node name.
  LaunchOptions d;
  ::setenv("HOME", "/home/someone", 1);
  ASSERT_OK(Parse({"-n", "2", "--rdzv_endpoint", "[fd00::1]:8180", "--", "true"}, &d));
  EXPECT_EQ(d.secret_file, "/home/someone/.edl/secret");
  EXPECT_FALSE(d.node_name.empty());
  EXPECT_TRUE(JoinNotes(d).empty());
}

class LaunchJoinTest : public testing::Test {
 protected:
  std::unique_ptr<TrainerProcess> Start(std::vector<std::string> argv, const std::string& log) {
    TrainerSpec spec;
    spec.argv = std::move(argv);
    spec.log_path = dir_.Join(log);
    spec.working_dir = dir_.path();
    auto p = NewProcessLauncher()->Start(spec);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }

  edl::test::ScratchDir dir_{"launch-join"};
};

// `edl launch --rdzv_endpoint` against a real server: the node joins with its N slots, the
// trainers get the job's torchrun variables, and launch, client and server all exit 0 at the end.
TEST_F(LaunchJoinTest, JoinsARealServerAndFinishesTheJob) {
  const std::string secret = dir_.Join("secret");
  std::ofstream(secret) << "launch-join-test-secret-0123456789abcdef\n";
  std::filesystem::permissions(
      secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto server =
      Start({edl::test::EdlBinary(), "server", "--server_port", "0", "--bind", "127.0.0.1",
             "--port_file", dir_.Join("port"), "--secret_file", secret, "--job_id", "joinjob",
             "--min_trainers", "2", "--events_dir", dir_.Join("events"), "--exit_when_done"},
            "server.log");
  ASSERT_NE(server, nullptr);
  std::string port;
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string p = ReadFile(dir_.Join("port"));
        if (!p.empty() && p.back() == '\n') port = p.substr(0, p.size() - 1);
        return !port.empty();
      },
      std::chrono::seconds(60)))
      << ReadFile(dir_.Join("server.log"));
  const std::string node = "launch-join-" + std::to_string(::getpid());
  auto launch = Start({edl::test::EdlBinary(),
                       "launch",
                       "--nnodes",
                       "1:2",
                       "--nproc_per_node",
                       "2",
                       "--rdzv_endpoint",
                       "127.0.0.1:" + port,
                       "--rdzv_id",
                       "joinjob",
                       "--secret_file",
                       secret,
                       "--node_name",
                       node,
                       "--log_dir",
                       dir_.Join("logs"),
                       "--stop_grace_s",
                       "2",
                       "--",
                       "/bin/sh",
                       "-c",
                       "echo \"$RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE "
                       "$TORCHELASTIC_RUN_ID $EDL_RESTART_MODE $TORCHELASTIC_MAX_RESTARTS\" > "
                       "out.$RANK"},
                      "launch.log");
  ASSERT_NE(launch, nullptr);
  auto info = WaitExit(launch.get(), std::chrono::seconds(120));
  const std::string diag = "\n--- launch\n" + ReadFile(dir_.Join("launch.log")) + "\n--- server\n" +
                           ReadFile(dir_.Join("server.log"));
  ASSERT_TRUE(info.has_value()) << diag;
  EXPECT_TRUE(info->success()) << info->ToString() << diag;
  auto server_exit = WaitExit(server.get(), std::chrono::seconds(60));
  ASSERT_TRUE(server_exit.has_value()) << diag;
  EXPECT_TRUE(server_exit->success()) << diag;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ReadFile(dir_.Join("out." + std::to_string(r))),
              std::to_string(r) + " 2 2 0 1 joinjob 1 2147483647\n")
        << "rank " << r << diag;
  }
  EXPECT_NE(ReadFile(dir_.Join("launch.log")).find("joining the edl server"), std::string::npos);
  // The client keeps its session token (and its lock) next to its default socket path (/tmp).
  std::filesystem::remove("/tmp/edl-" + node + ".session");
  std::filesystem::remove("/tmp/edl-" + node + ".session.lock");
}

}  // namespace
}  // namespace edl::launcher
