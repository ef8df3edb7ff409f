// The `make demo` pipeline end to end: scripts/demo.sh --short runs a real `edl server`, two
// `edl client`s and 4 `edl train` trainers (ResNet-20, Fashion-MNIST subset) with a scaling script
// that shrinks, grows and SIGKILLs a trainer. The test checks the summary the demo prints (at
// least three generation changes including a failure, training finished, test accuracy far above
// chance), the timeline picture, and that no process the demo started is left behind (by the pids
// it records and by scanning /proc); and that Ctrl-C (SIGINT) mid-run also stops everything.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

extern char** environ;

namespace edl {
namespace {

using std::chrono::seconds;
using std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True when `pid` is a live (not zombie) process whose command line contains `needle`.
bool AliveWith(pid_t pid, const std::string& needle) {
  const std::string base = "/proc/" + std::to_string(pid);
  const std::string stat = ReadFile(base + "/stat");
  const size_t paren = stat.rfind(") ");
  if (stat.empty() || paren == std::string::npos || stat[paren + 2] == 'Z') return false;
  return ReadFile(base + "/cmdline").find(needle) != std::string::npos;
}

// Every live process whose command line mentions `needle` (the demo's scratch directory).
std::vector<pid_t> ProcessesMentioning(const std::string& needle) {
  std::vector<pid_t> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (pid != ::getpid() && AliveWith(pid, needle)) found.push_back(pid);
  }
  return found;
}

// scripts/demo.sh ARGS, run by itest::Proc (its own process group, output to the log, checked for a
// clean exit and sanitizer reports) under /usr/bin/env: the test's own EDL_* variables removed,
// the demo's set. Stopped by a signal, the demo's trap stops what it started and exits 130.
std::unique_ptr<itest::Proc> StartDemo(const std::string& dir, const std::string& out,
                                       const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("EDL_", 0) == 0) argv.insert(argv.end(), {"-u", kv.substr(0, kv.find('='))});
  }
  argv.insert(argv.end(), {"EDL_BIN=" + test::EdlBinary(), "EDL_DEMO_DIR=" + dir, "/bin/bash",
                           test::SourceDir() + "/scripts/demo.sh"});
  argv.insert(argv.end(), args.begin(), args.end());
  auto demo = std::make_unique<itest::Proc>(argv, out);
  demo->ExpectExit(130);
  return demo;
}

// Checks that every pid in <dir>/pids and every process naming `dir` is gone.
void ExpectNothingLeft(const std::string& dir) {
  const std::string pids = ReadFile(dir + "/pids");
  std::istringstream in(pids);
  int n = 0;
  for (pid_t pid; in >> pid; ++n)
    EXPECT_FALSE(AliveWith(pid, dir)) << "pid " << pid << " left running";
  EXPECT_GE(n, 4) << "the demo recorded too few pids (server, 2 clients, watch): " << pids;
  const std::vector<pid_t> left = ProcessesMentioning(dir);
  for (pid_t pid : left) {
    ADD_FAILURE() << "process " << pid << " ("
                  << ReadFile("/proc/" + std::to_string(pid) + "/cmdline")
                  << ") is still running; killing it";
    ::kill(pid, SIGKILL);
  }
}

TEST(DemoTest, ShortDemoChangesGenerationsAndTrainsToGoodAccuracy) {
  test::ScratchDir dir("edl-demo-test");
  const std::string out = dir.Join("out.txt");
  int rc;
  {
    auto demo = StartDemo(dir.path(), out, {"--short"});
    ASSERT_GT(demo->pid(), 0);
    // About 100 s on 2 idle cores; the demo gives up by itself after EDL_DEMO_TIMEOUT_S (--short:
    // 1200 s), so this bound only catches a demo that hangs in its own clean-up.
    rc = demo->Wait(seconds(1300));
  }
  const std::string text = ReadFile(out);
  SCOPED_TRACE("demo output:\n" + text);
  EXPECT_EQ(rc, 0);

  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(text, m, std::regex(R"(generation changes: (\d+) \(failures: (\d+)\))")));
  EXPECT_GE(std::stoi(m[1]), 3) << "shrink, grow and failure each make a generation";
  EXPECT_GE(std::stoi(m[2]), 1) << "the scripted SIGKILL makes a failure generation";
  // The summary names each change's kind, reason and stall; the script makes all three kinds, and
  // each is formed by survivors that measure their stall (none is superseded before it forms: the
  // script's changes are 20-30 training steps apart, counted from when the one before took effect,
  // and a failure's grow-back waits for a new process).
  for (const char* kind : {"shrink", "grow", "failure"}) {
    if (std::regex_search(text, m,
                          std::regex(std::string(R"(g\d+ +at [0-9.]+ s +)") + kind +
                                     R"( +\d+ -> \d+ +reason=\S+ +stall ([0-9.]+) s)"))) {
      EXPECT_GT(std::stod(m[1]), 0.0) << kind;
    } else {
      ADD_FAILURE() << "no " << kind << " line with reason and a measured stall in the summary";
    }
  }
  EXPECT_NE(text.find("training: finished"), std::string::npos);
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(final test accuracy: ([0-9.]+)%)")));
  // A correct short run (20000 samples x 2 epochs) ends at about 85% (84.3-84.6% on a loaded
  // machine; the full demo reaches 90.7%, docs/DEMO.md); where the changes land moves it by a point
  // or two. Chance is 10%.
  std::cout << "final test accuracy " << m[1] << "%\n";
  EXPECT_GT(std::stod(m[1]), 75.0);
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(timeline picture: (\S+\.png))")));
  EXPECT_GT(std::filesystem::file_size(m[1].str()), 10000u);
  EXPECT_NE(ReadFile(dir.Join("events/demo.events.jsonl")).find("\"type\":\"progress\""),
            std::string::npos)
      << "the server writes progress records the picture is drawn from";
  ExpectNothingLeft(dir.path());
}

TEST(DemoTest, CtrlCStopsEveryProcess) {
  test::ScratchDir dir("edl-demo-int");
  const std::string out = dir.Join("out.txt");
  int rc = -1;
  {
    auto demo = StartDemo(dir.path(), out, {"--short"});
    ASSERT_GT(demo->pid(), 0);
    // Wait until the trainers train (the server logs their progress), then interrupt as Ctrl-C
    // would. The bound only catches a demo that never trains (a few seconds on 2 idle cores).
    const auto deadline = steady_clock::now() + seconds(600);
    bool training = false;
    while (steady_clock::now() < deadline && !training && demo->Running()) {
      training = ReadFile(dir.Join("events/demo.events.jsonl")).find("\"type\":\"progress\"") !=
                 std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(training) << "no trainer progress within 600 s:\n" << ReadFile(out);
    demo->Kill(SIGINT);
    rc = demo->Wait(seconds(300));  // its clean-up: at most ~20 s of stop graces
  }
  SCOPED_TRACE("demo output:\n" + ReadFile(out));
  EXPECT_EQ(rc, 130) << "Ctrl-C exits 130";
  ExpectNothingLeft(dir.path());
}

}  // namespace
}  // namespace edl
