// Not a test of its own: the gtest binary skip_contract_test runs under a scratch ctest, one case
// at a time, to check how ctest reports each outcome (see skip_contract_test.cc).
#include <iostream>

#include <gtest/gtest.h>

TEST(Probe, FailsThenSkips) {
  ADD_FAILURE() << "the plugin did not load";
  std::cout << "[  SKIPPED ] no GPU\n";  // what a broken GPU test printed before skipping
  GTEST_SKIP() << "no GPU";
}

TEST(Probe, Skips) { GTEST_SKIP() << "no GPU visible"; }

TEST(Probe, PassesPrintingSkipped) {
  std::cout << "[  SKIPPED ] a line a child process printed\n";
  SUCCEED();
}
