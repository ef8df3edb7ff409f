// Helpers shared by every test: Status assertions, scratch directories, paths to the built binary,
// and the check for sanitizer reports in the logs of the processes a test started.
//
// Thread-safety: ScratchDir and the sanitizer checks from one test thread.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "edl/base/status.h"

#define EXPECT_OK(expr)                                       \
  do {                                                        \
    const ::edl::Status _s = (expr);                          \
    EXPECT_TRUE(_s.ok()) << #expr << " -> " << _s.ToString(); \
  } while (0)
#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::edl::Status _s = (expr);                          \
    ASSERT_TRUE(_s.ok()) << #expr << " -> " << _s.ToString(); \
  } while (0)

namespace edl::test {

// The path CMake gave macro `name` (edl_test_path in tests/CMakeLists.txt, which defines MACRO as
// EDL_BUILT_PATH(MACRO)); defined in the generated edl_test_paths.cc of edl_testmain, the one
// object of the tests that holds paths of the tree. Aborts for a name no edl_test_path gave.
const char* BuiltPath(const char* name);
#define EDL_BUILT_PATH(macro) ::edl::test::BuiltPath(#macro)

// Path of the built `edl` binary, the source and the build tree: set by CMake for every test
// target, each overridable by the environment variable of the same name (EDL_BINARY,
// EDL_SOURCE_DIR, EDL_BUILD_DIR), so that a test binary copied elsewhere (the GPU check bundle,
// scripts/gpu_check.sh) runs against the files next to it.
inline std::string FromEnv(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : built;
}
inline std::string EdlBinary() { return FromEnv("EDL_BINARY", EDL_BINARY); }
inline std::string SourceDir() { return FromEnv("EDL_SOURCE_DIR", EDL_SOURCE_DIR); }
inline std::string BuildDir() { return FromEnv("EDL_BUILD_DIR", EDL_BUILD_DIR); }

// What a sanitizer report starts with (ASan, LSan, TSan, UBSan), '|' between markers: set once in
// tests/CMakeLists.txt, which also fails a test whose own output holds one.
inline std::vector<std::string> SanitizerMarkers() {
  std::vector<std::string> out;
  std::stringstream in(EDL_SANITIZER_MARKERS);
  for (std::string m; std::getline(in, m, '|');) out.push_back(m);
  return out;
}

// The first sanitizer report in `text` with the lines after it (about 3000 bytes); "" if none.
inline std::string SanitizerReport(const std::string& text) {
  size_t first = std::string::npos;
  for (const std::string& m : SanitizerMarkers()) first = std::min(first, text.find(m));
  if (first == std::string::npos) return "";
  const size_t line = text.rfind('\n', first);
  const size_t from = line == std::string::npos ? 0 : line + 1;
  return text.substr(from, 3000);
}

// Adds a test failure naming `path` (and `who` wrote it) when the file holds a sanitizer report.
// A file is reported once per test process (a log several processes append to, a scratch
// directory's sweep after the process's own check).
inline void ExpectNoSanitizerReport(const std::string& path, const std::string& who) {
  static std::set<std::string> reported;
  if (reported.count(path) > 0) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string report = SanitizerReport(ss.str());
  if (report.empty()) return;
  reported.insert(path);
  ADD_FAILURE() << "sanitizer report in " << path << " (" << who << "):\n" << report;
}

// Every log-like file under `dir` (*.log, *.out, *.err, *.txt: the logs of the processes a test
// started, the trainers' and teachers' under a client's --log_dir included) checked as above.
inline void ExpectNoSanitizerReportUnder(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file(ec) &&
        (ext == ".log" || ext == ".out" || ext == ".err" || ext == ".txt")) {
      ExpectNoSanitizerReport(it->path().string(), "a log in the test's scratch directory");
    }
  }
}

// A fresh directory under $TMPDIR (or /tmp), removed when the object goes out of scope unless
// EDL_KEEP_TEST_DIRS is set (for post-mortems). Before that, the logs in it are checked for
// sanitizer reports (ExpectNoSanitizerReportUnder): every process a test starts logs there.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "edl") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/" + tag + "-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    ExpectNoSanitizerReportUnder(path_);
    if (std::getenv("EDL_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace edl::test
