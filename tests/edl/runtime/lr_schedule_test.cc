#include "edl/runtime/lr_schedule.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::runtime {
namespace {

TEST(LrScheduleTest, LinearScalingWarmupAndCosine) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.base_batch = 256;
  o.warmup_epochs = 1;
  o.warmup_start_factor = 0.0;
  o.decay = "cosine";
  o.total_epochs = 3;
  LrSchedule s(o);
  ASSERT_OK(s.Validate());
  EXPECT_DOUBLE_EQ(s.At(0.5, 512), 0.1);    // half-way through warm-up of a 0.2 peak
  EXPECT_DOUBLE_EQ(s.At(1.0, 512), 0.2);    // peak = 0.1 * 512 / 256
  EXPECT_NEAR(s.At(2.0, 512), 0.1, 1e-12);  // cosine half-way
  EXPECT_NEAR(s.At(3.0, 512), 0.0, 1e-12);
}

TEST(LrScheduleTest, StepDecay) {
  LrScheduleOptions o;
  o.base_lr = 1.0;
  o.base_batch = 0;  // no scaling
  o.decay = "step";
  o.milestones = {2, 4};
  o.gamma = 0.5;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.At(1.9, 64), 1.0);
  EXPECT_DOUBLE_EQ(s.At(2.0, 64), 0.5);
  EXPECT_DOUBLE_EQ(s.At(5.0, 64), 0.25);
}

TEST(LrScheduleTest, RampAfterReform) {
  LrScheduleOptions o;
  o.rescale_ramp_steps = 4;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.Ramp(0.4, 0.2, 0), 0.25);
  EXPECT_DOUBLE_EQ(s.Ramp(0.4, 0.2, 3), 0.4);
  EXPECT_DOUBLE_EQ(s.Ramp(0.4, 0.2, 10), 0.4);
}

TEST(LrScheduleTest, ValidateNamesTheFlag) {
  LrScheduleOptions o;
  o.decay = "linear";
  EXPECT_NE(LrSchedule(o).Validate().message().find("--lr_decay"), std::string::npos);
}

}  // namespace
}  // namespace edl::runtime
