// Tests of the Boost.Process launcher with real processes (/bin/sh scripts): env contract, process
// group, log file, TERM->KILL escalation, exit reporting, start failures, descriptor hygiene.
#include "launcher/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/launcher/launcher_util.h"
#include "tests/testutil.h"

namespace edl::launcher {
namespace {

using std::chrono::milliseconds;
using test::ProcessAlive;
using test::ReadFile;
using test::ReadPid;
using test::WaitExit;
using test::WaitUntil;

TrainerSpec Shell(const std::string& script) {
  TrainerSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  return spec;
}

std::unique_ptr<TrainerProcess> MustStart(const TrainerSpec& spec) {
  StatusOr<std::unique_ptr<TrainerProcess>> p = NewProcessLauncher()->Start(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

std::map<std::string, std::string> ParseEnv(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(TrainerProcessTest, ChildSeesEnvContractOverParentEnv) {
  edl::test::ScratchDir dir("launcher");
  ::setenv("EDL_TEST_FROM_PARENT", "kept", 1);
  ::setenv("RANK", "parent-value", 1);
  EnvContract c;
  c.job_id = "j";
  c.trainer_id = "t-1";
  c.client_socket = "/tmp/x.sock";
  c.generation = 4;
  c.rank = 1;
  c.world_size = 2;
  c.master_port = 1234;
  TrainerSpec spec = Shell("env > \"$OUT\"");
  spec.env = BuildTrainerEnv(c);
  spec.env["OUT"] = dir.Join("env.txt");
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ::unsetenv("RANK");
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success()) << info->ToString();
  const auto env = ParseEnv(ReadFile(dir.Join("env.txt")));
  for (const auto& [key, value] : BuildTrainerEnv(c))
    EXPECT_EQ(env.count(key) ? env.at(key) : "<unset>", value) << key;
  EXPECT_EQ(env.count("EDL_TEST_FROM_PARENT") ? env.at("EDL_TEST_FROM_PARENT") : "", "kept");
}

TEST(TrainerProcessTest, WorkingDirIsSet) {
  edl::test::ScratchDir dir("launcher");
  TrainerSpec spec = Shell("pwd > pwd.txt");
  spec.working_dir = dir.path();
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(WaitExit(p.get()).has_value());
  EXPECT_EQ(ReadFile(dir.Join("pwd.txt")), std::filesystem::canonical(dir.path()).string() + "\n");
}

TEST(TrainerProcessTest, OwnProcessGroupAndGrandchildDiesWithIt) {
  edl::test::ScratchDir dir("launcher");
  const std::string gc_file = dir.Join("grandchild.pid");
  auto p = MustStart(Shell("sleep 1000 & echo $! > " + gc_file + "; wait"));
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return ReadPid(gc_file) > 0; })) << "the child never wrote its pid";
  const int grandchild = ReadPid(gc_file);
  EXPECT_EQ(::getpgid(p->pid()), p->pid()) << "child must lead its own process group";
  EXPECT_NE(::getpgid(p->pid()), ::getpgrp()) << "child must not share the launcher's group";
  EXPECT_EQ(::getpgid(grandchild), p->pid());
  ASSERT_TRUE(ProcessAlive(grandchild));
  const ExitInfo info = p->Stop(milliseconds(10000));
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.signal, SIGTERM) << info.ToString();
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(grandchild); }))
      << "grandchild " << grandchild << " survived the stop of its process group";
  if (ProcessAlive(grandchild)) ::kill(grandchild, SIGKILL);
}

TEST(TrainerProcessTest, LeftoverWorkersDieWhenTrainerExits) {
  edl::test::ScratchDir dir("launcher");
  const std::string gc_file = dir.Join("grandchild.pid");
  auto p = MustStart(Shell("sleep 1000 & echo $! > " + gc_file + "; exit 0"));
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success());
  const int grandchild = ReadPid(gc_file);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(grandchild); }))
      << "worker " << grandchild << " outlived its trainer";
  if (ProcessAlive(grandchild)) ::kill(grandchild, SIGKILL);
}

TEST(TrainerProcessTest, LogFileGetsStdoutAndStderrAppended) {
  edl::test::ScratchDir dir("launcher");
  const std::string log = dir.Join("a/b/trainer.log");  // parent dirs do not exist yet
  TrainerSpec spec = Shell("echo out; echo err >&2");
  spec.log_path = log;
  for (int round = 0; round < 2; ++round) {
    auto p = MustStart(spec);
    ASSERT_NE(p, nullptr);
    auto info = WaitExit(p.get());
    ASSERT_TRUE(info.has_value());
    EXPECT_TRUE(info->success());
  }
  EXPECT_EQ(ReadFile(log), "out\nerr\nout\nerr\n");
}

TEST(TrainerProcessTest, StopTerminatesGracefully) {
  TrainerSpec spec;
  spec.argv = {"sleep", "1000"};  // found in PATH
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  const int pid = p->pid();
  const ExitInfo info = p->Stop(milliseconds(10000));
  EXPECT_EQ(info.signal, SIGTERM) << info.ToString();
  EXPECT_EQ(info.ToString(), "killed by SIGTERM");
  EXPECT_EQ(info.ShellStatus(), 128 + SIGTERM);
  EXPECT_FALSE(ProcessAlive(pid));
  ExitInfo again;
  EXPECT_TRUE(p->Poll(&again));
  EXPECT_EQ(again.signal, SIGTERM);
  EXPECT_EQ(p->Stop(milliseconds(0)).signal, SIGTERM) << "Stop after exit returns the same info";
}

TEST(TrainerProcessTest, StopEscalatesToKillWhenTermIsIgnored) {
  edl::test::ScratchDir dir("launcher");
  TrainerSpec spec = Shell("trap '' TERM; echo ready; while :; do sleep 1; done");
  spec.log_path = dir.Join("t.log");
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(spec.log_path) == "ready\n"; }));
  const ExitInfo info = p->Stop(milliseconds(300));
  EXPECT_FALSE(info.exited);
  EXPECT_EQ(info.signal, SIGKILL) << info.ToString();
  EXPECT_EQ(info.ToString(), "killed by SIGKILL");
  EXPECT_FALSE(ProcessAlive(p->pid()));
}

TEST(TrainerProcessTest, ReportsExitCodes) {
  auto p = MustStart(Shell("exit 3"));
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->code, 3);
  EXPECT_FALSE(info->success());
  EXPECT_EQ(info->ToString(), "exit 3");
  EXPECT_EQ(info->ShellStatus(), 3);

  p = MustStart(Shell("exit 0"));
  ASSERT_NE(p, nullptr);
  info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->success());
  EXPECT_EQ(info->ToString(), "exit 0");
}

TEST(TrainerProcessTest, ReportsDeathBySignal) {
  auto p = MustStart(Shell("kill -KILL $$"));
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->exited);
  EXPECT_EQ(info->signal, SIGKILL);
  EXPECT_EQ(info->ToString(), "killed by SIGKILL");
}

TEST(TrainerProcessTest, KillAndTerminateReachTheGroup) {
  TrainerSpec spec = Shell("sleep 1000");
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  p->Kill();
  auto info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->signal, SIGKILL);

  p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  p->Terminate();
  info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->signal, SIGTERM);
  p->Kill();  // after reaping: a no-op, must not signal a reused pgid
}

TEST(TrainerProcessTest, DestructorKillsRunningChild) {
  int pid = 0;
  {
    TrainerSpec spec;
    spec.argv = {"/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"};
    auto p = MustStart(spec);
    ASSERT_NE(p, nullptr);
    pid = p->pid();
    ASSERT_TRUE(ProcessAlive(pid));
  }
  EXPECT_FALSE(ProcessAlive(pid));
}

TEST(TrainerProcessTest, ChildDoesNotInheritOurSockets) {
  edl::test::ScratchDir dir("launcher");
  // Worst case: a listening socket opened WITHOUT close-on-exec.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::fcntl(listener, F_GETFD) & FD_CLOEXEC, 0);
  const int plain_fd = ::open("/dev/null", O_RDONLY);  // also not close-on-exec
  ASSERT_GE(plain_fd, 0);

  TrainerSpec spec = Shell("ls -l /proc/$$/fd > fds.txt");
  spec.working_dir = dir.path();
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ::close(listener);
  ::close(plain_fd);
  ASSERT_TRUE(info.has_value());
  ASSERT_TRUE(info->success()) << info->ToString();
  const std::string fds = ReadFile(dir.Join("fds.txt"));
  EXPECT_EQ(fds.find("socket:"), std::string::npos) << fds;
  EXPECT_EQ(fds.find(" " + std::to_string(plain_fd) + " -> "), std::string::npos) << fds;
  EXPECT_NE(fds.find(" 1 -> "), std::string::npos) << "stdout must stay open: " << fds;
}

// ---- start failures: a clear Status, never an exception.

TEST(StartFailureTest, MissingAbsoluteCommandIsNotFound) {
  TrainerSpec spec;
  spec.argv = {"/nonexistent/edl-no-such-trainer", "--x"};
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsNotFound()) << p.status().ToString();
  EXPECT_NE(p.status().message().find("/nonexistent/edl-no-such-trainer"), std::string::npos);
}

TEST(StartFailureTest, CommandNotInPathIsNotFound) {
  TrainerSpec spec;
  spec.argv = {"edl-no-such-trainer-xyz"};
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsNotFound()) << p.status().ToString();
  EXPECT_NE(p.status().message().find("edl-no-such-trainer-xyz"), std::string::npos);
  EXPECT_NE(p.status().message().find("PATH"), std::string::npos);
}

TEST(StartFailureTest, SpecPathIsUsedForLookup) {
  edl::test::ScratchDir dir("launcher");
  const std::string tool = dir.Join("my-trainer");
  test::WriteFile(tool, "#!/bin/sh\nexit 7\n");
  ::chmod(tool.c_str(), 0755);
  TrainerSpec spec;
  spec.argv = {"my-trainer"};
  spec.env["PATH"] = dir.path() + ":/usr/bin:/bin";
  auto p = MustStart(spec);
  ASSERT_NE(p, nullptr);
  auto info = WaitExit(p.get());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->code, 7);
}

TEST(StartFailureTest, NotExecutableSaysChmod) {
  edl::test::ScratchDir dir("launcher");
  const std::string tool = dir.Join("trainer.sh");
  test::WriteFile(tool, "#!/bin/sh\nexit 0\n");
  ::chmod(tool.c_str(), 0644);
  TrainerSpec spec;
  spec.argv = {tool};
  auto p = NewProcessLauncher()->Start(spec);
  if (::geteuid() == 0 && ::access(tool.c_str(), X_OK) == 0)
    GTEST_SKIP() << "root may exec anything";
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("chmod +x " + tool), std::string::npos)
      << p.status().ToString();
}

TEST(StartFailureTest, DirectoryIsNotAProgram) {
  TrainerSpec spec;
  spec.argv = {"/tmp"};
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("directory"), std::string::npos) << p.status().ToString();
}

TEST(StartFailureTest, ExecFailureIsReportedNotThrown) {
  edl::test::ScratchDir dir("launcher");
  const std::string tool = dir.Join("bad-interpreter");
  test::WriteFile(tool, "#!/nonexistent/interpreter\n");  // executable, but execve fails
  ::chmod(tool.c_str(), 0755);
  TrainerSpec spec;
  spec.argv = {tool};
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(tool), std::string::npos) << p.status().ToString();
  // The forked child whose exec failed was reaped: no zombie is left for a waitpid(-1) to find.
  // (A bounded look: an unreaped child would turn into a zombie within milliseconds.)
  pid_t zombie = 0;
  test::WaitUntil([&] { return (zombie = ::waitpid(-1, nullptr, WNOHANG)) != 0; },
                  milliseconds(300));
  EXPECT_LE(zombie, 0) << "an unreaped child (pid " << zombie << ") was left behind";
}

TEST(StartFailureTest, MissingWorkingDirAndBadLogPath) {
  TrainerSpec spec = Shell("exit 0");
  spec.working_dir = "/nonexistent/workdir";
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsNotFound());
  EXPECT_NE(p.status().message().find("/nonexistent/workdir"), std::string::npos);

  spec.working_dir.clear();
  spec.log_path = "/dev/null/trainer.log";  // parent is not a directory
  p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/dev/null"), std::string::npos) << p.status().ToString();
}

TEST(StartFailureTest, EmptyCommandIsInvalid) {
  TrainerSpec spec;
  auto p = NewProcessLauncher()->Start(spec);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace edl::launcher
