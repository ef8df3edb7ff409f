// Control-plane integration on loopback: a real `edl server`, two `edl client` processes and the
// stand-in trainer (helpers in control_plane_harness.h). Assertions come from the stand-ins' own
// records (pid, env, generations seen) and the server's events log.
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "edl/net/framed_socket.h"
#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

using ControlPlaneTest = itest::ControlPlaneHarness;
using itest::Proc;
using itest::ReadLines;
using itest::Slurp;

TEST_F(ControlPlaneTest, InPlaceScriptFourTwoThreeAndKill) { RunInPlaceFourTwoThreeAndKill(); }

TEST_F(ControlPlaneTest, RestartModeRestartsEveryTrainerWithNewEnv) {
  StartServer("0 set 4\n3 set 2\n6 set 3\n", 4);
  auto c1 = StartClient("n1", "restart");
  auto c2 = StartClient("n2", "restart");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["generation"] == 3; }, milliseconds(60000)))
      << Diagnostics();
  std::this_thread::sleep_for(milliseconds(3000));  // replacements start once their slot is free
  std::map<int64_t, std::vector<json>> starts;  // generation -> start records
  std::set<int> terminated;
  for (const json& r : ReadLines(records_)) {
    if (r["event"] == "start") starts[r["generation"].get<int64_t>()].push_back(r);
    if (r["event"] == "term") terminated.insert(r["pid"].get<int>());
  }
  const std::map<int64_t, int> want = {{1, 4}, {2, 2}, {3, 3}};
  for (auto [gen, world] : want) {
    ASSERT_EQ(starts[gen].size(), static_cast<size_t>(world)) << "generation " << gen << Diagnostics();
    std::set<int> ranks;
    for (const json& s : starts[gen]) {
      EXPECT_EQ(s["world_size"], world);
      EXPECT_EQ(s["restart_mode"], true) << "EDL_RESTART_MODE=1 in the env contract: " << s.dump();
      ranks.insert(s["rank"].get<int>());
      if (gen < 3) {
        EXPECT_TRUE(terminated.count(s["pid"].get<int>())) << "not restarted: " << s.dump();
      }
    }
    EXPECT_EQ(ranks.size(), static_cast<size_t>(world));
    EXPECT_EQ(*ranks.rbegin(), world - 1);
  }
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(c1->Wait(milliseconds(15000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(15000)), 0);
}

TEST_F(ControlPlaneTest, UnauthenticatedPeersAreRefusedAndTheServerKeepsServing) {
  StartServer("", 1);
  std::ofstream(dir_.Join("wrong")) << "a-different-secret-of-enough-length\n";
  std::filesystem::permissions(dir_.Join("wrong"), std::filesystem::perms::owner_read |
                                                       std::filesystem::perms::owner_write);
  // A client with the wrong secret is refused and exits 2 without starting trainers.
  auto bad = StartClient("intruder", "inplace", dir_.Join("wrong"));
  EXPECT_EQ(bad->Wait(milliseconds(15000)), 2);
  EXPECT_NE(Slurp(dir_.Join("intruder.log")).find("Unauthenticated"), std::string::npos);
  std::string out;
  EXPECT_EQ(Ctl({"scale", "3"}, &out, dir_.Join("wrong")), 1);
  EXPECT_NE(out.find("Unauthenticated"), std::string::npos) << out;
  // Raw garbage, an oversize header, and a frame before hello: each connection is dropped.
  std::string host = "127.0.0.1";
  for (int kind = 0; kind < 3; ++kind) {
    auto s = net::FramedSocket::ConnectTcp(host, std::stoi(port_), milliseconds(2000));
    ASSERT_OK(s.status());
    json m;
    ASSERT_OK(s.value()->Receive(&m, milliseconds(2000)));  // the challenge
    if (kind == 0) {
      ASSERT_OK(s.value()->Send(json{{"type", "ctl"}, {"command", "stop"}}, milliseconds(2000)));
    } else {
      ASSERT_OK(s.value()->Send(json{{"type", "hello"}, {"role", "ctl"}, {"mac", std::string(64, '0')},
                                     {"nonce", std::string(64, '1')}},
                                milliseconds(2000)));
    }
    Status st = s.value()->Receive(&m, milliseconds(5000));
    if (st.ok()) {
      EXPECT_EQ(m["type"], "error") << m.dump();
    }
  }
  // The server still serves an authenticated ctl, and no trainer was started by anybody.
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  EXPECT_NE(out.find("\"world_size\": 0"), std::string::npos) << out;
  EXPECT_EQ(Slurp(records_), "");
}

TEST_F(ControlPlaneTest, SecondClientWithTheSameNodeNameIsRefused) {
  StartServer("", 2);
  auto c1 = StartClient("same", "inplace");
  ASSERT_TRUE(WaitForGeneration([](const json& g) { return g["generation"] == 1; }, milliseconds(20000)))
      << Diagnostics();
  std::vector<std::string> argv = {test::EdlBinary(), "client", "--server", "127.0.0.1:" + port_,
                                   "--secret_file", secret_, "--node_name", "same", "--slots", "2",
                                   "--socket_path", dir_.Join("dup.sock"), "--", STAND_IN_TRAINER};
  Proc dup(argv, dir_.Join("dup.log"));
  EXPECT_EQ(dup.Wait(milliseconds(15000)), 2);
  EXPECT_NE(Slurp(dir_.Join("dup.log")).find("already connected"), std::string::npos);
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0);
  EXPECT_NE(out.find("\"world_size\": 2"), std::string::npos) << out;
}

}  // namespace
}  // namespace edl
