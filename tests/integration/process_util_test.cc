// The checks every test's child processes go through (tests/integration/process_util.h, Proc, and
// tests/testutil.h): each must be able to fail a test. Real processes (/bin/sh) stand in for a
// crashed or leaking child; gtest-spi catches the failure they must raise.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::Proc;
using std::chrono::milliseconds;

// gtest-spi's statements may not use locals: the scratch directory of the case at hand.
std::string& Dir() {
  static std::string dir;
  return dir;
}

class ProcCheckTest : public ::testing::Test {
 protected:
  void SetUp() override { Dir() = dir_.path(); }
  test::ScratchDir dir_{"proc-check"};
};

TEST_F(ProcCheckTest, ASanitizerReportInAChildsLogFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(
      {
        Proc p({"/bin/sh", "-c", "echo '==7==ERROR: AddressSanitizer: heap-use-after-free' >&2"},
               Dir() + "/asan.log");
        EXPECT_EQ(p.Wait(milliseconds(30000)), 0);
      },
      "sanitizer report in");
  EXPECT_NONFATAL_FAILURE(
      {
        Proc p({"/bin/sh", "-c", "echo 'a.cc:3:5: runtime error: signed integer overflow'"},
               Dir() + "/ubsan.log");
        p.Wait(milliseconds(30000));
      },
      "runtime error: signed integer overflow");
}

TEST_F(ProcCheckTest, AnUnexpectedExitOrAHangOnSigtermFailsTheTest) {
  // Exited 3 by itself, and nobody looked (Running() reaps it without handing the test its status).
  EXPECT_NONFATAL_FAILURE(
      {
        Proc p({"/bin/sh", "-c", "exit 3"}, Dir() + "/exit3.log");
        itest::WaitFor([&] { return !p.Running(); }, milliseconds(30000));
      },
      "ended with status 3");
  // Stopped by SIGTERM, which a shell dies of: 128 + 15 unless the test says it expects that.
  EXPECT_NONFATAL_FAILURE(
      {
        Proc p({"/bin/sleep", "600"}, Dir() + "/sleep.log");
      },
      "ended with status 143");
  // Ignores SIGTERM: SIGKILLed after the grace, and that is a failure.
  EXPECT_NONFATAL_FAILURE(
      {
        Proc p({"/bin/sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; done"},
               Dir() + "/deaf.log");
        itest::WaitFor(
            [&] { return itest::Slurp(Dir() + "/deaf.log").find("up") != std::string::npos; },
            milliseconds(30000));
        p.Stop(milliseconds(200));
      },
      "after SIGTERM");
}

TEST_F(ProcCheckTest, WhatTheTestDeclaredOrCheckedPasses) {
  {
    Proc killed({"/bin/sleep", "600"}, dir_.Join("killed.log"));
    killed.Kill(SIGKILL);
  }
  {
    Proc term({"/bin/sleep", "600"}, dir_.Join("term.log"));
    term.ExpectExit(128 + SIGTERM);
  }
  {
    Proc two({"/bin/sh", "-c", "exit 2"}, dir_.Join("two.log"));
    EXPECT_EQ(two.Wait(milliseconds(30000)), 2);  // the test read the status: its own to check
  }
  {
    // Exits 0 on SIGTERM once its trap is set.
    Proc clean({"/bin/sh", "-c", "trap 'exit 0' TERM; echo up; while :; do sleep 0.05; done"},
               dir_.Join("clean.log"));
    ASSERT_TRUE(itest::WaitFor(
        [&] { return itest::Slurp(dir_.Join("clean.log")).find("up") != std::string::npos; },
        milliseconds(30000)));
  }
}

TEST_F(ProcCheckTest, AScratchDirectoryChecksEveryLogInIt) {
  EXPECT_NONFATAL_FAILURE(
      {
        test::ScratchDir d("sweep");
        std::filesystem::create_directories(d.Join("logs"));
        std::ofstream(d.Join("logs/trainer-3.log"))
            << "WARNING: ThreadSanitizer: data race (pid=9)\n";
      },
      "ThreadSanitizer: data race");
  // Only log-like files: a checkpoint's bytes are not read.
  test::ScratchDir quiet("sweep");
  std::ofstream(quiet.Join("state.bin")) << "ERROR: AddressSanitizer";
}

}  // namespace
}  // namespace edl
