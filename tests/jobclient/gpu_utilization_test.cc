// GpuUtilization: NVML through dlopen. Without the driver's library (or with a library that is not
// NVML) Open fails naming the library and the problem and Sample() is -1 ("n/a"); where the
// driver is installed (a GPU machine) it measures every GPU in 0..100.
#include "jobclient/gpu_utilization.h"

#include <dlfcn.h>

#include <gtest/gtest.h>

namespace edl::jobclient {
namespace {

TEST(GpuUtilizationTest, AMissingLibraryIsNotMeasured) {
  GpuUtilization g;
  const Status s = g.Open({}, "libnvidia-ml-edl-test-absent.so.1");
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find("libnvidia-ml-edl-test-absent.so.1"), std::string::npos)
      << s.message();
  EXPECT_EQ(g.Sample(), -1);
  EXPECT_EQ(g.devices(), 0);
}

TEST(GpuUtilizationTest, ALibraryThatIsNotNvmlIsNotMeasured) {
  GpuUtilization g;
  const Status s = g.Open({}, "libm.so.6");  // loads, but has no NVML symbol
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("nvmlInit_v2"), std::string::npos) << s.message();
  EXPECT_EQ(g.Sample(), -1);
}

TEST(GpuUtilizationTest, TheDriversNvmlMeasuresEveryGpu) {
  void* probe = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (probe == nullptr) GTEST_SKIP() << "no libnvidia-ml.so.1 on this machine (no NVIDIA driver)";
  ::dlclose(probe);
  GpuUtilization g;
  const Status s = g.Open({});
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_GE(g.devices(), 1);
  const double u = g.Sample();
  EXPECT_GE(u, 0.0);
  EXPECT_LE(u, 100.0);
  GpuUtilization one;
  ASSERT_TRUE(one.Open({0}).ok());
  EXPECT_EQ(one.devices(), 1);
  const Status bad = one.Open({g.devices()});  // one past the last device
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument) << bad.ToString();
  EXPECT_EQ(one.Sample(), -1);
}

}  // namespace
}  // namespace edl::jobclient
