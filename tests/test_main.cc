// Shared main for every gtest binary: ignores SIGPIPE so a dead peer shows up as EPIPE
// (gloo test/main.cc), logs to stderr, and exits with kEdlSkipExitCode (EDL_SKIP_EXIT_CODE from
// tests/CMakeLists.txt) when every selected test skipped.
#include <csignal>

#include <glog/logging.h>
#include <gtest/gtest.h>

constexpr int kEdlSkipExitCode = EDL_SKIP_EXIT_CODE;

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  // ctest decides "skipped" from this exit code alone (edl_test's SKIP_RETURN_CODE): a run in
  // which every selected test skipped and none failed. A test that records a failure and then
  // skips is a failure (gtest counts it failed, rc 1), whatever it printed.
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  if (rc == 0 && u.skipped_test_count() > 0 && u.successful_test_count() == 0 &&
      u.failed_test_count() == 0) {
    return kEdlSkipExitCode;
  }
  return rc;
}
