// Codecs of the service messages (edl/proto/service_messages.h): round trips, and every bound and
// shape check a hostile peer could hit, each with an error naming the message and the field.
#include "edl/proto/service_messages.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::proto {
namespace {

using nlohmann::json;

template <typename M>
M ServiceRoundTrip(const M& m) {
  json j;
  m.EncodeTo(&j);
  M out;
  EXPECT_OK(out.DecodeFrom(j));
  return out;
}

template <typename M>
std::string DecodeError(const json& j) {
  M m;
  const Status s = m.DecodeFrom(j);
  EXPECT_FALSE(s.ok()) << j.dump();
  return s.ToString();
}

TEST(ServiceMessagesTest, TeacherRequestRoundTripAndBounds) {
  TeacherRequest r;
  r.req_id = 9;
  r.indices = {0, 5, 59999};
  r.aug_seed = 0xfedcba9876543210ull;
  r.random_crop = true;
  r.flip = true;
  r.pad = 2;
  r.top_k = 3;
  const TeacherRequest back = ServiceRoundTrip(r);
  EXPECT_EQ(back.indices, r.indices);
  EXPECT_EQ(back.aug_seed, r.aug_seed);
  EXPECT_TRUE(back.random_crop && back.flip);
  EXPECT_EQ(back.pad, 2);
  EXPECT_EQ(back.top_k, 3);

  json j;
  r.EncodeTo(&j);
  json bad = j;
  bad["indices"] = json::array();
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("'indices' must hold 1 .. 4096"),
            std::string::npos);
  bad["indices"] = std::vector<int64_t>(kMaxTeacherBatch + 1, 1);
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("'indices'"), std::string::npos);
  bad["indices"] = json::array({1, -2});
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("not a sample index"), std::string::npos);
  bad = j;
  bad["aug_seed"] = "xyz";
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("'aug_seed'"), std::string::npos);
  bad = j;
  bad["pad"] = 65;
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("'pad' is out of range"), std::string::npos);
  bad = j;
  bad["top_k"] = -1;
  EXPECT_NE(DecodeError<TeacherRequest>(bad).find("'top_k'"), std::string::npos);
}

TEST(ServiceMessagesTest, TeacherReplyShapesAreChecked) {
  TeacherReply r;
  r.req_id = 4;
  r.classes = 10;
  r.rows = 2;
  r.k = 2;
  r.values = {1.5f, -2.f, 0.25f, 3.f};
  r.classes_of = {3, 1, 0, 9};
  const TeacherReply back = ServiceRoundTrip(r);
  EXPECT_EQ(back.values, r.values);
  EXPECT_EQ(back.classes_of, r.classes_of);
  EXPECT_TRUE(back.status.ok());

  json j;
  r.EncodeTo(&j);
  json bad = j;
  bad["values"] = json::array({1, 2, 3});
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("not rows x k = 2 x 2"), std::string::npos);
  bad = j;
  bad["values"][1] = "x";
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("not a finite fp32 number"), std::string::npos);
  bad = j;
  bad["values"][0] = 1e300;  // finite as a double, not as fp32
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("not a finite fp32 number"), std::string::npos);
  bad = j;
  bad["classes_of"][2] = 10;
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("not a class in [0, 10)"), std::string::npos);
  bad = j;
  bad["classes_of"] = json::array({1});
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("'classes_of'"), std::string::npos);
  bad = j;
  bad["k"] = 11;
  bad["rows"] = 0;
  bad["values"] = json::array();
  bad.erase("classes_of");
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("only 10 classes"), std::string::npos);
  bad = j;
  bad["rows"] = 4096;
  bad["k"] = 100;
  EXPECT_NE(DecodeError<TeacherReply>(bad).find("at most 160000"), std::string::npos);

  TeacherReply failed;
  failed.req_id = 5;
  failed.status = Status::InvalidArgument("sample 70000 is outside");
  EXPECT_EQ(ServiceRoundTrip(failed).status.ToString(), failed.status.ToString());
}

TEST(ServiceMessagesTest, MembersAndStats) {
  ServiceMembers m;
  m.service = "kd";
  m.members = {{"t1", "127.0.0.1", 9001}, {"t2", "host-b", 9002}};
  m.known = {"kd", "other"};
  const ServiceMembers back = ServiceRoundTrip(m);
  EXPECT_EQ(back.members, m.members);
  EXPECT_EQ(back.known, m.known);
  json j;
  m.EncodeTo(&j);
  json bad = j;
  bad["members"][1][0] = "t1";
  EXPECT_NE(DecodeError<ServiceMembers>(bad).find("not a distinct [name, host, port]"),
            std::string::npos);
  bad = j;
  bad["members"][0][2] = 0;
  EXPECT_NE(DecodeError<ServiceMembers>(bad).find("'service_members'"), std::string::npos);
  bad = j;
  bad["members"][0][1] = "bad host!";
  EXPECT_NE(DecodeError<ServiceMembers>(bad).find("'service_members'"), std::string::npos);

  ServiceStats s;
  s.requests = 3;
  s.samples = 384;
  s.period_s = 1.5;
  s.latency_ms = 12.25;
  EXPECT_DOUBLE_EQ(ServiceRoundTrip(s).latency_ms, 12.25);
  s.EncodeTo(&j);
  j["latency_ms"] = -1;
  EXPECT_NE(DecodeError<ServiceStats>(j).find("negative"), std::string::npos);
}

TEST(ServiceMessagesTest, CancelAndWatch) {
  TeacherCancel c;
  c.req_id = 42;
  json j;
  c.EncodeTo(&j);
  TeacherCancel c2;
  ASSERT_OK(c2.DecodeFrom(j));
  EXPECT_EQ(c2.req_id, 42u);
  EXPECT_FALSE(c2.DecodeFrom(json{{"type", "teacher_cancel"}, {"req_id", -1}}).ok());
  EXPECT_FALSE(c2.DecodeFrom(json{{"type", "teacher_cancel"}}).ok());
  ServiceWatch w;
  w.service = "kd";
  w.EncodeTo(&j);
  ServiceWatch w2;
  ASSERT_OK(w2.DecodeFrom(j));
  EXPECT_EQ(w2.service, "kd");
  Status s = w2.DecodeFrom(json{{"type", "service_watch"}, {"service", "a/b"}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("service"), std::string::npos) << s.ToString();
}

TEST(ServiceMessagesTest, HelloOfServiceRoles) {
  Hello t;
  t.role = Role::kTeacher;
  t.nonce = std::string(64, 'a');
  t.service = "kd";
  t.node = "t1";
  t.host = "10.1.2.3";
  t.port = 9001;
  const Hello back = ServiceRoundTrip(t);
  EXPECT_EQ(back.service, "kd");
  EXPECT_EQ(back.port, 9001);
  json j;
  t.EncodeTo(&j);
  j["port"] = 70000;
  EXPECT_NE(DecodeError<Hello>(j).find("'port'"), std::string::npos);
  Hello s;
  s.role = Role::kStudent;
  s.nonce = std::string(64, 'b');
  s.service = "bad name!";
  s.EncodeTo(&j);
  EXPECT_NE(DecodeError<Hello>(j).find("'service'"), std::string::npos);
  j["role"] = "admin";
  EXPECT_NE(DecodeError<Hello>(j).find("'client', 'ctl', 'teacher' or 'student'"),
            std::string::npos);
}

}  // namespace
}  // namespace edl::proto
