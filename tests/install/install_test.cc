// `make install` (cmake --install), the installed CMake package and `cpack -G DEB`, checked the way
// a user meets them: the tree is installed into a scratch prefix and then moved elsewhere, so only
// $ORIGIN-relative paths can make it run; examples/cpp is configured as a separate project against
// that moved prefix, built, and trained alone and under the installed `edl launch`; the Debian
// package is built, its dependencies read and its files unpacked and run.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "edl/config.h"
#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

namespace fs = std::filesystem;
using itest::RunCommand;
using itest::Slurp;
using std::chrono::milliseconds;

// Generous bounds for a loaded 2-core machine; a hang fails the step, never the suite's timeout.
constexpr milliseconds kStepTimeout{240000};

class InstallTest : public ::testing::Test {
 protected:
  // One install for every case, made by the ctest fixture install_test.fixture (tests/install/
  // CMakeLists.txt): into stage/, then moved to moved/edl (a different path and depth). Each case
  // works in a scratch directory of its own.
  static void SetUpTestSuite() { dir_ = new test::ScratchDir("edl-install"); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(Prefix() + "/bin/edl"))
        << "no installed tree at " << Prefix()
        << ": run the test through ctest (ctest -R '^install_test\\.' "
        << "runs the fixture install_test.fixture, `cmake --install` of this tree, first)";
  }

  static std::string Prefix() { return std::string(EDL_INSTALLED) + "/moved/edl"; }
  // The installed library directory (lib/, or lib/<multiarch> for the prefix /usr).
  static std::string LibDir() {
    for (const auto& e : fs::recursive_directory_iterator(Prefix())) {
      if (e.path().filename() == "libedl.so") return e.path().parent_path().string();
    }
    return Prefix() + "/lib";
  }
  // Runs argv with no LD_LIBRARY_PATH (the installed files must find each other by themselves);
  // returns the exit code, the output in *out.
  static int Run(std::vector<std::string> argv, const std::string& name, std::string* out) {
    argv.insert(argv.begin(), {"/usr/bin/env", "-u", "LD_LIBRARY_PATH"});
    const std::string log = dir_->Join(name + ".log");
    const int rc = RunCommand(argv, log, kStepTimeout);
    *out = Slurp(log);
    return rc;
  }
  // The RUNPATH / RPATH entries of an ELF file, as readelf prints them ("" when none).
  static std::string RunPath(const std::string& elf) {
    std::string out;
    Run({EDL_READELF, "-d", elf}, "readelf", &out);
    std::smatch m;
    const std::regex re(R"(\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\])");
    return std::regex_search(out, m, re) ? m[1].str() : "";
  }
  // Imports the Python package edl installed under `prefix` (EDL_PYTHON_INSTALL_DIR) with Debian's
  // python3, its module finding libedl.so by its own RUNPATH, and asks it for the run mode.
  static int ImportPython(const std::string& prefix, const std::string& name, std::string* out) {
    const std::string dir = prefix + "/" + EDL_PYTHON_INSTALL_DIR;
    if (!fs::exists(dir + "/edl/torch.py")) {
      *out = "no " + dir + "/edl/torch.py";
      return -1;
    }
    const int rc =
        Run({"/usr/bin/env", "PYTHONPATH=" + dir, "/usr/bin/python3", "-c",
             "import edl; assert edl.__file__.startswith('" + dir + "'); print(edl.plan())"},
            name, out);
    return rc != 0 || out->find("'mode': 'standalone'") == std::string::npos ? 1 : 0;
  }
  // The first "loss A -> B" of a trainer's final line: {A, B}, or {-1, -1} when there is none.
  static std::pair<double, double> Losses(const std::string& out) {
    std::smatch m;
    const std::regex re(R"(linear_trainer: finished at step (\d+) generation \d+, )"
                        R"(loss ([0-9.e+-]+) -> ([0-9.e+-]+))");
    if (!std::regex_search(out, m, re)) return {-1, -1};
    return {std::stod(m[2].str()), std::stod(m[3].str())};
  }

  static test::ScratchDir* dir_;
};

test::ScratchDir* InstallTest::dir_ = nullptr;

TEST_F(InstallTest, InstalledTreeRunsAfterBeingMoved) {
  const std::string lib = LibDir();
  std::vector<std::string> files = {Prefix() + "/bin/edl", lib + "/libedl.so",
                                    lib + "/libedl_resnet50.so", lib + "/cmake/edl/edlConfig.cmake",
                                    lib + "/cmake/edl/edlTargets.cmake"};
  if (EDL_HAVE_CUDA) files.push_back(lib + "/libedl_cuda.so");  // found next to libedl.so
  for (const std::string& f : files) EXPECT_TRUE(fs::exists(f)) << f << " was not installed";
  // bin/edl and libedl_resnet50.so find libedl.so relative to themselves; nothing installed
  // points into the build tree (libedl.so needs only system libraries: no RUNPATH at all).
  for (const std::string& elf : {files[0], files[2]}) {
    EXPECT_NE(RunPath(elf).find("$ORIGIN"), std::string::npos)
        << elf << " RUNPATH '" << RunPath(elf) << "'";
  }
  for (const std::string& elf : {files[0], files[1], files[2]}) {
    EXPECT_EQ(RunPath(elf).find(test::BuildDir()), std::string::npos)
        << elf << " still points into the build tree: RUNPATH '" << RunPath(elf) << "'";
  }
  std::string out;
  if (EDL_HAVE_PYTHON_MODULE) {  // the Python package imports from the moved tree too
    EXPECT_EQ(ImportPython(Prefix(), "python-moved", &out), 0) << out;
  }
  EXPECT_EQ(Run({Prefix() + "/bin/edl", "ckpt", "--help"}, "ckpt-help", &out), 0) << out;
  EXPECT_NE(out.find("usage: edl ckpt"), std::string::npos) << out;
  EXPECT_EQ(Run({Prefix() + "/bin/edl", "train", "--help"}, "train-help", &out), 0) << out;
  EXPECT_NE(out.find("--checkpoint_dir"), std::string::npos) << out;
}

// Every `#include "edl/..."` of an installed header names an installed header: the public API
// compiles from include/ alone.
TEST_F(InstallTest, InstalledHeadersIncludeOnlyInstalledHeaders) {
  const std::string inc = Prefix() + "/include";
  ASSERT_TRUE(fs::exists(inc + "/edl/runtime/elastic_trainer.h"));
  ASSERT_TRUE(fs::exists(inc + "/edl/runtime/trainable.h"));
  const std::regex re(R"re(#include "(edl/[^"]+)")re");
  int headers = 0;
  for (const auto& e : fs::recursive_directory_iterator(inc)) {
    if (!e.is_regular_file()) continue;
    ++headers;
    const std::string text = Slurp(e.path().string());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it) {
      EXPECT_TRUE(fs::exists(inc + "/" + (*it)[1].str()))
          << e.path() << " includes " << (*it)[1].str() << ", which is not installed";
    }
  }
  EXPECT_GE(headers, 10);
}

// examples/cpp as a project of its own: find_package(edl) from the moved prefix, edl::runtime.
TEST_F(InstallTest, ExampleTrainerBuildsAgainstThePackageAndTrains) {
  const std::string build = dir_->Join("example");
  std::string out;
  ASSERT_EQ(Run({EDL_CMAKE, "-S", test::SourceDir() + "/examples/cpp", "-B", build,
                 "-DCMAKE_PREFIX_PATH=" + Prefix(), "-DCMAKE_BUILD_TYPE=Release",
                 std::string("-DCMAKE_CXX_COMPILER=") + EDL_CXX_COMPILER},
                "example-configure", &out),
            0)
      << out;
  EXPECT_NE(out.find(Prefix()), std::string::npos) << "found another edl than the installed one:\n"
                                                   << out;
  ASSERT_EQ(Run({EDL_CMAKE, "--build", build, "-j", "2"}, "example-build", &out), 0) << out;
  const std::string trainer = build + "/linear_trainer";

  // Alone: world size 1.
  ASSERT_EQ(Run({trainer, "--steps", "100"}, "example-alone", &out), 0) << out;
  EXPECT_NE(out.find("standalone mode"), std::string::npos) << out;
  auto [first, last] = Losses(out);
  ASSERT_GT(first, 0) << "no final line:\n" << out;
  EXPECT_LT(last, first / 10) << "the loss did not fall:\n" << out;

  // Under the installed `edl launch`: two ranks of one static world over Gloo.
  const std::string logs = dir_->Join("launch-logs");
  ASSERT_EQ(Run({Prefix() + "/bin/edl", "launch", "--nproc_per_node", "2", "--log_dir", logs, "--",
                 trainer, "--steps", "100", "--checkpoint_dir", dir_->Join("ckpt"),
                 "--checkpoint_steps", "50"},
                "example-launch", &out),
            0)
      << out << "\n"
      << Slurp(logs + "/trainer-0.log", 4000) << Slurp(logs + "/trainer-1.log", 4000);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string t = Slurp(logs + "/trainer-" + std::to_string(rank) + ".log");
    EXPECT_NE(t.find("static mode"), std::string::npos) << t;
    std::tie(first, last) = Losses(t);
    ASSERT_GT(first, 0) << "rank " << rank << " has no final line:\n" << t;
    EXPECT_LT(last, first / 10) << t;
  }
  EXPECT_NE(Slurp(logs + "/trainer-0.log").find("world 2"), std::string::npos);
  // Rank 0 checkpointed through the installed runtime; the installed `edl ckpt` reads it back.
  ASSERT_EQ(Run({Prefix() + "/bin/edl", "ckpt", "ls", "--checkpoint_dir", dir_->Join("ckpt")},
                "ckpt-ls", &out),
            0)
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)\s*\d+\s+100\s)")))
      << "no checkpoint at step 100:\n"
      << out;
}

// The Debian package: built by cpack from this tree, it names the Debian libraries it needs, holds
// the same files as `make install` under /usr, and runs from where dpkg-deb unpacks it.
TEST_F(InstallTest, DebianPackageNamesItsDependenciesAndRuns) {
  if (std::string(EDL_DPKG_DEB).find("NOTFOUND") != std::string::npos) {
    GTEST_SKIP() << "dpkg-deb is not installed (a Debian tool: apt-get install dpkg-dev)";
  }
  const std::string pkgs = dir_->Join("packages");
  std::string out;
  ASSERT_EQ(
      Run({EDL_CPACK, "-G", "DEB", "--config", test::BuildDir() + "/CPackConfig.cmake", "-B", pkgs},
          "cpack", &out),
      0)
      << out;
  std::string deb;
  for (const auto& e : fs::directory_iterator(pkgs)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("edl_", 0) == 0 && e.path().extension() == ".deb") deb = e.path().string();
  }
  ASSERT_FALSE(deb.empty()) << "no edl_*.deb in " << pkgs << ":\n" << out;
  if (EDL_HAVE_CUDA) {
    EXPECT_TRUE(
        fs::exists(pkgs + "/" + fs::path(deb).filename().string().replace(0, 4, "edl-cuda_")))
        << "no edl-cuda package next to " << deb;
  }
  ASSERT_EQ(Run({EDL_DPKG_DEB, "-f", deb, "Package", "Depends"}, "deb-fields", &out), 0) << out;
  EXPECT_NE(out.find("Package: edl"), std::string::npos) << out;
  for (const char* dep :
       {"librocksdb", "libgoogle-glog", "libgloo", "libdnnl", "libboost-program-options"}) {
    EXPECT_NE(out.find(dep), std::string::npos) << "Depends lacks " << dep << ":\n" << out;
  }
  const std::string root = dir_->Join("root");
  ASSERT_EQ(Run({EDL_DPKG_DEB, "-x", deb, root}, "deb-extract", &out), 0) << out;
  ASSERT_TRUE(fs::exists(root + "/usr/bin/edl")) << "the package has no /usr/bin/edl";
  EXPECT_TRUE(fs::exists(root + "/usr/include/edl/runtime/elastic_trainer.h"));
  if (EDL_HAVE_PYTHON_MODULE) {  // under /usr: a directory on Debian's sys.path
    EXPECT_EQ(ImportPython(root + "/usr", "python-deb", &out), 0) << out;
  }
  EXPECT_EQ(Run({root + "/usr/bin/edl", "ckpt", "--help"}, "deb-edl", &out), 0) << out;
  EXPECT_NE(out.find("usage: edl ckpt"), std::string::npos) << out;
  if (!EDL_HAVE_CUDA) return;
  // The CUDA plugin's package: it depends on this exact edl, and unpacked over it, `edl train
  // --device cuda` loads the plugin from the package's lib directory and gets as far as asking the
  // driver for a GPU (on a machine without one: the clear "no usable GPU" error, not a missing or
  // mismatched plugin).
  const std::string cuda_deb =
      pkgs + "/" + fs::path(deb).filename().string().replace(0, 4, "edl-cuda_");
  ASSERT_EQ(Run({EDL_DPKG_DEB, "-f", cuda_deb, "Package", "Depends"}, "cuda-deb-fields", &out), 0)
      << out;
  EXPECT_NE(out.find("Package: edl-cuda"), std::string::npos) << out;
  EXPECT_NE(out.find("edl (= "), std::string::npos) << "edl-cuda must depend on its own edl:\n"
                                                    << out;
  ASSERT_EQ(Run({EDL_DPKG_DEB, "-x", cuda_deb, root}, "cuda-deb-extract", &out), 0) << out;
  const int rc = Run({root + "/usr/bin/edl", "train", "--device", "cuda", "--model", "resnet20",
                      "--data", "synthetic", "--max_steps", "1"},
                     "deb-edl-cuda", &out);
  if (rc == 0) return;  // a machine with a GPU: it trained
  EXPECT_EQ(out.find("CUDA plugin"), std::string::npos) << "the packaged plugin did not load:\n"
                                                        << out;
  EXPECT_NE(out.find("--device cuda"), std::string::npos) << out;
}

}  // namespace
}  // namespace edl
