// Every role of the `edl` binary reads `--config FILE` with the same keys as its flags and refuses
// a key it does not know, naming it (docs/FLAGS.md, "Configuration"): a typo in an INI file must
// not be silently ignored. Runs the built binary; each run is bounded and checked by pid.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

TEST(ConfigRolesTest, EveryRoleRefusesAnUnknownKeyNamingIt) {
  test::ScratchDir dir("config-roles");
  const std::string ini = dir.Join("bad.ini");
  std::ofstream(ini) << "# a typo of a real key\nsecret_fiel = /tmp/x\n";
  for (const std::vector<std::string>& role : {std::vector<std::string>{"server"},
                                               {"client"},
                                               {"ctl"},
                                               {"launch"},
                                               {"train"},
                                               {"teacher"},
                                               {"ckpt", "ls"}}) {
    std::vector<std::string> argv = {test::EdlBinary()};
    argv.insert(argv.end(), role.begin(), role.end());
    argv.insert(argv.end(), {"--config", ini});
    const std::string log = dir.Join(role[0] + ".log");
    const int rc = itest::RunCommand(argv, log, std::chrono::milliseconds(60000));
    const std::string out = itest::Slurp(log);
    EXPECT_EQ(rc, 2) << role[0] << ": " << out;
    EXPECT_NE(out.find("secret_fiel"), std::string::npos) << role[0] << ": " << out;
    EXPECT_NE(out.find(ini), std::string::npos) << role[0] << " does not name the file: " << out;
  }
}

// The keys are the flags' names: `edl launch` (torchrun's flags included) from an INI file alone.
TEST(ConfigRolesTest, LaunchTakesTorchrunsFlagsFromTheConfig) {
  test::ScratchDir dir("config-launch");
  const std::string ini = dir.Join("launch.ini");
  std::ofstream(ini) << "nproc_per_node = 2\nnnodes = 1:1\nrdzv_id = fromini\nmax_restarts = 0\n"
                     << "log_dir = " << dir.Join("logs") << "\n";
  const std::string out = dir.Join("out");
  const int rc =
      itest::RunCommand({test::EdlBinary(), "launch", "--config", ini, "--", "/bin/sh", "-c",
                         "echo \"$RANK $WORLD_SIZE $TORCHELASTIC_RUN_ID\" > " + out + ".$RANK"},
                        dir.Join("launch.log"), std::chrono::milliseconds(60000));
  ASSERT_EQ(rc, 0) << itest::Slurp(dir.Join("launch.log"));
  EXPECT_EQ(itest::Slurp(out + ".0"), "0 2 fromini\n");
  EXPECT_EQ(itest::Slurp(out + ".1"), "1 2 fromini\n");
}

// --log_dir means the same for every role that logs: the directory of this process's own log
// files (stderr keeps every line), plus, for a client, its trainers' logs.
TEST(ConfigRolesTest, LogDirHoldsEachRolesOwnLogFiles) {
  test::ScratchDir dir("log-dir");
  const std::string secret = dir.Join("secret");
  itest::WriteSecretFile(secret, "log-dir-test-secret-0123456789abcdef");
  // The INFO file glog writes in `d` holds `text`.
  auto logged = [](const std::string& d, const std::string& text) {
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(d, ec)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("edl.", 0) == 0 && name.find(".INFO.") != std::string::npos &&
          itest::Slurp(f.path().string()).find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  itest::Proc server({test::EdlBinary(), "server", "--server_port", "0", "--bind", "127.0.0.1",
                      "--port_file", dir.Join("port"), "--secret_file", secret, "--job_id", "logs",
                      "--events_dir", dir.Join("events"), "--log_dir", dir.Join("server-logs")},
                     dir.Join("server.stderr"));
  const std::string port = itest::WaitForPortFile(dir.Join("port"), &server);
  ASSERT_FALSE(port.empty()) << itest::Slurp(dir.Join("server.stderr"));
  EXPECT_TRUE(itest::WaitFor([&] { return logged(dir.Join("server-logs"), "listening on"); },
                             std::chrono::milliseconds(30000)))
      << "no server log file in --log_dir";
  EXPECT_NE(itest::Slurp(dir.Join("server.stderr")).find("listening on"), std::string::npos)
      << "stderr must keep the INFO lines";

  itest::Proc client({test::EdlBinary(),
                      "client",
                      "--server",
                      "127.0.0.1:" + port,
                      "--secret_file",
                      secret,
                      "--node_name",
                      "logs-node",
                      "--slots",
                      "1",
                      "--mode",
                      "restart",
                      "--socket_path",
                      dir.Join("c.sock"),
                      "--log_dir",
                      dir.Join("client-logs"),
                      "--",
                      "/bin/sh",
                      "-c",
                      "echo from-the-trainer; exec sleep 600"},
                     dir.Join("client.stderr"));
  // The client's own lines and its trainer's output both land in its --log_dir.
  EXPECT_TRUE(itest::WaitFor(
      [&] {
        if (!logged(dir.Join("client-logs"), "started trainer")) return false;
        std::error_code ec;
        for (const auto& f : std::filesystem::directory_iterator(dir.Join("client-logs"), ec)) {
          const std::string name = f.path().filename().string();
          if (name.rfind("logs-node-", 0) == 0 &&
              itest::Slurp(f.path().string()).find("from-the-trainer") != std::string::npos) {
            return true;
          }
        }
        return false;
      },
      std::chrono::milliseconds(60000)))
      << "client --log_dir lacks its own log or its trainer's\n"
      << itest::Slurp(dir.Join("client.stderr"));
  EXPECT_NE(itest::Slurp(dir.Join("client.stderr")).find("started trainer"), std::string::npos);
  client.Stop();
  server.Stop();
}

}  // namespace
}  // namespace edl
