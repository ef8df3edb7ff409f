#include "edl/proto/frame.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::proto {
namespace {

using nlohmann::json;

TEST(FrameTest, RoundTrip) {
  json msg = {{"type", "heartbeat"}, {"x", 1}};
  std::string buf = EncodeFrame(msg) + EncodeFrame(json{{"type", "b"}});
  json out;
  size_t used = 0;
  ASSERT_OK(DecodeFrame(buf, &out, &used));
  EXPECT_EQ(out, msg);
  buf.erase(0, used);
  ASSERT_OK(DecodeFrame(buf, &out, &used));
  EXPECT_EQ(out["type"], "b");
  EXPECT_EQ(used, buf.size());
}

TEST(FrameTest, TruncatedIsIncomplete) {
  const std::string buf = EncodeFrame(json{{"type", "heartbeat"}});
  json out;
  size_t used = 0;
  for (size_t n = 0; n < buf.size(); ++n) {
    Status s = DecodeFrame(buf.substr(0, n), &out, &used);
    EXPECT_EQ(s.code(), Status::Code::kUnavailable) << n;
  }
}

TEST(FrameTest, RejectsBadHeaders) {
  std::string good = EncodeFrame(json{{"type", "t"}});
  json out;
  size_t used = 0;
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_TRUE(DecodeFrame(bad, &out, &used).IsCorruption());
  bad = good;
  bad[5] = 9;  // version
  EXPECT_TRUE(DecodeFrame(bad, &out, &used).IsCorruption());
  bad = good;
  bad[7] = 1;  // reserved
  EXPECT_TRUE(DecodeFrame(bad, &out, &used).IsCorruption());
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(0, header);
  uint32_t len = 0;
  EXPECT_TRUE(DecodeFrameHeader(header, kMaxFrameBytes, &len).IsCorruption());
}

TEST(FrameTest, RejectsOversizeFromHeaderAlone) {
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(kMaxFrameBytes + 1, header);
  uint32_t len = 0;
  Status s = DecodeFrameHeader(header, kMaxFrameBytes, &len);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.ToString();
  EncodeFrameHeader(100, header);
  EXPECT_TRUE(DecodeFrameHeader(header, 99, &len).IsCorruption());
}

TEST(FrameTest, RejectsBadPayloads) {
  json out;
  for (const std::string& p : std::vector<std::string>{"{not json", "[1,2]", "\"str\"", "{}", "{\"type\":3}", "{\"type\":\"\"}",
                              std::string("\xff\xfe", 2)}) {
    EXPECT_TRUE(DecodePayload(p.data(), p.size(), &out).IsCorruption()) << p;
  }
  const std::string ok = R"({"type":"x"})";
  EXPECT_OK(DecodePayload(ok.data(), ok.size(), &out));
}

TEST(FrameTest, InvalidUtf8IsReplacedNotThrown) {
  json msg = {{"type", "event"}, {"s", std::string("\xff\xfe", 2)}};
  const std::string frame = EncodeFrame(msg);
  json out;
  size_t used = 0;
  EXPECT_OK(DecodeFrame(frame, &out, &used));
}

}  // namespace
}  // namespace edl::proto
