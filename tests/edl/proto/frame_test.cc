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
  bad[7] = 2;  // an unknown flag
  EXPECT_TRUE(DecodeFrame(bad, &out, &used).IsCorruption());
  bad = good;
  bad[7] = 1;  // sealed where an unsealed frame is expected
  EXPECT_TRUE(DecodeFrame(bad, &out, &used).IsCorruption());
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(0, header);
  uint32_t len = 0;
  EXPECT_TRUE(DecodeFrameHeader(header, kMaxFrameBytes, false, &len).IsCorruption());
}

TEST(FrameTest, SealedFlagMustMatchTheConnectionState) {
  char header[kFrameHeaderBytes];
  uint32_t len = 0;
  EncodeFrameHeader(100, header);
  Status s = DecodeFrameHeader(header, kMaxFrameBytes, /*expect_sealed=*/true, &len);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("unsealed frame after the handshake"), std::string::npos)
      << s.ToString();
  EncodeFrameHeader(100 + kSealTagBytes, header, kFrameSealed);
  ASSERT_OK(DecodeFrameHeader(header, kMaxFrameBytes, true, &len));
  EXPECT_EQ(len, 100 + kSealTagBytes);
  EXPECT_TRUE(DecodeFrameHeader(header, kMaxFrameBytes, false, &len).IsCorruption());
  // A sealed frame must hold more than its MAC, and the limit applies to the payload alone.
  EncodeFrameHeader(kSealTagBytes, header, kFrameSealed);
  EXPECT_TRUE(DecodeFrameHeader(header, kMaxFrameBytes, true, &len).IsCorruption());
  EncodeFrameHeader(100 + kSealTagBytes, header, kFrameSealed);
  ASSERT_OK(DecodeFrameHeader(header, 100, true, &len));
  EXPECT_TRUE(DecodeFrameHeader(header, 99, true, &len).IsCorruption());
}

TEST(FrameTest, RejectsOversizeFromHeaderAlone) {
  char header[kFrameHeaderBytes];
  EncodeFrameHeader(kMaxFrameBytes + 1, header);
  uint32_t len = 0;
  Status s = DecodeFrameHeader(header, kMaxFrameBytes, false, &len);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.ToString();
  EncodeFrameHeader(100, header);
  EXPECT_TRUE(DecodeFrameHeader(header, 99, false, &len).IsCorruption());
  // Before authentication a much smaller limit applies; a hello fits easily.
  EncodeFrameHeader(kMaxPreAuthFrameBytes + 1, header);
  EXPECT_TRUE(DecodeFrameHeader(header, kMaxPreAuthFrameBytes, false, &len).IsCorruption());
  EXPECT_LT(kMaxPreAuthFrameBytes, kMaxFrameBytes / 16);
}

TEST(FrameTest, RejectsBadPayloads) {
  json out;
  for (const std::string& p :
       std::vector<std::string>{"{not json", "[1,2]", "\"str\"", "{}", "{\"type\":3}",
                                "{\"type\":\"\"}", std::string("\xff\xfe", 2)}) {
    EXPECT_TRUE(DecodePayload(p.data(), p.size(), &out).IsCorruption()) << p;
  }
  const std::string ok = R"({"type":"x"})";
  EXPECT_OK(DecodePayload(ok.data(), ok.size(), &out));
}

TEST(FrameTest, InvalidUtf8IsReplacedNotThrown) {
  json msg = {{"type", "event"}, {"s", std::string("a\xff\xfe", 3)}};
  const std::string frame = EncodeFrame(msg);
  json out;
  size_t used = 0;
  ASSERT_OK(DecodeFrame(frame, &out, &used));
  EXPECT_EQ(used, frame.size());
  // Each invalid byte became U+FFFD (EF BF BD); the valid prefix survived.
  EXPECT_EQ(out["s"].get<std::string>(), "a\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(FrameTest, DeepNestingIsRejectedBeforeParsing) {
  // 80 000 levels: would exhaust the stack of a recursive parser or printer.
  const int kDeep = 80000;
  std::string deep =
      R"({"type":"hello","slots":)" + std::string(kDeep, '[') + std::string(kDeep, ']') + "}";
  json out;
  Status s = DecodePayload(deep.data(), deep.size(), &out);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("nests deeper than 32"), std::string::npos) << s.ToString();
  EXPECT_LT(s.message().size(), 200u);  // nothing of the payload is echoed at length
  // Unbalanced too (the scan stops at the limit, it does not need the closing brackets).
  deep = R"({"type":"x","a":)" + std::string(1 << 20, '{');
  EXPECT_TRUE(DecodePayload(deep.data(), deep.size(), &out).IsCorruption());

  // Exactly the limit is fine; brackets inside strings (and escaped quotes) do not count.
  std::string ok = R"({"type":"x","a":)" + std::string(kMaxJsonDepth - 1, '[') +
                   std::string(kMaxJsonDepth - 1, ']') + R"(,"s":"[[[[\"{{{{)" +
                   std::string(100, '[') + "\"}";
  ASSERT_OK(DecodePayload(ok.data(), ok.size(), &out));
  std::string over = R"({"type":"x","a":)" + std::string(kMaxJsonDepth, '[') +
                     std::string(kMaxJsonDepth, ']') + "}";
  EXPECT_TRUE(DecodePayload(over.data(), over.size(), &out).IsCorruption());
  EXPECT_OK(CheckJsonDepth(over.data(), over.size(), kMaxJsonDepth + 1));
}

TEST(FrameTest, TypeIsShortAndPlain) {
  json out;
  for (const std::string& p : {std::string(R"({"type":"Hello"})"), std::string(R"({"type":"a b"})"),
                               R"({"type":")" + std::string(kMaxTypeBytes + 1, 'a') + "\"}",
                               std::string(R"({"type":"x\u0000"})")}) {
    Status s = DecodePayload(p.data(), p.size(), &out);
    EXPECT_TRUE(s.IsCorruption()) << p;
    EXPECT_LT(s.message().size(), 200u) << s.ToString();
  }
  const std::string ok = R"({"type":"trainer_exit"})";
  EXPECT_OK(DecodePayload(ok.data(), ok.size(), &out));
}

TEST(FrameTest, QuoteIsShortPrintableAndSaysWhatWasCut) {
  EXPECT_EQ(Quote("abc"), "'abc'");
  EXPECT_EQ(Quote(std::string("a\n\x01'\\", 5)), "'a\\x0a\\x01\\'\\\\'");
  EXPECT_EQ(Escape("don't \\"), "don't \\\\");  // readable: a quote needs no escape outside quotes
  const std::string big(100000, 'x');
  const std::string q = Quote(big);
  EXPECT_EQ(q, "'" + std::string(64, 'x') + "'...(+" + std::to_string(100000 - 64) + " bytes)");
  EXPECT_EQ(Escape("a\x7f"
                   "b",
                   5),
            "a\\x7f...(+1 bytes)");
  EXPECT_LE(QuoteJson(json::array({big, big})).size(), 64u + 30u);
}

}  // namespace
}  // namespace edl::proto
