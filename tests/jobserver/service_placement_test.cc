// ServicePlacer (jobserver/services/service_placement.h) without a network: `scale SERVICE N`
// places N teachers on the nodes offering the service within their teacher slots, spread over the
// nodes; shrinking stops the newest; a teacher that ends or whose node is lost is replaced, a
// quickly failing one after a growing hold; a reconnecting node's teachers are adopted; an unknown
// service is an error naming what is offered. A restarted server's placer keeps the desired
// counts and waits for the restored teachers' nodes instead of starting extra ones; the stored
// value is decoded as hostile bytes. Also the teacher order messages' decoder.
#include "jobserver/services/service_placement.h"

#include <functional>
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

// A server restarts with kd at 2 teachers, one on each of a and b. Node a re-attaches first: the
// teacher restored on b still counts, so nothing starts on a; b re-attaches: both kept, no order.
TEST(ServicePlacerTest, RestoredTeachersWaitForTheirNodesWithoutExtraStarts) {
  ServicesState saved;
  {
    ServicePlacer p;
    p.NodeUp("a", {"kd"}, 2, {}, 0);
    p.NodeUp("b", {"kd"}, 2, {}, 0);
    ASSERT_OK(p.SetDesired("kd", 2));
    EXPECT_TRUE(p.TakeChanged());
    ASSERT_EQ(Nodes(p.Reconcile(0), true), (std::multiset<std::string>{"a", "b"}));
    EXPECT_TRUE(p.TakeChanged());  // the orders are kept before they are sent
    EXPECT_TRUE(p.Reconcile(1).empty());
    EXPECT_FALSE(p.TakeChanged());
    p.Snapshot(&saved);
  }
  ASSERT_EQ(saved.teachers.size(), 2u);
  ServicesState back;
  ASSERT_OK(DecodeServices("job/j/services", EncodeServices(saved), &back));
  EXPECT_EQ(back.desired, saved.desired);
  EXPECT_EQ(back.next_seq, saved.next_seq);
  ASSERT_EQ(back.teachers.size(), 2u);
  const std::string on_a =
      back.teachers[0].node == "a" ? back.teachers[0].name : back.teachers[1].name;
  const std::string on_b =
      back.teachers[0].node == "b" ? back.teachers[0].name : back.teachers[1].name;

  ServicePlacer p;
  const int64_t t0 = 100'000'000, grace = 6'000'000;
  p.Restore(back, t0, grace);
  EXPECT_TRUE(p.Reconcile(t0).empty());  // nobody attached yet: nothing to start, nothing lost
  p.NodeUp("a", {"kd"}, 2, {{"kd", on_a}}, t0 + 1);
  EXPECT_TRUE(p.Reconcile(t0 + 1).empty()) << "a third teacher started while b was reconnecting";
  EXPECT_EQ(p.Summary(t0 + 1)["kd"]["desired"], 2);
  p.NodeUp("b", {"kd"}, 2, {{"kd", on_b}}, t0 + 2);
  EXPECT_TRUE(p.Reconcile(t0 + 2).empty());
  std::set<std::string> names;
  const json summary = p.Summary(t0 + 3);
  for (const json& x : summary["kd"]["placed"]) {
    names.insert(x["name"].get<std::string>());
    EXPECT_FALSE(x["awaiting_node"].get<bool>());
  }
  EXPECT_EQ(names, (std::set<std::string>{on_a, on_b}));
  // Past the grace nothing is dropped (both re-attached); a new start takes a fresh name.
  EXPECT_TRUE(p.Reconcile(t0 + grace + 1).empty());
  ASSERT_OK(p.SetDesired("kd", 3));
  const std::vector<Order> o = p.Reconcile(t0 + grace + 2);
  ASSERT_EQ(o.size(), 1u);
  EXPECT_FALSE(names.count(o[0].name));
}

// A restored teacher whose node re-attaches without it, or never re-attaches within the grace,
// is replaced; a shrink while a node is away forgets its teacher rather than ordering a stop
// nobody receives.
TEST(ServicePlacerTest, RestoredTeachersMissingOrAwayAreReplaced) {
  ServicesState st;
  st.desired["kd"] = 2;
  st.next_seq = 3;
  st.teachers = {{"a-t1", "kd", "a"}, {"b-t2", "kd", "b"}};
  ServicePlacer p;
  p.Restore(st, 0, 5'000'000);
  p.NodeUp("a", {"kd"}, 2, {}, 1);  // a lost its teacher while the server was down
  EXPECT_TRUE(p.TakeChanged());
  std::vector<Order> o = p.Reconcile(1);
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].node, "a");
  EXPECT_EQ(o[0].name, "a-t3");                 // the stored counter goes on
  EXPECT_TRUE(p.Reconcile(4'999'999).empty());  // b-t2 still awaited
  o = p.Reconcile(5'000'000);                   // b did not come back: replaced on a
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].node, "a");

  ServicePlacer q;
  q.Restore(st, 0, 5'000'000);
  q.NodeUp("a", {"kd"}, 2, {{"kd", "a-t1"}}, 1);
  ASSERT_OK(q.SetDesired("kd", 1));
  EXPECT_TRUE(q.Reconcile(2).empty());  // b-t2 (away) is forgotten, a-t1 keeps running
  EXPECT_EQ(q.Summary(3)["kd"]["placed"].size(), 1u);
  q.NodeUp("b", {"kd"}, 2, {{"kd", "b-t2"}}, 4);  // it comes back after all: adopted, then stopped
  o = q.Reconcile(4);
  ASSERT_EQ(o.size(), 1u);
  EXPECT_FALSE(o[0].start);
  EXPECT_EQ(o[0].name, "b-t2");
}

TEST(ServicesStateTest, DecodeRefusesDamagedValues) {
  ServicesState s;
  ASSERT_OK(DecodeServices("k", EncodeServices(s), &s));
  const json good = json::parse(
      EncodeServices(ServicesState{{{"kd", 2}}, {{"kd", 1}}, 5, {{"a-t1", "kd", "a"}}}));
  ServicesState out;
  ASSERT_OK(DecodeServices("k", good.dump(), &out));
  EXPECT_EQ(out.teachers.size(), 1u);
  EXPECT_EQ(out.restarts["kd"], 1);
  auto bad = [&](const std::function<void(json*)>& f) {
    json j = good;
    f(&j);
    return DecodeServices("cluster/services", j.dump(), &out);
  };
  const std::vector<std::function<void(json*)>> cases = {
      [](json* j) { (*j)["desired"]["kd"] = 5000; },
      [](json* j) { (*j)["desired"]["kd"] = -1; },
      [](json* j) { (*j)["desired"]["../x"] = 1; },
      [](json* j) { (*j)["desired"] = json::array(); },
      [](json* j) { (*j)["restarts"]["kd"] = "1"; },
      [](json* j) { (*j)["next_seq"] = 0; },
      [](json* j) { j->erase("teachers"); },
      [](json* j) { (*j)["teachers"].push_back((*j)["teachers"][0]); },
      [](json* j) { (*j)["teachers"][0]["node"] = "a b"; },
      [](json* j) { (*j)["teachers"][0] = 7; },
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Status st = bad(cases[i]);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << "case " << i << ": " << st.ToString();
    EXPECT_NE(st.message().find("cluster/services"), std::string::npos) << st.ToString();
  }
  EXPECT_EQ(DecodeServices("k", "{\"v\":1,", &out).code(), Status::Code::kCorruption);
  EXPECT_EQ(DecodeServices("k", "{\"v\":2}", &out).code(), Status::Code::kFailedPrecondition);
}

TEST(TeacherOrderTest, DecodesTheThreeTypesAndRefusesBadFields) {
  proto::TeacherOrder e;
  e.type = proto::TeacherOrderType::kExit;
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
  EXPECT_FALSE(
      d.DecodeFrom(json{{"type", "teacher_stop"}, {"service", "../x"}, {"name", "x"}}).ok());
  Status s = d.DecodeFrom(
      json{{"type", "teacher_exit"}, {"service", "kd"}, {"name", "x"}, {"why", "a\nb"}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("why"), std::string::npos) << s.ToString();
  EXPECT_FALSE(d.DecodeFrom(json{{"type", "teacher_exit"},
                                 {"service", "kd"},
                                 {"name", "x"},
                                 {"why", std::string(300, 'a')}})
                   .ok());
  // A client hello's services: bounded and well formed.
  proto::Hello h;
  h.role = proto::Role::kClient;
  h.nonce = std::string(64, 'a');
  h.node = "n1";
  h.host = "127.0.0.1";
  h.mode = proto::NodeMode::kInplace;
  h.services = {"kd"};
  h.teacher_slots = 2;
  h.teachers = {{"kd", "n1-t1"}};
  h.EncodeTo(&j);
  proto::Hello back;
  ASSERT_OK(back.DecodeFrom(j));
  EXPECT_EQ(back.teachers, h.teachers);
  EXPECT_EQ(back.teacher_slots, 2);
  json bad = j;
  bad["teachers"] =
      json::array({json::array({"kd", "a"}), json::array({"kd", "b"}), json::array({"kd", "c"})});
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
