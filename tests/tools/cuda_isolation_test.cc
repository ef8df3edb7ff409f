// CUDA stays in its plugin (edl/runtime/cuda_plugin.h): real `edl` processes that are not CUDA
// trainers map no CUDA library. An idle `edl server` and a CPU `edl train` are checked through
// /proc/<pid>/maps while they run; short-lived roles (`edl ctl`, `--help` of the others) through
// the dynamic loader's own trace (LD_DEBUG=libs), which names every library it initialises. Also
// prints the idle server's resident set (docs/GPU.md, "The CUDA plugin"). The isolation cases are
// compiled only in a tree that builds the CUDA plugin (EDL_TREE_HAS_CUDA): without it nothing could
// map CUDA and they could not fail. The refusals at the end hold in every tree.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::Proc;
using itest::Slurp;
using itest::WaitFor;
using std::chrono::milliseconds;

const std::vector<std::string> kCudaLibs = {"libcudart", "libcublas",  "libcudnn",
                                            "libnccl",   "libcuda.so", "libedl_cuda"};

// The CUDA libraries named in `text` (maps or a loader trace), e.g. "libcudart libnccl".
std::string CudaLibsIn(const std::string& text) {
  std::string found;
  for (const std::string& lib : kCudaLibs) {
    if (text.find(lib) != std::string::npos) found += (found.empty() ? "" : " ") + lib;
  }
  return found;
}

class CudaIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = dir_.Join("secret");
    itest::WriteSecretFile(secret_, "cuda-isolation-test-secret-0123456789");
  }
  // Runs `edl args...` to completion with the loader's trace in its log; returns the log.
  std::string Traced(const std::vector<std::string>& args, const std::string& name, int* rc) {
    std::vector<std::string> argv = {test::EdlBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir_.Join(name + ".log");
    Proc p(argv, log, {{"LD_DEBUG", "libs"}});
    *rc = p.Wait(milliseconds(60000));
    return Slurp(log);
  }
  test::ScratchDir dir_{"cuda_isolation"};
  std::string secret_;
};

#if EDL_TREE_HAS_CUDA
TEST_F(CudaIsolationTest, IdleServerAndCtlMapNoCudaLibrary) {
  Proc server({test::EdlBinary(), "server", "--server_port", "0", "--bind", "127.0.0.1",
               "--port_file", dir_.Join("port"), "--secret_file", secret_, "--job_id", "iso",
               "--trainers", "1", "--min_trainers", "1", "--events_dir", dir_.Join("events")},
              dir_.Join("server.log"));
  const std::string port = itest::WaitForPortFile(dir_.Join("port"), &server);
  ASSERT_FALSE(port.empty()) << Slurp(dir_.Join("server.log"));
  const std::string maps = Slurp("/proc/" + std::to_string(server.pid()) + "/maps");
  ASSERT_NE(maps.find("libedl.so"), std::string::npos) << "the maps were not read";
  EXPECT_EQ(CudaLibsIn(maps), "") << "an idle edl server maps CUDA";
  const int64_t rss_kb = itest::ProcStatusKb(server.pid(), "VmRSS");
  ASSERT_GT(rss_kb, 0);
  std::cout << "idle edl server: VmRSS " << rss_kb << " KiB (" << rss_kb / 1024 << " MiB), VmHWM "
            << itest::ProcStatusKb(server.pid(), "VmHWM") << " KiB\n";
  RecordProperty("idle_server_rss_kb", static_cast<int>(rss_kb));

  int rc = -1;
  const std::string ctl = Traced(
      {"ctl", "--server", "127.0.0.1:" + port, "--secret_file", secret_, "status"}, "ctl", &rc);
  EXPECT_EQ(rc, 0) << ctl.substr(0, 4000);
  ASSERT_NE(ctl.find("libedl.so"), std::string::npos) << "no loader trace: " << ctl.substr(0, 2000);
  EXPECT_EQ(CudaLibsIn(ctl), "") << "edl ctl loads CUDA";
}

TEST_F(CudaIsolationTest, OtherRolesLoadNoCudaLibrary) {
  for (const std::string role : {"client", "launch", "ckpt", "train"}) {
    int rc = -1;
    const std::string trace = Traced({role, "--help"}, role + "_help", &rc);
    EXPECT_EQ(rc, 0) << role << ": " << trace.substr(0, 2000);
    ASSERT_NE(trace.find("libedl.so"), std::string::npos) << role << ": no loader trace";
    EXPECT_EQ(CudaLibsIn(trace), "") << "edl " << role << " --help loads CUDA";
  }
}

TEST_F(CudaIsolationTest, CpuTrainerMapsNoCudaLibrary) {
  const std::string log = dir_.Join("train.log");
  Proc train({test::EdlBinary(), "train", "--device", "cpu", "--model", "resnet20", "--data",
              "synthetic", "--synthetic_train", "100000", "--batch_size", "4", "--threads", "1",
              "--eval", "false", "--log_every", "1"},
             log);
  // The first progress line: the model, the data and the communicator are all up.
  ASSERT_TRUE(
      WaitFor([&] { return Slurp(log).find(" loss ") != std::string::npos || !train.Running(); },
              milliseconds(240000)))
      << Slurp(log, 4000);
  ASSERT_TRUE(train.Running()) << "edl train exited: " << Slurp(log, 4000);
  const std::string maps = Slurp("/proc/" + std::to_string(train.pid()) + "/maps");
  ASSERT_NE(maps.find("libedl_resnet50.so"), std::string::npos) << "the maps were not read";
  EXPECT_EQ(CudaLibsIn(maps), "") << "a CPU trainer maps CUDA";
  EXPECT_NE(Slurp(log).find("comm gloo"), std::string::npos) << Slurp(log, 4000);
  train.ExpectExit(128 +
                   SIGTERM);  // a standalone `edl train` has no SIGTERM handler: it dies of it
  train.Stop();
}
#endif  // EDL_TREE_HAS_CUDA

TEST_F(CudaIsolationTest, CudaTrainerWithoutThePluginFailsAtStartNamingTheFix) {
  const std::string log = dir_.Join("cuda.log");
  Proc train(
      {test::EdlBinary(), "train", "--device", "cuda", "--data", "synthetic", "--max_steps", "1"},
      log, {{"EDL_CUDA_PLUGIN", dir_.Join("missing/libedl_cuda.so")}});
  EXPECT_EQ(train.Wait(milliseconds(120000)), 2) << Slurp(log, 4000);
  const std::string out = Slurp(log);
  EXPECT_NE(out.find("CUDA plugin"), std::string::npos) << out;
  EXPECT_NE(out.find("EDL_CUDA_PLUGIN"), std::string::npos) << out;
  EXPECT_NE(out.find("--device cpu"), std::string::npos) << out;
}

TEST_F(CudaIsolationTest, CommNcclOnCpuIsABadFlag) {
  const std::string log = dir_.Join("nccl_cpu.log");
  Proc train({test::EdlBinary(), "train", "--device", "cpu", "--comm", "nccl"}, log);
  EXPECT_EQ(train.Wait(milliseconds(60000)), 2) << Slurp(log, 4000);
  EXPECT_NE(Slurp(log).find("--comm nccl needs --device cuda"), std::string::npos) << Slurp(log);
}

}  // namespace
}  // namespace edl
