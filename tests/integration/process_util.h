// Process and file helpers shared by the integration tests (and every other test that starts a
// process): child processes stopped by pid and checked for a clean exit and sanitizer reports,
// and JSON-lines readers.
//
// Thread-safety: none; one test thread.
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/testutil.h"

namespace edl::itest {

using nlohmann::json;
using std::chrono::milliseconds;

// A TCP port free right now (bound to 0, then released).
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// The first IPv4 address of an up, non-loopback interface; "" when there is none.
inline std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) found = buf;
  }
  ::freeifaddrs(list);
  return found;
}

// One child process in its own process group, its stdout and stderr appended to `log`; stopped by
// pid when the object goes away, and checked then (test failures):
//  - how it ended: exit 0, or what the test declared (Kill(sig): by that signal; ExpectExit), or
//    a status Wait() returned to the test (the test checks that one itself);
//  - a process still running is stopped with SIGTERM (Stop) and must exit 0 within the grace,
//    else it is SIGKILLed and the test fails (ExpectExit(128 + SIGTERM) for a program that dies
//    of SIGTERM by design);
//  - its log holds no sanitizer report (tests/testutil.h).
class Proc {
 public:
  Proc(std::vector<std::string> argv, const std::string& log,
       std::map<std::string, std::string> env = {})
      : name_(argv.empty() ? "" : argv[0]), log_(log) {
    for (size_t i = 1; i < argv.size() && i < 3; ++i) name_ += " " + argv[i];  // "edl server"
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      FILE* f = std::fopen(log.c_str(), "a");
      if (f) {
        ::dup2(fileno(f), 1);
        ::dup2(fileno(f), 2);
      }
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      _exit(127);
    }
    // The parent too (either may run first), so that a signal to the group sent right away, as
    // the destructor's Stop() may, finds the group (EACCES once the child has exec'd: it set it).
    if (pid_ > 0) ::setpgid(pid_, pid_);
  }
  ~Proc() {
    Stop();
    if (done_ && !seen_by_test_ && expected_.count(code_) == 0) {
      ADD_FAILURE() << name_ << " (pid " << pid_ << ") ended with status " << code_
                    << " (128+N: signal N), not 0 nor a status the test expected; log " << log_
                    << ":\n"
                    << Tail();
    }
    test::ExpectNoSanitizerReport(log_, name_);
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  // Waits up to `timeout` for the exit; returns the exit code, -1 on timeout, 128+sig if signalled.
  // A status returned here is the caller's to check.
  int Wait(milliseconds timeout) {
    const int code = Reap(timeout);
    if (code >= 0) seen_by_test_ = true;
    return code;
  }
  // Whether it still runs (reaps it when not, without handing the status to the test).
  bool Running() { return Reap(milliseconds(0)) < 0; }

  // SIGTERM to the group; SIGKILL if it has not exited after `grace` (a client stopping its
  // trainers needs a few seconds; a loaded machine more). Checks, as the destructor does, that it
  // exited 0 (or as ExpectExit said) by itself after the SIGTERM.
  void Stop(milliseconds grace = milliseconds(60000)) {
    if (pid_ <= 0 || Reap(milliseconds(0)) >= 0) return;
    ::kill(-pid_, SIGTERM);
    if (Reap(grace) < 0) {
      ADD_FAILURE() << name_ << " (pid " << pid_ << ") still ran " << grace.count()
                    << " ms after SIGTERM; SIGKILL. Log " << log_ << ":\n"
                    << Tail();
      ::kill(-pid_, SIGKILL);
      Reap(milliseconds(10000));
      seen_by_test_ = true;  // reported
    }
  }
  // Sends `sig` to the process (not its group: a client's trainers run in groups of their own)
  // and records that ending by it is expected. SIGSTOP/SIGCONT: use ::kill on pid().
  void Kill(int sig) {
    expected_.insert(128 + sig);
    ::kill(pid_, sig);
  }
  // An exit status (128 + N: signal N) besides 0 that ends this process as the test intends.
  void ExpectExit(int code) { expected_.insert(code); }
  int pid() const { return pid_; }
  const std::string& log() const { return log_; }

 private:
  int Reap(milliseconds timeout) {
    if (done_) return code_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int st = 0;
      if (pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == pid_) {
        done_ = true;
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return code_;
      }
      if (pid_ <= 0 || std::chrono::steady_clock::now() >= end) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  std::string Tail() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
  }

  std::string name_, log_;
  pid_t pid_ = -1;
  bool done_ = false;
  bool seen_by_test_ = false;
  int code_ = -1;
  std::set<int> expected_ = {0};
};

// Runs argv to completion (at most `timeout`, then SIGKILL); returns its exit code, -1 on timeout.
inline int RunCommand(const std::vector<std::string>& argv, const std::string& log,
                      milliseconds timeout = milliseconds(10000)) {
  Proc p(argv, log);
  const int rc = p.Wait(timeout);
  if (rc < 0) p.Stop();
  return rc;
}

inline std::vector<json> ReadLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

// The file's contents, or only its last `max` bytes when it is longer (for diagnostics).
// Writes `secret` and a newline to `path` with mode 0600 (edl refuses a secret file that others can
// read); returns `path`.
inline std::string WriteSecretFile(const std::string& path, const std::string& secret) {
  std::ofstream(path) << secret << "\n";
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return path;
}

inline std::string Slurp(const std::string& path, size_t max = std::string::npos) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max ? s.substr(s.size() - max) : s;
}

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM": the peak resident set); -1 if absent.
inline int64_t ProcStatusKb(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

// Polls `pred` every 100 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& pred, milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

// Waits (bounded) for a server's --port_file to hold a whole line; "" when `server` exits first
// or nothing is written within `timeout`.
inline std::string WaitForPortFile(const std::string& path, Proc* server,
                                   milliseconds timeout = milliseconds(60000)) {
  std::string port;
  WaitFor(
      [&] {
        const std::string p = Slurp(path);
        if (!p.empty() && p.back() == '\n') port = p.substr(0, p.size() - 1);
        return !port.empty() || !server->Running();
      },
      timeout);
  return port;
}

}  // namespace edl::itest
