#include "edl/net/trainer_channel.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "edl/runtime/env_contract.h"
#include "edl/runtime/run_mode.h"
#include "tests/testutil.h"

namespace edl::net {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// A stand-in client: accepts one trainer, welcomes it, pushes generations, answers KV.
class FakeClient {
 public:
  explicit FakeClient(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
  }
  ~FakeClient() { ::close(fd_); }
  std::unique_ptr<FramedSocket> Accept() {
    int c = ::accept(fd_, nullptr, nullptr);
    return std::make_unique<FramedSocket>(c, "trainer");
  }

 private:
  std::string path_;
  int fd_;
};

TEST(TrainerChannelTest, GenerationsKvAndReports) {
  test::ScratchDir dir;
  const std::string path = dir.Join("c.sock");
  FakeClient client(path);
  std::vector<json> seen;
  std::thread server([&] {
    auto s = client.Accept();
    json m;
    ASSERT_OK(s->Receive(&m, milliseconds(5000)));
    EXPECT_EQ(m["type"], "trainer_hello");
    EXPECT_EQ(m["trainer_id"], "t-1");
    ASSERT_OK(
        s->Send(json{{"type", "welcome"}, {"mac", ""}, {"job_id", "j"}, {"heartbeat_ms", 100}},
                milliseconds(5000)));
    proto::GenerationInfo g;
    g.generation = 3;
    g.job_id = "j";
    g.reason = "start";
    g.members.push_back({"t-1", "n1", 0, 0, "127.0.0.1"});
    json gj;
    proto::GenerationUpdate::Full(g).EncodeTo(&gj);
    ASSERT_OK(s->Send(gj, milliseconds(5000)));
    while (true) {
      Status st = s->Receive(&m, milliseconds(5000));
      if (!st.ok()) break;
      if (m["type"] == "heartbeat") continue;
      seen.push_back(m);
      if (m["type"] == "kv") {
        proto::KvReply r;
        r.req_id = m["req_id"].get<uint64_t>();
        if (m["op"] == "get")
          r.status = Status::NotFound("no key");
        else
          r.value = "v";
        json rj;
        r.EncodeTo(&rj);
        ASSERT_OK(s->Send(rj, milliseconds(5000)));
      }
    }
  });
  auto ch = TrainerChannel::Connect(path, "t-1", milliseconds(5000), milliseconds(50));
  ASSERT_OK(ch.status());
  proto::GenerationInfo g;
  ASSERT_OK(ch.value()->WaitGeneration(0, milliseconds(5000), &g));
  EXPECT_EQ(g.generation, 3);
  EXPECT_EQ(g.RankOf("t-1"), 0);
  EXPECT_TRUE(ch.value()->WaitGeneration(3, milliseconds(50), &g).IsTimeout());
  EXPECT_OK(ch.value()->KvSet("g3/k", "v"));
  std::string v;
  EXPECT_TRUE(ch.value()->KvGet("g3/k", &v).IsNotFound());
  EXPECT_OK(ch.value()->KvWait("g3/k", milliseconds(100), &v));
  EXPECT_EQ(v, "v");
  EXPECT_OK(ch.value()->ReportReady(3));
  net::ProgressReport p;
  p.step = 5;
  EXPECT_OK(ch.value()->ReportProgress(p));
  EXPECT_OK(ch.value()->ReportEvent(json{{"what", "hi"}}));
  EXPECT_TRUE(ch.value()->connected());
  ch.value().reset();
  server.join();
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[3]["type"], "ready");
  EXPECT_EQ(seen[4]["step"], 5);
  EXPECT_EQ(seen[5]["event"]["what"], "hi");
}

// Distillation's teacher lists through the client: the watch goes out, every pushed list of the
// watched service arrives in order, a list of a service nobody watches is ignored.
TEST(TrainerChannelTest, ServiceListsOfWatchedServicesArrive) {
  test::ScratchDir dir;
  const std::string path = dir.Join("c.sock");
  FakeClient client(path);
  std::thread server([&] {
    auto s = client.Accept();
    json m;
    ASSERT_OK(s->Receive(&m, milliseconds(5000)));
    ASSERT_OK(
        s->Send(json{{"type", "welcome"}, {"mac", ""}, {"job_id", "j"}, {"heartbeat_ms", 100}},
                milliseconds(5000)));
    do {  // heartbeats until the watch
      ASSERT_OK(s->Receive(&m, milliseconds(5000)));
    } while (m["type"] == "heartbeat");
    EXPECT_EQ(m, json({{"type", "service_watch"}, {"service", "kd"}}));
    for (const auto& [service, port] :
         std::vector<std::pair<std::string, int>>{{"other", 1}, {"kd", 9001}, {"kd", 9002}}) {
      proto::ServiceMembers l;
      l.service = service;
      l.members.push_back({"t" + std::to_string(port), "127.0.0.1", port});
      json j;
      l.EncodeTo(&j);
      ASSERT_OK(s->Send(j, milliseconds(5000)));
    }
    while (s->Receive(&m, milliseconds(5000)).ok()) {
    }
  });
  auto ch = TrainerChannel::Connect(path, "t-1", milliseconds(5000), milliseconds(50));
  ASSERT_OK(ch.status());
  ASSERT_OK(ch.value()->WatchService("kd"));
  uint64_t version = 0;
  proto::ServiceMembers got;
  int port = 0;
  while (port != 9002) {  // the first kd list may be overtaken by the second: never the other's
    ASSERT_OK(ch.value()->WaitServiceMembers("kd", &version, milliseconds(10000), &got));
    EXPECT_EQ(got.service, "kd");
    ASSERT_EQ(got.members.size(), 1u);
    port = got.members[0].port;
    EXPECT_TRUE(port == 9001 || port == 9002) << port;
  }
  EXPECT_TRUE(ch.value()->WaitServiceMembers("kd", &version, milliseconds(100), &got).IsTimeout());
  ch.value().reset();
  server.join();
}

// This process's name (/proc/self/comm: the main thread's).
std::string Comm() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// The env contract of spare "n1-spare-1" of job "j" under the client at `socket`.
runtime::EnvContract SpareOf(const std::string& socket, runtime::SpareKind kind) {
  runtime::EnvContract c;
  c.job_id = "j";
  c.trainer_id = "n1-spare-1";
  c.client_socket = socket;
  c.spare = kind;
  return c;
}

// A warm spare (PROTOCOL.md "Spares"): spare_hello, then nothing until the assignment; the runtime
// checks the assignment and writes it into the process environment.
TEST(SpareTest, TheAssignmentBecomesTheProcessEnvironment) {
  test::ScratchDir dir;
  const std::string path = dir.Join("c.sock");
  FakeClient client(path);
  runtime::EnvContract spare = SpareOf(path, runtime::SpareKind::kFull);
  spare.world_size = 4;
  runtime::EnvContract assigned = spare;
  assigned.trainer_id = "n1-s1-9";
  assigned.spare = runtime::SpareKind::kNone;
  assigned.joining = true;
  assigned.generation = 7;
  assigned.rank = 3;
  std::thread server([&] {
    auto s = client.Accept();
    json m;
    ASSERT_OK(s->Receive(&m, milliseconds(5000)));
    EXPECT_EQ(m["type"], "spare_hello");
    EXPECT_EQ(m["spare_id"], "n1-spare-1");
    // The waiting spare (the test's main thread) is named for ps.
    EXPECT_EQ(Comm(), "edl-spare");
    ASSERT_OK(s->Send(json{{"type", "heartbeat"}}, milliseconds(5000)));  // ignored while waiting
    proto::SpareAssign a;
    a.env = runtime::BuildTrainerEnv(assigned);
    ASSERT_OK(s->Send(a.Encoded(), milliseconds(5000)));
  });
  ::setenv(runtime::env::kSpare, "full", 1);
  ::setenv(runtime::env::kLocalTrainers, "3", 1);  // not in the assignment: unset by it
  const std::string own_name = Comm();
  auto plan = runtime::AwaitAssignment(runtime::PlanRun(spare), milliseconds(5000));
  server.join();
  EXPECT_EQ(Comm(), own_name);
  ASSERT_OK(plan.status());
  EXPECT_FALSE(plan.value().spare());
  EXPECT_TRUE(plan.value().joining());
  EXPECT_EQ(plan.value().env.trainer_id, "n1-s1-9");
  EXPECT_EQ(plan.value().env.rank, 3);
  EXPECT_EQ(std::getenv(runtime::env::kSpare), nullptr);
  EXPECT_EQ(std::getenv(runtime::env::kLocalTrainers), nullptr);
  ASSERT_NE(std::getenv(runtime::env::kTrainerId), nullptr);
  EXPECT_STREQ(std::getenv(runtime::env::kTrainerId), "n1-s1-9");
  auto again = runtime::TrainerEnvFromProcess();  // what the app reads from now on
  ASSERT_OK(again.status());
  EXPECT_EQ(again.value().generation, 7);
  EXPECT_TRUE(again.value().joining);
  for (const char* name : runtime::env::kAll) ::unsetenv(name);
}

TEST(SpareTest, AWrongAssignmentOrAClosedClientIsAClearError) {
  test::ScratchDir dir;
  const std::string path = dir.Join("c.sock");
  FakeClient client(path);
  const runtime::EnvContract spare = SpareOf(path, runtime::SpareKind::kHost);
  runtime::EnvContract other_job = spare;
  other_job.job_id = "k";
  other_job.trainer_id = "n1-s0-1";
  other_job.spare = runtime::SpareKind::kNone;
  std::thread server([&] {
    for (int i = 0; i < 3; ++i) {
      auto s = client.Accept();
      json m;
      ASSERT_OK(s->Receive(&m, milliseconds(5000)));
      proto::SpareAssign a;
      if (i == 0) a.env = runtime::BuildTrainerEnv(other_job);
      if (i == 1) a.env = {{"LD_PRELOAD", "/tmp/x.so"}};
      if (i < 2) ASSERT_OK(s->Send(a.Encoded(), milliseconds(5000)));
      // i == 2: the client releases the spare: the connection closes.
    }
  });
  const runtime::RunPlan plan = runtime::PlanRun(spare);
  auto got = runtime::AwaitAssignment(plan, milliseconds(5000));
  EXPECT_EQ(got.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(got.status().message().find("EDL_JOB_ID"), std::string::npos)
      << got.status().ToString();
  got = runtime::AwaitAssignment(plan, milliseconds(5000));
  EXPECT_EQ(got.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(got.status().message().find("LD_PRELOAD"), std::string::npos)
      << got.status().ToString();
  got = runtime::AwaitAssignment(plan, milliseconds(5000));
  EXPECT_EQ(got.status().code(), Status::Code::kAborted) << got.status().ToString();
  server.join();
  EXPECT_EQ(std::getenv(runtime::env::kTrainerId), nullptr)
      << "a refused assignment writes nothing";
}

TEST(TrainerChannelTest, NoSocketIsAClearError) {
  auto ch = TrainerChannel::Connect("/nonexistent/x.sock", "t", milliseconds(200));
  EXPECT_FALSE(ch.ok());
  auto ch2 = TrainerChannel::Connect("", "t", milliseconds(200));
  EXPECT_EQ(ch2.status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace edl::net
