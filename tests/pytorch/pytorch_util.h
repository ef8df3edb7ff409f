// What the PyTorch tests share: Debian's interpreter, the data set, and why a machine cannot run
// them (python3-torch or Fashion-MNIST missing), checked by running the interpreter.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "tests/integration/process_util.h"

namespace edl::pytorch_test {

// Debian's interpreter (python3-torch is installed for it); EDL_TEST_PYTHON overrides it, e.g. to
// see the skip path with an interpreter that lacks torch.
inline std::string Python() {
  const char* p = std::getenv("EDL_TEST_PYTHON");
  return p != nullptr && p[0] != '\0' ? p : "/usr/bin/python3";
}
inline constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// "" when the data set is installed and Python() runs `check` (with `env`) successfully; else
// why not, with the interpreter's output (its log is scratch/python-check.log).
inline std::string SkipReason(const std::string& scratch, const std::string& check,
                              const std::map<std::string, std::string>& env = {}) {
  if (!std::filesystem::exists(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz")) {
    return std::string("Fashion-MNIST not installed at ") + kFashionDir +
           " (Debian: dataset-fashion-mnist, scripts/install_deps.sh)";
  }
  const std::string log = scratch + "/python-check.log";
  itest::Proc p({Python(), "-c", check}, log, env);
  const int rc = p.Wait(std::chrono::milliseconds(120000));
  if (rc < 0) p.Stop();
  if (rc != 0) {
    return Python() + " cannot run `" + check + "` (Debian: python3-torch, " +
           "scripts/install_deps.sh): " + itest::Slurp(log, 600);
  }
  return "";
}

}  // namespace edl::pytorch_test
