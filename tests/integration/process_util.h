// Process and file helpers shared by the integration tests: child processes stopped by pid and
// JSON-lines readers.
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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

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

// One child process in its own process group, stopped by pid (SIGTERM to the group, then SIGKILL)
// when the object goes away.
class Proc {
 public:
  Proc(std::vector<std::string> argv, const std::string& log, std::map<std::string, std::string> env = {}) {
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
  }
  ~Proc() { Stop(); }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  // Waits up to `timeout` for the exit; returns the exit code, -1 on timeout, 128+sig if signalled.
  int Wait(milliseconds timeout) {
    if (done_) return code_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        done_ = true;
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return code_;
      }
      if (std::chrono::steady_clock::now() >= end) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  // SIGTERM to the group; SIGKILL if it has not exited after `grace` (a client stopping its
  // trainers needs a few seconds).
  void Stop(milliseconds grace = milliseconds(8000)) {
    if (done_ || pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    if (Wait(grace) < 0) {
      ::kill(-pid_, SIGKILL);
      Wait(milliseconds(5000));
    }
  }
  int pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
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
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
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
        return !port.empty() || server->Wait(milliseconds(0)) >= 0;
      },
      timeout);
  return port;
}

}  // namespace edl::itest
