// ResolveCudaDevice (resnet50/backend.h): which GPU a trainer takes, and the error for a bad
// --cuda_device. Pure: needs no GPU.
#include <cstdlib>

#include <gtest/gtest.h>

#include "resnet50/backend.h"
#include "tests/testutil.h"

namespace edl::resnet50 {
namespace {

TEST(CudaDeviceTest, DefaultIsLocalRankModuloTheVisibleDevices) {
  EXPECT_EQ(ResolveCudaDevice(kAutoCudaDevice, 0, 8).value(), 0);
  EXPECT_EQ(ResolveCudaDevice(kAutoCudaDevice, 5, 8).value(), 5);
  EXPECT_EQ(ResolveCudaDevice(kAutoCudaDevice, 11, 8).value(), 3);
  // One visible device (edl client --gpus gives each slot its own): always 0.
  EXPECT_EQ(ResolveCudaDevice(kAutoCudaDevice, 6, 1).value(), 0);
}

TEST(CudaDeviceTest, AnExplicitDeviceWinsWhenItExists) {
  EXPECT_EQ(ResolveCudaDevice(2, 7, 4).value(), 2);
  EXPECT_EQ(ResolveCudaDevice(0, 3, 1).value(), 0);
}

TEST(CudaDeviceTest, OutOfRangeIsOneErrorNamingTheFlagAndTheFix) {
  ::setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
  auto bad = ResolveCudaDevice(2, 0, 2);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  const std::string m = bad.status().message();
  EXPECT_NE(m.find("--cuda_device 2"), std::string::npos) << m;
  EXPECT_NE(m.find("2 CUDA devices visible"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES=4,5"), std::string::npos) << m;
  EXPECT_NE(m.find("0..1"), std::string::npos) << m;
  EXPECT_EQ(ResolveCudaDevice(-3, 0, 2).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ResolveCudaDevice(kAutoCudaDevice, 0, 0).status().code(),
            Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace edl::resnet50
