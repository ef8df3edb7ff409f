// Shared main for every gtest binary: ignores SIGPIPE so a dead peer shows up as EPIPE
// (gloo test/main.cc), logs to stderr.
#include <csignal>

#include <glog/logging.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
