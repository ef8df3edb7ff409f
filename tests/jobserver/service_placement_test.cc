// ServicePlacer (jobserver/service_placement.h) without a network: `scale SERVICE N` places N
// teachers on the nodes offering the service within their teacher slots, spread over the nodes;
// shrinking stops the newest; a teacher that ends or whose node is lost is replaced, a quickly
// failing one after a growing hold; a reconnecting node's teachers are adopted; an unknown
// service is an error naming what is offered. Also the teacher order messages' decoder.
#include "jobserver/service_placement.h"

#include <set>

#include <gtest/gtest.h>

#include "edl/proto/service_messages.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;
using Order = ServicePlacer::Order;

std::multiset<std::string> Nodes(const std::vector<Order>& orders, bool start) {
  std::multiset<std::string> out;
  for (const Order& o : orders) {
    if (o.start == start) out.insert(o.node);
  }
  return out;
}

TEST(ServicePlacerTest, ScalesWithinSlotsSpreadingOverNodes) {
  ServicePlacer p;
  p.NodeUp("a", {"kd"}, 2, {}, 0);
  p.NodeUp("b", {"kd", "other"}, 1, {}, 0);
  p.NodeUp("c", {"other"}, 4, {}, 0);
  EXPECT_TRUE(p.Reconcile(0).empty());  // nobody asked yet
  ASSERT_OK(p.SetDesired("kd", 2));
  std::vector<Order> o = p.Reconcile(0);
  EXPECT_EQ(Nodes(o, true), (std::multiset<std::string>{"a", "b"}));  // one per node first
  for (const Order& x : o) EXPECT_EQ(x.service, "kd");
  EXPECT_NE(o[0].name, o[1].name);
  EXPECT_TRUE(p.Reconcile(1).empty());  // placed ones count at once
  // 5 asked, 3 slots offer kd: 3 placed, the rest waits for slots.
  ASSERT_OK(p.SetDesired("kd", 5));
  EXPECT_EQ(Nodes(p.Reconcile(2), true), (std::multiset<std::string>{"a"}));
  EXPECT_TRUE(p.Reconcile(3).empty());
  // Back to 1: the two newest are stopped.
  ASSERT_OK(p.SetDesired("kd", 1));
  o = p.Reconcile(4);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(Nodes(o, false).size(), 2u);
  const json s = p.Summary(5)["kd"];
  EXPECT_EQ(s["desired"], 1);
  EXPECT_EQ(s["placed"].size(), 3u);  // stopping ones stay until their exit
  EXPECT_EQ(s["nodes"], json({"a", "b"}));
  for (const Order& x : o) p.Exited(x.node, x.name, "exit 0", 6);
  EXPECT_EQ(p.Summary(7)["kd"]["placed"].size(), 1u);
  EXPECT_EQ(p.Summary(7)["kd"]["restarts"], 0);  // stopped on purpose: not replaced
  EXPECT_TRUE(p.Reconcile(8).empty());
}

TEST(ServicePlacerTest, ReplacesEndedAndLostTeachersHoldingQuickFailures) {
  ServicePlacer p;
  p.NodeUp("a", {"kd"}, 1, {}, 0);
  p.NodeUp("b", {"kd"}, 1, {}, 0);
  ASSERT_OK(p.SetDesired("kd", 1));
  std::vector<Order> o = p.Reconcile(0);
  ASSERT_EQ(o.size(), 1u);
  // It runs a minute, then is killed: replaced at once, on the same or the other node.
  const int64_t t = 60'000'000;
  p.Exited(o[0].node, o[0].name, "killed by SIGKILL", t);
  std::vector<Order> r = p.Reconcile(t);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].name, o[0].name);
  EXPECT_EQ(p.Summary(t)["kd"]["restarts"], 1);
  // A report about another node's teacher changes nothing.
  p.Exited(r[0].node == "a" ? "b" : "a", r[0].name, "exit 1", t);
  EXPECT_TRUE(p.Reconcile(t).empty());
  // Its node is lost: the other node gets the replacement.
  const std::string lost = r[0].node;
  p.NodeDown(lost);
  r = p.Reconcile(t + 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].node, lost);
  // A command that fails at once: that node is held back, longer after each failure.
  const std::string node = r[0].node;
  p.Exited(node, r[0].name, "exit 2", t + 2);
  EXPECT_TRUE(p.Reconcile(t + 3).empty());  // the only other node is gone
  r = p.Reconcile(t + 2 + 600'000);
  ASSERT_EQ(r.size(), 1u);
  p.Exited(node, r[0].name, "exit 2", t + 3'000'000);
  EXPECT_TRUE(p.Reconcile(t + 3'000'000 + 600'000).empty());  // held 1 s now
  EXPECT_EQ(p.Reconcile(t + 3'000'000 + 1'100'000).size(), 1u);
}

TEST(ServicePlacerTest, AdoptsAReconnectingNodesTeachersAndRefusesUnknownServices) {
  ServicePlacer p;
  Status s = p.SetDesired("kd", 1);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("--service kd"), std::string::npos) << s.ToString();
  p.NodeUp("a", {"kd"}, 2, {}, 0);
  ASSERT_OK(p.SetDesired("kd", 2));
  const std::vector<Order> o = p.Reconcile(0);
  ASSERT_EQ(o.size(), 2u);
  // The client reconnects still running one of them (and names one of another service it does
  // not offer: not adopted).
  p.NodeDown("a");
  p.NodeUp("a", {"kd"}, 2, {{"kd", o[0].name}, {"zz", "a-t99"}}, 1);
  const std::vector<Order> r = p.Reconcile(1);
  ASSERT_EQ(r.size(), 1u);  // only the missing one
  EXPECT_NE(r[0].name, o[0].name);
  EXPECT_EQ(p.SetDesired("kd", 2000).code(), Status::Code::kInvalidArgument);
  ASSERT_OK(p.SetDesired("kd", 0));
  EXPECT_EQ(Nodes(p.Reconcile(2), false).size(), 2u);
}

TEST(TeacherOrderTest, DecodesTheThreeTypesAndRefusesBadFields) {
  proto::TeacherOrder e;
  e.type = proto::msg::kTeacherExit;
  e.service = "kd";
  e.name = "a-t1";
  e.why = "exit 1";
  json j;
  e.EncodeTo(&j);
  proto::TeacherOrder d;
  ASSERT_OK(d.DecodeFrom(j));
  EXPECT_EQ(d.DebugString(), e.DebugString());
  EXPECT_FALSE(d.DecodeFrom(json{{"type", "teacher_start"}, {"service", "kd"}}).ok());  // no name
  EXPECT_FALSE(d.DecodeFrom(json{{"type", "teacher_nope"}, {"service", "kd"}, {"name", "x"}}).ok());
  EXPECT_FALSE(d.DecodeFrom(json{{"type", "teacher_stop"}, {"service", "../x"}, {"name", "x"}}).ok());
  Status s = d.DecodeFrom(json{{"type", "teacher_exit"}, {"service", "kd"}, {"name", "x"}, {"why", "a\nb"}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("why"), std::string::npos) << s.ToString();
  EXPECT_FALSE(d.DecodeFrom(json{{"type", "teacher_exit"}, {"service", "kd"}, {"name", "x"},
                                 {"why", std::string(300, 'a')}}).ok());
  // A client hello's services: bounded and well formed.
  proto::Hello h;
  h.role = "client";
  h.nonce = std::string(64, 'a');
  h.node = "n1";
  h.host = "127.0.0.1";
  h.mode = "inplace";
  h.services = {"kd"};
  h.teacher_slots = 2;
  h.teachers = {{"kd", "n1-t1"}};
  h.EncodeTo(&j);
  proto::Hello back;
  ASSERT_OK(back.DecodeFrom(j));
  EXPECT_EQ(back.teachers, h.teachers);
  EXPECT_EQ(back.teacher_slots, 2);
  json bad = j;
  bad["teachers"] = json::array({json::array({"kd", "a"}), json::array({"kd", "b"}), json::array({"kd", "c"})});
  EXPECT_FALSE(back.DecodeFrom(bad).ok());  // more than its slots
  bad = j;
  bad["teachers"] = json::array({json::array({"kd"})});
  EXPECT_FALSE(back.DecodeFrom(bad).ok());
  bad = j;
  bad["teacher_slots"] = 65;
  EXPECT_FALSE(back.DecodeFrom(bad).ok());
}

}  // namespace
}  // namespace edl::jobserver
