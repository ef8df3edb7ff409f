// ServiceRegistry (jobserver/services/service_registry.h) without a network: teachers join and
// leave, watchers get the whole member list after their welcome and after every change, a
// re-registered teacher replaces its old connection, stats reach the summary, bad messages and
// limits are errors naming the problem.
#include "jobserver/services/service_registry.h"

#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;

class ServiceRegistryTest : public ::testing::Test {
 protected:
  ServiceRegistryTest()
      : reg_(&clock_, [this](uint64_t peer, const json& m) { sent_[peer].push_back(m); }) {}

  static proto::Hello Teacher(const std::string& service, const std::string& name, int port) {
    proto::Hello h;
    h.role = proto::Role::kTeacher;
    h.service = service;
    h.node = name;
    h.host = "10.0.0.1";
    h.port = port;
    return h;
  }
  static proto::Hello Student(const std::string& service) {
    proto::Hello h;
    h.role = proto::Role::kStudent;
    h.service = service;
    return h;
  }
  // The member names of the last list sent to `peer`.
  std::vector<std::string> LastList(uint64_t peer) {
    EXPECT_FALSE(sent_[peer].empty());
    proto::ServiceMembers m;
    EXPECT_OK(m.DecodeFrom(sent_[peer].back()));
    std::vector<std::string> names;
    for (const auto& t : m.members) names.push_back(t.name);
    return names;
  }

  ManualClock clock_;
  std::map<uint64_t, std::vector<json>> sent_;
  ServiceRegistry reg_;
};

TEST_F(ServiceRegistryTest, WatchersFollowJoinsAndLosses) {
  uint64_t replaced = 9;
  ASSERT_OK(reg_.Attach(10, Student("kd"), &replaced));
  EXPECT_EQ(replaced, 0u);
  EXPECT_TRUE(sent_[10].empty());  // nothing before the welcome
  reg_.Welcomed(10);
  EXPECT_TRUE(LastList(10).empty());
  ASSERT_OK(reg_.Attach(1, Teacher("kd", "t1", 9001), &replaced));
  EXPECT_EQ(LastList(10), std::vector<std::string>({"t1"}));
  ASSERT_OK(reg_.Attach(2, Teacher("kd", "t2", 9002), &replaced));
  ASSERT_OK(reg_.Attach(3, Teacher("other", "x", 9003), &replaced));
  EXPECT_EQ(LastList(10), std::vector<std::string>({"t1", "t2"}));
  EXPECT_EQ(sent_[10].size(), 3u);  // the other service's teacher is not pushed here
  proto::ServiceMembers m;
  ASSERT_OK(m.DecodeFrom(sent_[10].back()));
  EXPECT_EQ(m.members[1].port, 9002);
  EXPECT_EQ(m.known, std::vector<std::string>({"kd"}));  // sent before "other" had a teacher
  EXPECT_EQ(reg_.Members("kd").known, std::vector<std::string>({"kd", "other"}));
  reg_.Remove(1);  // teacher t1's connection closed
  EXPECT_EQ(LastList(10), std::vector<std::string>({"t2"}));
  reg_.Remove(10);
  ASSERT_OK(reg_.Attach(4, Teacher("kd", "t4", 9004), &replaced));
  EXPECT_EQ(sent_[10].size(), 4u);  // a removed watcher gets nothing more
}

// A node's client watches services for its trainers: the list at once, then every change, for
// each service it watches; its connection closing ends every watch.
TEST_F(ServiceRegistryTest, ClientsWatchManyServicesForTheirTrainers) {
  uint64_t replaced = 0;
  ASSERT_OK(reg_.Attach(1, Teacher("kd", "t1", 9001), &replaced));
  ASSERT_OK(reg_.Watch(20, "kd"));
  EXPECT_EQ(LastList(20), std::vector<std::string>({"t1"}));
  ASSERT_OK(reg_.Watch(20, "other"));
  EXPECT_TRUE(LastList(20).empty());
  ASSERT_OK(reg_.Watch(20, "kd"));  // again: nothing new
  EXPECT_EQ(sent_[20].size(), 2u);
  ASSERT_OK(reg_.Attach(2, Teacher("other", "o1", 9002), &replaced));
  EXPECT_EQ(LastList(20), std::vector<std::string>({"o1"}));
  ASSERT_OK(reg_.Attach(3, Teacher("kd", "t3", 9003), &replaced));
  EXPECT_EQ(LastList(20), std::vector<std::string>({"t1", "t3"}));
  EXPECT_EQ(reg_.Summary()["kd"]["students"], 1);
  EXPECT_FALSE(reg_.Watch(1, "kd").ok());  // a teacher's connection watches nothing
  reg_.Remove(20);
  reg_.Remove(3);
  EXPECT_EQ(sent_[20].size(), 4u);
  EXPECT_EQ(reg_.Summary()["kd"]["students"], 0);
}

TEST_F(ServiceRegistryTest, ReRegisteredTeacherReplacesItsOldConnection) {
  uint64_t replaced = 0;
  ASSERT_OK(reg_.Attach(1, Teacher("kd", "t1", 9001), &replaced));
  ASSERT_OK(reg_.Attach(5, Teacher("kd", "t1", 9555), &replaced));
  EXPECT_EQ(replaced, 1u);
  EXPECT_FALSE(reg_.IsTeacher(1));
  reg_.Remove(1);  // the old connection's close must not remove the new registration
  EXPECT_EQ(reg_.Members("kd").members.size(), 1u);
  EXPECT_EQ(reg_.Members("kd").members[0].port, 9555);
}

TEST_F(ServiceRegistryTest, StatsReachTheSummary) {
  uint64_t replaced = 0;
  ASSERT_OK(reg_.Attach(1, Teacher("kd", "t1", 9001), &replaced));
  ASSERT_OK(reg_.Attach(7, Student("kd"), &replaced));
  proto::ServiceStats st;
  st.requests = 20;
  st.samples = 2560;
  st.period_s = 2;
  st.latency_ms = 12.5;
  json j;
  st.EncodeTo(&j);
  ASSERT_OK(reg_.OnMessage(1, proto::msg::kServiceStats, j));
  ASSERT_OK(reg_.OnMessage(1, proto::msg::kHeartbeat, json{{"type", "heartbeat"}}));
  const json s = reg_.Summary();
  ASSERT_TRUE(s.contains("kd")) << s.dump();
  EXPECT_EQ(s["kd"]["students"], 1);
  EXPECT_DOUBLE_EQ(s["kd"]["teachers"][0]["requests_per_sec"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(s["kd"]["teachers"][0]["samples_per_sec"].get<double>(), 1280.0);
  EXPECT_DOUBLE_EQ(s["kd"]["teachers"][0]["latency_ms"].get<double>(), 12.5);
}

TEST_F(ServiceRegistryTest, BadMessagesAndLimitsAreErrors) {
  uint64_t replaced = 0;
  ASSERT_OK(reg_.Attach(1, Teacher("kd", "t1", 9001), &replaced));
  ASSERT_OK(reg_.Attach(2, Student("kd"), &replaced));
  Status s = reg_.OnMessage(2, proto::msg::kServiceStats, json::object());
  EXPECT_NE(s.ToString().find("students send only 'heartbeat'"), std::string::npos) << s.ToString();
  s = reg_.OnMessage(1, proto::msg::kServiceStats,
                     json{{"type", "service_stats"}, {"requests", -1}});
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  s = reg_.OnMessage(1, "kv", json::object());
  EXPECT_NE(s.ToString().find("got 'kv'"), std::string::npos) << s.ToString();

  ServiceLimits lim;
  lim.max_services = 1;
  lim.max_teachers_per_service = 1;
  ServiceRegistry small(
      &clock_, [](uint64_t, const json&) {}, lim);
  ASSERT_OK(small.Attach(1, Teacher("kd", "t1", 1), &replaced));
  s = small.Attach(2, Teacher("kd", "t2", 2), &replaced);
  EXPECT_NE(s.ToString().find("already has 1 teachers"), std::string::npos) << s.ToString();
  s = small.Attach(3, Teacher("other", "t3", 3), &replaced);
  EXPECT_NE(s.ToString().find("one too many"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace edl::jobserver
