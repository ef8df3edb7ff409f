// scripts/gpu_check.sh --dry_run: the GPU check script, with every GPU step replaced by its CPU
// twin, runs its seven checks against this build and passes, writing its report; so the script
// cannot rot between runs on a GPU host. No process it started outlives it.
#include <dirent.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::test {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Processes whose command line mentions `dir` (every one the script starts does).
std::string ProcessesUsing(const std::string& dir) {
  std::string found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = ::readdir(proc)) {
    const std::string pid = e->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = Slurp("/proc/" + pid + "/cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(dir) != std::string::npos) found += pid + ": " + cmd + "\n";
  }
  ::closedir(proc);
  return found;
}

TEST(GpuCheckDryRunTest, EveryCheckPassesWithItsCpuTwin) {
  ScratchDir out("edl-gpu-check");
  const std::string cmd = "GPU_CHECK_EDL=" + EdlBinary() + " GPU_CHECK_TESTS=" + BuildDir() +
                          "/tests GPU_CHECK_CHAOS=" + BuildDir() + "/edl_chaos_check bash " +
                          SourceDir() + "/scripts/gpu_check.sh --dry_run " + out.path() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, n);
  const int status = ::pclose(p);
  std::cout << output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  for (int c = 1; c <= 7; ++c) {
    EXPECT_NE(output.find("PASS check " + std::to_string(c) + ":"), std::string::npos)
        << "check " << c << ":\n"
        << Slurp(out.Join("check" + std::to_string(c) + ".log"));
  }
  EXPECT_NE(output.find("RESULT fashion_resnet20_fp32_test_accuracy"), std::string::npos);
  EXPECT_NE(output.find("RESULT elastic_4_trainers_loss_last_over_first"), std::string::npos);
  const std::string report = Slurp(out.Join("report.txt"));
  EXPECT_NE(report.find("every check passed"), std::string::npos) << report;
  EXPECT_EQ(ProcessesUsing(out.path()), "") << "left running";
}

}  // namespace
}  // namespace edl::test
