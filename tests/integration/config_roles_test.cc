// Every role of the `edl` binary reads `--config FILE` with the same keys as its flags and refuses
// a key it does not know, naming it (README.md, "Configuration"): a typo in an INI file must not
// be silently ignored. Runs the built binary; each run is bounded and checked by pid.
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
  for (const std::vector<std::string>& role :
       {std::vector<std::string>{"server"}, {"client"}, {"ctl"}, {"launch"}, {"train"},
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
  const int rc = itest::RunCommand(
      {test::EdlBinary(), "launch", "--config", ini, "--", "/bin/sh", "-c",
       "echo \"$RANK $WORLD_SIZE $TORCHELASTIC_RUN_ID\" > " + out + ".$RANK"},
      dir.Join("launch.log"), std::chrono::milliseconds(60000));
  ASSERT_EQ(rc, 0) << itest::Slurp(dir.Join("launch.log"));
  EXPECT_EQ(itest::Slurp(out + ".0"), "0 2 fromini\n");
  EXPECT_EQ(itest::Slurp(out + ".1"), "1 2 fromini\n");
}

}  // namespace
}  // namespace edl
