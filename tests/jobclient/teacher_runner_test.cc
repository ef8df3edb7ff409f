// TeacherRunner (jobclient/teacher_runner.h) with the real launcher: a teacher command gets the
// client's flags appended, runs in its slot, is stopped with SIGTERM, and its end is reported as a
// teacher_exit; orders it cannot follow are errors; a --service command that sets a flag the client
// appends is refused by name.
#include "jobclient/teacher_runner.h"

#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl::jobclient {
namespace {

using std::chrono::milliseconds;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST(TeacherRunnerTest, RunsStopsAndReportsTeachers) {
  test::ScratchDir dir;
  auto launcher = launcher::NewProcessLauncher();
  TeacherRunnerOptions o;
  // A stand-in teacher: prints its arguments, then waits to be stopped.
  o.commands["kd"] = {"/bin/sh", "-c", "echo \"$@\"; exec sleep 600", "sh"};
  o.commands["quick"] = {"/bin/sh", "-c", "exit 3", "sh"};
  o.slots = 2;
  o.secret_file = "/etc/edl/secret";
  o.advertise_host = "10.0.0.2";
  o.log_dir = dir.path();
  o.stop_grace_ms = 5000;
  TeacherRunner r(launcher.get(), o);
  EXPECT_EQ(r.Services(), std::vector<std::string>({"kd", "quick"}));
  ASSERT_OK(r.Start("kd", "n1-t1", "10.0.0.1:8180"));
  EXPECT_EQ(r.Start("kd", "n1-t1", "10.0.0.1:8180").code(),
            Status::Code::kFailedPrecondition);  // runs already
  EXPECT_EQ(r.Start("nope", "n1-t2", "10.0.0.1:8180").code(), Status::Code::kFailedPrecondition);
  ASSERT_OK(r.Start("quick", "n1-t3", "10.0.0.1:8180"));
  EXPECT_EQ(r.Start("kd", "n1-t4", "10.0.0.1:8180").code(),
            Status::Code::kFailedPrecondition);  // both slots taken
  std::vector<proto::TeacherOrder> ended;
  ASSERT_TRUE(itest::WaitFor(
      [&] {
        for (auto& e : r.Poll(NowUs())) ended.push_back(e);
        return !ended.empty();
      },
      milliseconds(30000)));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].type, proto::TeacherOrderType::kExit);
  EXPECT_EQ(ended[0].name, "n1-t3");
  EXPECT_EQ(ended[0].why, "exit 3");
  EXPECT_EQ(r.Running(), (std::vector<std::pair<std::string, std::string>>{{"kd", "n1-t1"}}));
  const std::string log = dir.Join("teacher-n1-t1.log");
  ASSERT_TRUE(
      itest::WaitFor([&] { return itest::Slurp(log).find("10.0.0.2") != std::string::npos; },
                     milliseconds(30000)));
  EXPECT_NE(itest::Slurp(log).find("--service kd --name n1-t1 --server 10.0.0.1:8180 --secret_file "
                                   "/etc/edl/secret --advertise_host 10.0.0.2 --exit_with_parent " +
                                   std::to_string(::getpid())),
            std::string::npos)
      << itest::Slurp(log);
  EXPECT_FALSE(r.Stop("n1-t9", NowUs()));
  ASSERT_TRUE(r.Stop("n1-t1", NowUs()));
  EXPECT_TRUE(r.Running().empty());  // stopping: no longer offered as running
  ended.clear();
  ASSERT_TRUE(itest::WaitFor(
      [&] {
        for (auto& e : r.Poll(NowUs())) ended.push_back(e);
        return !ended.empty();
      },
      milliseconds(30000)));
  EXPECT_EQ(ended[0].name, "n1-t1");
  EXPECT_EQ(ended[0].why, "killed by SIGTERM");
}

TEST(TeacherRunnerTest, CommandsSettingTheAppendedFlagsAreRefused) {
  EXPECT_OK(CheckServiceCommand("kd", {"edl", "teacher", "--model", "resnet56"}));
  for (const char* bad : {"--name", "--server=1.2.3.4:5", "--service", "--secret_file",
                          "--advertise_host", "--exit_with_parent"}) {
    Status s = CheckServiceCommand("kd", {"edl", "teacher", bad, "x"});
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("the client adds"), std::string::npos) << s.ToString();
  }
  EXPECT_FALSE(CheckServiceCommand("kd", {}).ok());
}

}  // namespace
}  // namespace edl::jobclient
