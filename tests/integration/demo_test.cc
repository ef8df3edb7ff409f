// The `make demo` pipeline end to end: scripts/demo.sh --short runs a real `edl server`, two
// `edl client`s and 4 `edl train` trainers (ResNet-20, Fashion-MNIST subset) with a scaling script
// that shrinks, grows and SIGKILLs a trainer. The test checks the summary the demo prints (at
// least three generation changes including a failure, training finished, test accuracy far above
// chance), the timeline picture, and that no process the demo started is left behind (by the pids
// it records and by scanning /proc); and that Ctrl-C (SIGINT) mid-run also stops everything.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

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

// Runs scripts/demo.sh as a child (its own process group, output to `out`), stops it by pid.
class DemoProcess {
 public:
  DemoProcess(const std::string& dir, const std::string& out, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/bin/bash", test::SourceDir() + "/scripts/demo.sh"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (kv.rfind("EDL_", 0) != 0) env_store.push_back(kv);
    }
    env_store.push_back("EDL_BIN=" + test::EdlBinary());
    env_store.push_back("EDL_DEMO_DIR=" + dir);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env_store) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, argv[0].c_str(), &fa, &attr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    EXPECT_EQ(rc, 0) << "posix_spawn " << argv[1];
    if (rc != 0) pid_ = -1;
  }
  ~DemoProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGINT);  // the demo's trap stops what it started
    if (Wait(seconds(40)) < -1) {
      ::kill(pid_, SIGKILL);
      Wait(seconds(5));
    }
  }
  DemoProcess(const DemoProcess&) = delete;
  DemoProcess& operator=(const DemoProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The exit code (128 + signal when killed), or -2 when it still runs after `timeout`.
  int Wait(seconds timeout) {
    const auto deadline = steady_clock::now() + timeout;
    while (pid_ > 0) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (r < 0 || steady_clock::now() > deadline) return r < 0 ? -1 : -2;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

// Checks that every pid in <dir>/pids and every process naming `dir` is gone.
void ExpectNothingLeft(const std::string& dir) {
  const std::string pids = ReadFile(dir + "/pids");
  std::istringstream in(pids);
  int n = 0;
  for (pid_t pid; in >> pid; ++n) EXPECT_FALSE(AliveWith(pid, dir)) << "pid " << pid << " left running";
  EXPECT_GE(n, 4) << "the demo recorded too few pids (server, 2 clients, watch): " << pids;
  const std::vector<pid_t> left = ProcessesMentioning(dir);
  for (pid_t pid : left) {
    ADD_FAILURE() << "process " << pid << " (" << ReadFile("/proc/" + std::to_string(pid) + "/cmdline")
                  << ") is still running; killing it";
    ::kill(pid, SIGKILL);
  }
}

// The demo needs `edl train` on the elastic runtime (--train_samples, --checkpoint_dir, the
// client's socket); a tree where it is still the standalone trainer skips, saying so.
#define SkipUnlessElasticTrainer()                                                          \
  do {                                                                                      \
    const std::string cmd = test::EdlBinary() + " train --help 2>&1 | grep -q -- --train_samples"; \
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "edl train has no elastic runtime yet"; \
  } while (0)

TEST(DemoTest, ShortDemoChangesGenerationsAndTrainsToGoodAccuracy) {
  SkipUnlessElasticTrainer();
  test::ScratchDir dir("edl-demo-test");
  const std::string out = dir.Join("out.txt");
  int rc;
  {
    DemoProcess demo(dir.path(), out, {"--short"});
    ASSERT_GT(demo.pid(), 0);
    rc = demo.Wait(seconds(420));  // about 100 s on 2 idle cores; generous for a loaded CI machine
  }
  const std::string text = ReadFile(out);
  SCOPED_TRACE("demo output:\n" + text);
  EXPECT_EQ(rc, 0);

  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(generation changes: (\d+) \(failures: (\d+)\))")));
  EXPECT_GE(std::stoi(m[1]), 3) << "shrink, grow and failure each make a generation";
  EXPECT_GE(std::stoi(m[2]), 1) << "the scripted SIGKILL makes a failure generation";
  // The summary names each change's kind, reason and stall; the script makes all three kinds, and
  // each is formed by survivors that measure their stall (none is superseded before it forms: the
  // script's changes are 20 s apart, and a failure's grow-back waits for a new process).
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
  // machine; the full demo reaches 90.7%, README); where the changes land moves it by a point or
  // two. Chance is 10%.
  std::cout << "final test accuracy " << m[1] << "%\n";
  EXPECT_GT(std::stod(m[1]), 75.0);
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(timeline picture: (\S+\.png))")));
  EXPECT_GT(std::filesystem::file_size(m[1].str()), 10000u);
  EXPECT_NE(ReadFile(dir.Join("events/demo.events.jsonl")).find("\"type\":\"progress\""), std::string::npos)
      << "the server writes progress records the picture is drawn from";
  ExpectNothingLeft(dir.path());
}

TEST(DemoTest, CtrlCStopsEveryProcess) {
  SkipUnlessElasticTrainer();
  test::ScratchDir dir("edl-demo-int");
  const std::string out = dir.Join("out.txt");
  int rc = -2;
  {
    DemoProcess demo(dir.path(), out, {"--short"});
    ASSERT_GT(demo.pid(), 0);
    // Wait until the trainers train (the server logs their progress), then interrupt as Ctrl-C would.
    const auto deadline = steady_clock::now() + seconds(90);
    bool training = false;
    while (steady_clock::now() < deadline && !training && demo.Wait(seconds(0)) == -2) {
      training = ReadFile(dir.Join("events/demo.events.jsonl")).find("\"type\":\"progress\"") != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(training) << "no trainer progress within 90 s:\n" << ReadFile(out);
    ASSERT_EQ(::kill(demo.pid(), SIGINT), 0);
    rc = demo.Wait(seconds(60));
  }
  SCOPED_TRACE("demo output:\n" + ReadFile(out));
  EXPECT_EQ(rc, 130) << "Ctrl-C exits 130";
  ExpectNothingLeft(dir.path());
}

}  // namespace
}  // namespace edl
