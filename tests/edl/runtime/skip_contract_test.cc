// A skipped test is only ever a test that chose to skip: runs skip_probe's cases under a scratch
// ctest with the properties every edl_test case gets (tests/CMakeLists.txt) and checks ctest's
// verdict on each: a failure followed by a skip (and a "[  SKIPPED ]" line) is Failed, a clean skip
// is Skipped, a pass that prints "[  SKIPPED ]" is Passed.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::test {
namespace {

std::string RunShell(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

// ctest's verdict on `name` from its summary line, e.g. "... fails_then_skips ....***Failed".
std::string Verdict(const std::string& out, const std::string& name) {
  const size_t at = out.find(" " + name + " ");
  if (at == std::string::npos) return "missing";
  const std::string line = out.substr(at, out.find('\n', at) - at);
  for (const char* v : {"***Failed", "***Skipped", "Passed", "Not Run"}) {
    if (line.find(v) != std::string::npos) return v;
  }
  return "unknown: " + line;
}

TEST(SkipContractTest, OnlyACleanSkipIsASkip) {
  ScratchDir dir("edl-skip");
  {
    std::ofstream f(dir.Join("CTestTestfile.cmake"));
    for (const char* c : {"FailsThenSkips", "Skips", "PassesPrintingSkipped"}) {
      f << "add_test(" << c << " \"" << SKIP_PROBE << "\" \"--gtest_filter=Probe." << c << "\")\n"
        << "set_tests_properties(" << c << " PROPERTIES SKIP_RETURN_CODE " << EDL_TEST_SKIP_CODE
        << " SKIP_REGULAR_EXPRESSION \"" << EDL_TEST_SKIP_REGEX << "\")\n";
    }
  }
  int status = 0;
  const std::string out =
      RunShell(std::string(CTEST_COMMAND) + " --test-dir " + dir.path(), &status);
  EXPECT_EQ(Verdict(out, "FailsThenSkips"), "***Failed") << out;
  EXPECT_EQ(Verdict(out, "Skips"), "***Skipped") << out;
  EXPECT_EQ(Verdict(out, "PassesPrintingSkipped"), "Passed") << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "ctest must fail the run:\n" << out;
}

}  // namespace
}  // namespace edl::test
