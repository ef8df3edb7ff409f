// The fixture of the tests that run examples/pytorch/train_inplace.py (edl.torch over the C++
// runtime; Debian's python3-torch): Python processes get the build tree's edl package, and a test
// is skipped, with the reason printed, where python3-torch, the data set or the module (not built:
// the configure step says why) is missing. Needs EDL_HAVE_PYTHON_MODULE (0 or 1) defined.
#pragma once

#include <chrono>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/pytorch/pytorch_util.h"
#include "tests/testutil.h"

namespace edl::pytorch_test {

// Generous: every trainer start imports torch, on 2 shared cores.
inline constexpr std::chrono::milliseconds kPhase{240000};

inline std::string Example(const std::string& name) {
  return test::SourceDir() + "/examples/pytorch/" + name;
}
// The build tree's package (python/CMakeLists.txt), for every Python process a test starts.
inline std::map<std::string, std::string> PythonEnv() {
  return {{"PYTHONPATH", test::BuildDir() + "/python"}, {"PYTHONUNBUFFERED", "1"}};
}

// Why this machine cannot run the tests ("" when it can).
inline std::string InPlaceSkipReason(const std::string& scratch) {
  if (!EDL_HAVE_PYTHON_MODULE) {
    return "the edl Python module was not built (the configure step says why: pybind11-dev, "
           "python3-dev)";
  }
  return SkipReason(scratch, "import torch, edl.torch", PythonEnv());
}

class PyTorchInPlaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = InPlaceSkipReason(dir_.path());
    if (!why.empty()) {
      std::cout << "SKIPPED: " << why << std::endl;
      GTEST_SKIP() << why;
    }
  }

  // Runs argv (Python env) to completion; its exit code, the output in *out.
  int Run(const std::vector<std::string>& argv, const std::string& name, std::string* out) {
    itest::Proc p(argv, dir_.Join(name + ".log"), PythonEnv());
    const int rc = p.Wait(kPhase);
    if (rc < 0) p.Stop();
    *out = itest::Slurp(dir_.Join(name + ".log"));
    return rc;
  }

  test::ScratchDir dir_{"pytorch-inplace"};
};

}  // namespace edl::pytorch_test
