// Helpers for the launcher tests: bounded waits on files and processes.
#pragma once

#include <signal.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "launcher/launcher.h"

namespace edl::launcher::test {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path);
  out << data;
}

// Polls `pred` every 10 ms until it holds or `timeout` passes; returns its last value.
inline bool WaitUntil(const std::function<bool()>& pred,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// True while `pid` names a live process (a zombie counts as dead: it runs no code any more, and an
// orphaned zombie may wait for a container's init to reap it).
inline bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

// Polls the child until it exits (bounded); nullopt if it is still running at the deadline.
inline std::optional<ExitInfo> WaitExit(
    TrainerProcess* p, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  ExitInfo info;
  if (WaitUntil([&] { return p->Poll(&info); }, timeout)) return info;
  return std::nullopt;
}

// Reads an integer pid written by a child into `path` (0 if absent or not yet complete).
inline int ReadPid(const std::string& path) {
  const std::string s = ReadFile(path);
  if (s.empty() || s.back() != '\n') return 0;
  return std::stoi(s);
}

}  // namespace edl::launcher::test
