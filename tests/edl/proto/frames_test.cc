// The closed sets' name tables (the wire keeps its strings) and the per-direction frame variants.
#include "edl/proto/frames.h"

#include <gtest/gtest.h>

#include "edl/base/enum_names.h"
#include "tests/testutil.h"

namespace edl::proto {
namespace {

using nlohmann::json;

template <typename E, size_t N>
void ExpectNames(const EnumNames<E, N>& table, const std::vector<std::string>& names) {
  ASSERT_EQ(names.size(), N);
  for (size_t i = 0; i < N; ++i) {
    const E e = static_cast<E>(i);
    EXPECT_EQ(table.Name(e), names[i]);
    E back = static_cast<E>(N - 1 - i);
    ASSERT_TRUE(table.Parse(names[i], &back)) << names[i];
    EXPECT_EQ(back, e);
  }
  E untouched = static_cast<E>(0);
  EXPECT_FALSE(table.Parse("", &untouched));
  EXPECT_FALSE(table.Parse(std::string(names[0]) + " ", &untouched));
  EXPECT_FALSE(table.Parse("CLIENT", &untouched));
}

TEST(EnumNamesTest, EachClosedSetHasItsWireNames) {
  ExpectNames(kRoleNames, {"client", "ctl", "teacher", "student"});
  ExpectNames(kNodeModeNames, {"inplace", "restart"});
  ExpectNames(kKvOpNames, {"set", "get", "wait"});
  ExpectNames(kCtlCommandNames, {"status", "scale", "watch", "stop", "submit", "jobs", "cancel"});
  ExpectNames(kTeacherOrderNames, {"teacher_start", "teacher_stop", "teacher_exit"});
  EXPECT_EQ(kKvOpNames.List("'"), "'set', 'get' or 'wait'");
  EXPECT_EQ(kNodeModeNames.List(""), "inplace or restart");
}

// The enums change nothing on the wire: the same JSON as when the fields were strings.
TEST(EnumNamesTest, EncodingIsTheStringForm) {
  Hello h;
  h.role = Role::kClient;
  h.mac = std::string(64, 'a');
  h.nonce = std::string(64, 'b');
  h.node = "n1";
  h.host = "10.0.0.1";
  h.mode = NodeMode::kRestart;
  h.slots = {0};
  json j;
  h.EncodeTo(&j);
  EXPECT_EQ(j.dump(), json({{"type", "hello"},
                            {"role", "client"},
                            {"mac", std::string(64, 'a')},
                            {"nonce", std::string(64, 'b')},
                            {"node", "n1"},
                            {"host", "10.0.0.1"},
                            {"mode", "restart"},
                            {"slots", {0}},
                            {"trainers", json::array()}})
                          .dump());
  h = Hello();
  h.role = Role::kStudent;
  h.service = "kd";
  h.EncodeTo(&j);
  EXPECT_EQ(j["role"], "student");
  EXPECT_EQ(j["service"], "kd");
  EXPECT_FALSE(j.contains("mode"));

  KvRequest kv;
  kv.req_id = 3;
  kv.op = KvOp::kWait;
  kv.key = "k";
  kv.timeout_ms = 10;
  kv.EncodeTo(&j);
  EXPECT_EQ(j.dump(), R"({"key":"k","op":"wait","req_id":3,"timeout_ms":10,"type":"kv"})");
  kv.op = KvOp::kSet;
  kv.value = "v";
  kv.EncodeTo(&j);
  EXPECT_EQ(j.dump(), R"({"key":"k","op":"set","req_id":3,"type":"kv","value":"v"})");

  CtlRequest c;
  c.command = CtlCommand::kCancel;
  c.job = "a";
  c.EncodeTo(&j);
  EXPECT_EQ(j.dump(), R"({"command":"cancel","job":"a","n":0,"type":"ctl"})");

  TeacherOrder o;
  o.type = TeacherOrderType::kStop;
  o.service = "kd";
  o.name = "t1";
  o.EncodeTo(&j);
  EXPECT_EQ(j.dump(), R"({"name":"t1","service":"kd","type":"teacher_stop"})");
}

// A value outside a closed set is refused by name, with the same words as before the enums.
TEST(EnumNamesTest, UnknownValuesAreCorruptionNamingTheField) {
  const json hello = {{"type", "hello"},
                      {"role", "client"},
                      {"mac", std::string(64, 'a')},
                      {"nonce", std::string(64, 'b')},
                      {"node", "n1"},
                      {"host", "h"},
                      {"mode", "inplace"},
                      {"slots", {0}},
                      {"trainers", json::array()}};
  Hello h;
  ASSERT_OK(h.DecodeFrom(hello));
  json bad = hello;
  bad["role"] = "admin";
  Status s = h.DecodeFrom(bad);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.message(),
            "message 'hello' field 'role' is not 'client', 'ctl', 'teacher' or 'student'");
  bad = hello;
  bad["mode"] = "Restart";
  s = h.DecodeFrom(bad);
  EXPECT_EQ(s.message(), "message 'hello' field 'mode' is not 'inplace' or 'restart'");

  KvRequest kv;
  s = kv.DecodeFrom(json{{"type", "kv"}, {"req_id", 1}, {"op", "del"}, {"key", "k"}});
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.message(), "message 'kv' field 'op' is not 'set', 'get' or 'wait'");
  ASSERT_OK(kv.DecodeFrom(
      json{{"type", "kv"}, {"req_id", 1}, {"op", "set"}, {"key", "k"}, {"value", "v"}}));
  EXPECT_EQ(kv.op, KvOp::kSet);

  CtlRequest c;
  s = c.DecodeFrom(json{{"type", "ctl"}, {"command", "reboot"}});
  EXPECT_EQ(s.message(),
            "message 'ctl' field 'command' 'reboot' is not status, scale, watch, stop, submit, "
            "jobs or cancel");
  ASSERT_OK(c.DecodeFrom(json{{"type", "ctl"}, {"command", "jobs"}}));
  EXPECT_EQ(c.command, CtlCommand::kJobs);

  TeacherOrder o;
  s = o.DecodeFrom(json{{"type", "teacher_pause"}, {"service", "kd"}, {"name", "x"}});
  EXPECT_EQ(
      s.message(),
      "teacher order: type 'teacher_pause' is not teacher_start, teacher_stop or teacher_exit");
}

TEST(FramesTest, ClientFramesDecodeToTheirAlternative) {
  ClientFrame f;
  ASSERT_OK(DecodeClientFrame(json{{"type", "heartbeat"}}, &f));
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(f));

  TrainerExit exit;
  exit.trainer_id = "n1-s0-1";
  exit.exited = true;
  exit.code = 3;
  ASSERT_OK(DecodeClientFrame(exit.Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<TrainerExit>(f));
  EXPECT_EQ(std::get<TrainerExit>(f).code, 3);

  KvRequest kv;
  kv.op = KvOp::kGet;
  kv.key = "k";
  ASSERT_OK(DecodeClientFrame(kv.Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<KvRequest>(f));
  EXPECT_EQ(std::get<KvRequest>(f).op, KvOp::kGet);

  TeacherOrder o;
  o.type = TeacherOrderType::kExit;
  o.service = "kd";
  o.name = "t1";
  o.why = "exit 1";
  ASSERT_OK(DecodeClientFrame(o.Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<TeacherOrder>(f));
  EXPECT_EQ(std::get<TeacherOrder>(f).why, "exit 1");

  // The visitor sees exactly one alternative.
  int visited = 0;
  std::visit(Overloaded{[&](const TeacherOrder& t) {
                          visited += t.type == TeacherOrderType::kExit ? 1 : 100;
                        },
                        [&](const auto&) { visited += 1000; }},
             f);
  EXPECT_EQ(visited, 1);
}

TEST(FramesTest, ClientFramesOutsideTheSetAreRefusedByType) {
  ClientFrame f;
  // The server's own messages, a ctl frame, a teacher order only the server gives: none from a
  // client.
  for (const char* type : {"generation", "ctl", "teacher_start", "hello", "nope"}) {
    const Status s = DecodeClientFrame(json{{"type", type}}, &f);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << type;
    EXPECT_EQ(s.message(), std::string("unexpected message '") + type + "' from a client");
  }
  // A known type with a bad field: its decoder's Corruption, and the alternative says which.
  Status s = DecodeClientFrame(json{{"type", "ready"}, {"generation", -1}}, &f);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("generation"), std::string::npos) << s.ToString();
  EXPECT_TRUE(std::holds_alternative<Ready>(f));
  s = DecodeClientFrame(json{{"type", "kv"}, {"req_id", 1}, {"op", "drop"}, {"key", "k"}}, &f);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_TRUE(std::holds_alternative<KvRequest>(f));
  EXPECT_TRUE(DecodeClientFrame(json::array(), &f).IsCorruption());
  EXPECT_TRUE(DecodeClientFrame(json{{"type", 7}}, &f).IsCorruption());
}

TEST(FramesTest, TrainerFramesDecodeToTheirAlternative) {
  TrainerFrame f;
  Ready r;
  r.generation = 4;
  ASSERT_OK(DecodeTrainerFrame(r.Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<Ready>(f));
  EXPECT_EQ(std::get<Ready>(f).generation, 4);
  ServiceWatch w;
  w.service = "kd";
  ASSERT_OK(DecodeTrainerFrame(w.Encoded(), &f));
  EXPECT_EQ(std::get<ServiceWatch>(f).service, "kd");
  // What only a node's client reports (an exit, its stats) or says first (the hello): not after it.
  for (const char* type : {"trainer_exit", "node_stats", "trainer_hello", "teacher_exit"}) {
    const Status s = DecodeTrainerFrame(json{{"type", type}}, &f);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << type;
    EXPECT_EQ(s.message(), std::string("unexpected message '") + type + "' from a trainer");
  }
  EXPECT_TRUE(DecodeTrainerFrame(json{{"type", "event"}, {"event", 3}}, &f).IsCorruption());
  EXPECT_TRUE(std::holds_alternative<Event>(f));
}

TEST(FramesTest, ServerFramesDecodeToTheirAlternative) {
  ServerFrame f;
  for (const char* type : {"heartbeat", "stop", "done"})
    ASSERT_OK(DecodeServerFrame(json{{"type", type}}, &f));
  EXPECT_TRUE(std::holds_alternative<Done>(f));

  GenerationInfo g;
  g.generation = 2;
  g.job_id = "j";
  g.reason = "start";
  g.members = {{"n1-s0-1", "n1", 0, 0, "10.0.0.1"}};
  ASSERT_OK(DecodeServerFrame(GenerationUpdate::Full(g).Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<GenerationUpdate>(f));
  GenerationInfo back;
  ASSERT_OK(std::get<GenerationUpdate>(f).ApplyTo(&back));
  EXPECT_EQ(back.members, g.members);

  TeacherOrder o;
  o.type = TeacherOrderType::kStart;
  o.service = "kd";
  o.name = "t1";
  ASSERT_OK(DecodeServerFrame(o.Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<TeacherOrder>(f));
  EXPECT_EQ(std::get<TeacherOrder>(f).type, TeacherOrderType::kStart);

  ASSERT_OK(DecodeServerFrame(ErrorMsg::From(Status::AlreadyExists("taken")).Encoded(), &f));
  ASSERT_TRUE(std::holds_alternative<ErrorMsg>(f));
  EXPECT_EQ(std::get<ErrorMsg>(f).ToStatus().code(), Status::Code::kAlreadyExists);
}

TEST(FramesTest, ServerFramesOutsideTheSetAreRefusedByType) {
  ServerFrame f;
  for (const char* type : {"teacher_exit", "trainer_exit", "kv", "welcome", "nope"}) {
    const Status s = DecodeServerFrame(json{{"type", type}}, &f);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << type;
    EXPECT_EQ(s.message(), std::string("unexpected message '") + type + "' from the server");
  }
  Status s = DecodeServerFrame(json{{"type", "generation"}, {"generation", 1}}, &f);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_TRUE(std::holds_alternative<GenerationUpdate>(f));
  s = DecodeServerFrame(json{{"type", "error"}, {"code", 5}}, &f);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_TRUE(std::holds_alternative<ErrorMsg>(f));
}

}  // namespace
}  // namespace edl::proto
