// The CUDA plugin loader (edl/runtime/cuda_plugin.h) and --comm selection, on CPU: every way the
// plugin can be missing or wrong is one clear FailedPrecondition naming the file and the fix; in a
// CUDA build the real plugin loads (dlopen needs no GPU) and carries its entry points.
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "edl/config.h"
#include "edl/runtime/comm/communicator.h"
#include "edl/runtime/cuda_plugin.h"
#include "edl/runtime/elastic_trainer.h"
#include "tests/testutil.h"

namespace edl::runtime {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Sets EDL_CUDA_PLUGIN for one scope.
class PluginEnv {
 public:
  explicit PluginEnv(const std::string& path) { ::setenv("EDL_CUDA_PLUGIN", path.c_str(), 1); }
  ~PluginEnv() { ::unsetenv("EDL_CUDA_PLUGIN"); }
};

// The failure cases run before any successful load (a loaded plugin stays loaded), so they come
// first in one test.
TEST(CudaPluginTest, MissingBrokenOrForeignPluginIsAClearError) {
  test::ScratchDir dir("cuda_plugin");
  {
    PluginEnv env(dir.Join("absent/libedl_cuda.so"));
    Status s = LoadCudaPlugin();
    EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), dir.Join("absent/libedl_cuda.so"))) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "does not exist")) << s.ToString();
  }
  {
    const std::string garbage = dir.Join("libedl_cuda.so");
    std::ofstream(garbage) << "not an ELF file\n";
    PluginEnv env(garbage);
    Status s = LoadCudaPlugin();
    EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "could not load the CUDA plugin " + garbage)) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "LD_LIBRARY_PATH")) << s.ToString();
    EXPECT_EQ(CudaPluginPath(), "");
  }
  {
    PluginEnv env(FAKE_CUDA_PLUGIN);
    Status s = LoadCudaPlugin();
    EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "another edl build")) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), EDL_CUDA_PLUGIN_ABI)) << s.ToString();
    // Every entry point answers with the same error rather than calling into that library.
    auto sym = CudaPluginSymbol("edl_cuda_new_nccl_communicator_v1");
    EXPECT_EQ(sym.status().code(), Status::Code::kFailedPrecondition);
    CommOptions o;
    auto comm = CreateNcclCommunicator(o);
    EXPECT_EQ(comm.status().code(), Status::Code::kFailedPrecondition);
    EXPECT_TRUE(Contains(comm.status().message(), "--comm gloo")) << comm.status().ToString();
  }
}

#if EDL_HAVE_CUDA
// The build writes the plugin next to libedl.so, where the loader looks without EDL_CUDA_PLUGIN.
TEST(CudaPluginTest, BuiltPluginLoadsNextToLibedlAndHasItsEntryPoints) {
  ASSERT_OK(LoadCudaPlugin());
  EXPECT_EQ(CudaPluginPath(), std::string(EDL_BUILD_DIR) + "/libedl_cuda.so");
  EXPECT_TRUE(CudaPluginSymbol("edl_resnet50_new_cuda_backend_v1").ok());
  EXPECT_EQ(CudaPluginSymbol("edl_cuda_new_nccl_communicator_v1").ok(), EDL_HAVE_NCCL == 1);
  EXPECT_EQ(NcclAvailable(), EDL_HAVE_NCCL == 1);
  EXPECT_EQ(CudaPluginSymbol("no_such_entry").status().code(), Status::Code::kNotFound);
}
#endif

// NCCL's socket transport uses the interface of the address the trainer advertises, unless the
// user chose one: never NCCL's own guess when the trainer knows better.
TEST(CommSelectionTest, NcclSocketIfnameIsTheAdvertisedAddresssInterfaceUnlessSet) {
  EXPECT_EQ(InterfaceOfAddress("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceOfAddress("::1"), "lo");
  EXPECT_EQ(InterfaceOfAddress("192.0.2.77"), "") << "an address of no interface here (TEST-NET-1)";
  EXPECT_EQ(InterfaceOfAddress("not-an-ip"), "");
  const char* before = std::getenv("NCCL_SOCKET_IFNAME");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("NCCL_SOCKET_IFNAME");
  EXPECT_EQ(DefaultNcclSocketIfname("192.0.2.77"), "") << "no interface: NCCL guesses";
  EXPECT_EQ(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_EQ(DefaultNcclSocketIfname("127.0.0.1"), "=lo");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "=lo");
  ::setenv("NCCL_SOCKET_IFNAME", "eth", 1);  // the user's choice stands
  EXPECT_EQ(DefaultNcclSocketIfname("127.0.0.1"), "eth");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "eth");
  if (saved.empty()) {
    ::unsetenv("NCCL_SOCKET_IFNAME");
  } else {
    ::setenv("NCCL_SOCKET_IFNAME", saved.c_str(), 1);
  }
}

TEST(CommSelectionTest, AutoPicksNcclOnlyForDeviceTensorsWithNccl) {
  EXPECT_EQ(SelectCommBackend("auto", /*on_device=*/true, /*nccl=*/true).value(), "nccl");
  EXPECT_EQ(SelectCommBackend("auto", false, true).value(), "gloo");
  EXPECT_EQ(SelectCommBackend("auto", false, false).value(), "gloo");
  // A CUDA build without NCCL: Gloo with staged gradients.
  EXPECT_EQ(SelectCommBackend("auto", true, false).value(), "gloo");
  EXPECT_EQ(SelectCommBackend("gloo", true, true).value(), "gloo");
  EXPECT_EQ(SelectCommBackend("gloo", false, false).value(), "gloo");
  EXPECT_EQ(SelectCommBackend("nccl", true, true).value(), "nccl");
}

TEST(CommSelectionTest, NcclOnHostTensorsUnknownNamesAndMissingNcclAreErrors) {
  auto cpu = SelectCommBackend("nccl", /*on_device=*/false, /*nccl=*/true);
  EXPECT_EQ(cpu.status().code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(cpu.status().message(), "--device cuda")) << cpu.status().ToString();
  EXPECT_TRUE(Contains(cpu.status().message(), "--comm gloo")) << cpu.status().ToString();
  auto missing = SelectCommBackend("nccl", true, false);
  EXPECT_EQ(missing.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(missing.status().message(), "EDL_USE_NCCL")) << missing.status().ToString();
  auto unknown = SelectCommBackend("mpi", true, true);
  EXPECT_EQ(unknown.status().code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(unknown.status().message(), "auto, nccl or gloo"));
}

}  // namespace
}  // namespace edl::runtime
