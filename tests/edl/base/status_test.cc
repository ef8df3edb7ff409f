#include "edl/base/status.h"

#include <cerrno>

#include <gtest/gtest.h>

#include "edl/base/clock.h"
#include "tests/testutil.h"

namespace edl {
namespace {

TEST(StatusTest, OkAndErrors) {
  EXPECT_OK(Status::OK());
  Status s = Status::Corruption("frame magic 0x1234 != 0xED1F");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.ToString(), "Corruption: frame magic 0x1234 != 0xED1F");
  EXPECT_EQ(s.WithContext("conn 7").message(), "conn 7: frame magic 0x1234 != 0xED1F");
  EXPECT_TRUE(Status::OK().WithContext("x").ok());
}

TEST(StatusTest, PosixErrorMapsCodes) {
  EXPECT_TRUE(PosixError("/no/such", ENOENT).IsNotFound());
  EXPECT_EQ(PosixError("127.0.0.1:1", ECONNREFUSED).code(), Status::Code::kUnavailable);
  EXPECT_NE(PosixError("/x", EACCES).message().find("/x"), std::string::npos);
}

TEST(StatusTest, StatusOrCarriesValueOrError) {
  StatusOr<int> v(42);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.value(), 42);
  StatusOr<int> e(Status::Timeout("kv wait"));
  EXPECT_TRUE(e.status().IsTimeout());
}

TEST(ClockTest, ManualClockAdvances) {
  ManualClock c(5);
  c.Advance(10);
  EXPECT_EQ(c.NowMicros(), 15);
  const int64_t a = Clock::Real()->NowMicros();
  EXPECT_GE(Clock::Real()->NowMicros(), a);
}

}  // namespace
}  // namespace edl
