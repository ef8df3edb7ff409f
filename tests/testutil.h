// Helpers shared by every test: Status assertions, scratch directories, paths to the built binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "edl/base/status.h"

#define EXPECT_OK(expr)                                         \
  do {                                                          \
    const ::edl::Status _s = (expr);                            \
    EXPECT_TRUE(_s.ok()) << #expr << " -> " << _s.ToString();   \
  } while (0)
#define ASSERT_OK(expr)                                         \
  do {                                                          \
    const ::edl::Status _s = (expr);                            \
    ASSERT_TRUE(_s.ok()) << #expr << " -> " << _s.ToString();   \
  } while (0)

namespace edl::test {

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

// A fresh directory under $TMPDIR (or /tmp), removed when the object goes out of scope unless
// EDL_KEEP_TEST_DIRS is set (for post-mortems).
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
