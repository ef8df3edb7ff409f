// etcd's JSON gateway replies parsed as hostile bytes (jobserver/state/etcd_client.h): wrong types,
// bad base64, numbers out of range, too deep, too big, the gateway's error form.
#include "jobserver/state/etcd_client.h"

#include <gtest/gtest.h>

namespace edl::jobserver {
namespace {

using nlohmann::json;

json Parse(const std::string& s) {
  json j;
  Status st = ParseEtcdReply(s, 1 << 20, &j);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return j;
}

TEST(EtcdClientTest, ParsesTheGatewaysRangeTxnAndLeaseReplies) {
  std::vector<EtcdKv> kvs;
  const char* range = R"({"header":{"revision":"3"},"kvs":[{"key":"am9iL3gvbWV0YQ==",
      "create_revision":"2","mod_revision":"3","version":"2","value":"eyJ2IjoxfQ=="}],)"
                      R"("count":"1"})";
  ASSERT_TRUE(ParseRangeReply(Parse(range), &kvs).ok());
  ASSERT_EQ(kvs.size(), 1u);
  EXPECT_EQ(kvs[0].key, "job/x/meta");
  EXPECT_EQ(kvs[0].value, "{\"v\":1}");
  EXPECT_EQ(kvs[0].create_revision, 2);
  EXPECT_EQ(kvs[0].mod_revision, 3);
  ASSERT_TRUE(ParseRangeReply(Parse(R"({"header":{"revision":"3"}})"), &kvs).ok());
  EXPECT_TRUE(kvs.empty());  // no "kvs": nothing stored

  bool ok = true;
  std::vector<std::vector<EtcdKv>> ranges;
  // "succeeded" false is left out by the gateway.
  ASSERT_TRUE(ParseTxnReply(Parse(R"({"responses":[{"response_range":{"kvs":[{"key":"YQ==",
      "create_revision":"7","mod_revision":"7","lease":"99"}]}}]})"),
                            &ok, &ranges)
                  .ok());
  EXPECT_FALSE(ok);
  ASSERT_EQ(ranges.size(), 1u);
  ASSERT_EQ(ranges[0].size(), 1u);
  EXPECT_EQ(ranges[0][0].key, "a");
  EXPECT_EQ(ranges[0][0].value, "");
  EXPECT_EQ(ranges[0][0].lease, 99);
  ASSERT_TRUE(
      ParseTxnReply(Parse(R"({"succeeded":true,"responses":[{"response_put":{}}]})"), &ok, &ranges)
          .ok());
  EXPECT_TRUE(ok);
  EXPECT_EQ(ranges.size(), 1u);

  int64_t id = 0, ttl = 0;
  ASSERT_TRUE(
      ParseLeaseGrantReply(Parse(R"({"ID":"4111120199811993093","TTL":"5"})"), &id, &ttl).ok());
  EXPECT_EQ(id, 4111120199811993093);
  EXPECT_EQ(ttl, 5);
  ASSERT_TRUE(ParseKeepAliveReply(Parse(R"({"result":{"ID":"1","TTL":"4"}})"), &ttl).ok());
  EXPECT_EQ(ttl, 4);
  ASSERT_TRUE(ParseKeepAliveReply(Parse(R"({"result":{"ID":"1"}})"), &ttl).ok());
  EXPECT_EQ(ttl, 0) << "an expired lease's keepalive has no TTL";
}

TEST(EtcdClientTest, RefusesHostileReplies) {
  json j;
  // Not JSON, not an object, too deep, too big.
  EXPECT_TRUE(ParseEtcdReply("{\"kvs\":[", 1 << 20, &j).IsCorruption());
  EXPECT_TRUE(ParseEtcdReply("[1,2]", 1 << 20, &j).IsCorruption());
  EXPECT_TRUE(
      ParseEtcdReply(std::string(100, '[') + std::string(100, ']'), 1 << 20, &j).IsCorruption());
  EXPECT_TRUE(
      ParseEtcdReply("{\"a\":\"" + std::string(2000, 'x') + "\"}", 1000, &j).IsCorruption());
  // The gateway's error form is an error, quoted without control bytes.
  Status s = ParseEtcdReply(
      R"({"error":"etcdserver: too many operations in txn request\u0007","code":3})", 1 << 20, &j);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_NE(s.message().find("too many operations"), std::string::npos) << s.ToString();
  EXPECT_EQ(s.message().find('\a'), std::string::npos);

  std::vector<EtcdKv> kvs;
  const char* bad_ranges[] = {
      R"({"kvs":{"key":"YQ=="}})",                                             // not a list
      R"({"kvs":[1]})",                                                        // not objects
      R"({"kvs":[{"key":7}]})",                                                // key not a string
      R"({"kvs":[{"key":"YQ"}]})",                                             // base64 length
      R"({"kvs":[{"key":"Y!=="}]})",                                           // base64 alphabet
      R"({"kvs":[{"key":"YQ==YQ=="}]})",                                       // data after padding
      R"({"kvs":[{"key":""}]})",                                               // empty key
      R"({"kvs":[{"key":"YQ==","create_revision":"12x"}]})",                   // not a number
      R"({"kvs":[{"key":"YQ==","create_revision":"99999999999999999999"}]})",  // over int64
      R"({"kvs":[{"key":"YQ==","create_revision":1.5}]})",                     // not an integer
      R"({"kvs":[{"key":"YQ==","create_revision":"5","mod_revision":"4"}]})",  // out of order
      R"({"kvs":[{"key":"YQ==","lease":"-1"}]})",                              // negative lease
      R"({"kvs":[{"key":"YQ==","value":["x"]}]})",                             // value not a string
  };
  for (const char* r : bad_ranges) {
    EXPECT_TRUE(ParseRangeReply(json::parse(r), &kvs).IsCorruption()) << r;
  }
  const std::string long_key =
      "{\"kvs\":[{\"key\":\"" + EncodeBase64(std::string(kMaxEtcdKeyBytes + 3, 'k')) + "\"}]}";
  EXPECT_TRUE(ParseRangeReply(json::parse(long_key), &kvs).IsCorruption());

  bool ok = false;
  std::vector<std::vector<EtcdKv>> ranges;
  EXPECT_TRUE(ParseTxnReply(json::parse(R"({"succeeded":"true"})"), &ok, &ranges).IsCorruption());
  EXPECT_TRUE(ParseTxnReply(json::parse(R"({"responses":[{"response_range":[]}]})"), &ok, &ranges)
                  .IsCorruption());
  EXPECT_TRUE(
      ParseTxnReply(json::parse(R"({"responses":[{"response_range":{"kvs":[{"key":5}]}}]})"), &ok,
                    &ranges)
          .IsCorruption());
  int64_t id = 0, ttl = 0;
  EXPECT_TRUE(
      ParseLeaseGrantReply(json::parse(R"({"TTL":"5"})"), &id, &ttl).IsCorruption());  // no ID
  EXPECT_TRUE(
      ParseLeaseGrantReply(json::parse(R"({"ID":"-3","TTL":"5"})"), &id, &ttl).IsCorruption());
  EXPECT_TRUE(ParseKeepAliveReply(json::parse(R"({"result":"x"})"), &ttl).IsCorruption());
  EXPECT_TRUE(ParseKeepAliveReply(json::parse(R"({"TTL":true})"), &ttl).IsCorruption());
}

TEST(EtcdClientTest, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n < 6; ++n) {
    std::string out;
    ASSERT_TRUE(DecodeBase64(EncodeBase64(all.substr(0, all.size() - n)), &out).ok());
    EXPECT_EQ(out, all.substr(0, all.size() - n));
  }
  std::string out;
  EXPECT_FALSE(DecodeBase64("YQ===", &out).ok());
  EXPECT_FALSE(DecodeBase64("Y===", &out).ok());
}

TEST(EtcdClientTest, ParsesStateStoreUrlsAndPrefixEnds) {
  std::vector<EtcdEndpoint> e;
  ASSERT_TRUE(ParseEtcdUrl("etcd://127.0.0.1:2379,h2:2380", &e).ok());
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].host, "h2");
  EXPECT_EQ(e[1].port, 2380);
  for (const char* bad :
       {"", "etcd://", "http://h:1", "etcd://h", "etcd://h:0", "etcd://h:1,", "etcd://h:99999"}) {
    Status s = ParseEtcdUrl(bad, &e);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("etcd://HOST:PORT"), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(EtcdPrefixEnd("job/a/"), "job/a0");
  EXPECT_EQ(EtcdPrefixEnd(std::string("a\xff", 2)), "b");
}

TEST(EtcdClientTest, AnEndpointThatDoesNotListenIsUnavailableNamingIt) {
  EtcdClientOptions o;
  o.endpoints = {{"127.0.0.1", 1}};
  o.timeout = std::chrono::milliseconds(2000);
  EtcdClient c(o);
  std::vector<EtcdKv> kvs;
  Status s = c.Range("a", "", &kvs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace edl::jobserver
