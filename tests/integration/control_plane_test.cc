// Control-plane integration on loopback: a real `edl server`, two `edl client` processes and the
// stand-in trainer (helpers in control_plane_harness.h). Assertions come from the stand-ins' own
// records (pid, env, generations seen) and the server's events log.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "edl/proto/frame.h"
#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

using ControlPlaneTest = itest::ControlPlaneHarness;
using itest::Proc;
using itest::ReadLines;
using itest::Slurp;

// A raw TCP connection to the server on loopback, for bytes no well-behaved peer would send.
class RawPeer {
 public:
  explicit RawPeer(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  bool Write(const std::string& bytes) {
    size_t off = 0;
    while (fd_ >= 0 && off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return fd_ >= 0;
  }
  // Reads one whole frame (the server's challenge).
  bool ReadFrame(json* msg) {
    std::string buf;
    while (true) {
      size_t used = 0;
      if (proto::DecodeFrame(buf, msg, &used).ok()) return true;
      if (!ReadSome(&buf, milliseconds(30000))) return false;
    }
  }
  // Reads until the peer closes the connection (EOF or reset): true, with what came before the
  // close in *got; false when it is still open after `timeout`.
  bool ReadUntilClosed(std::string* got, milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (!ReadSome(got, std::chrono::duration_cast<milliseconds>(
                             end - std::chrono::steady_clock::now()))) {
        return closed_;
      }
    }
    return false;
  }

 private:
  // Appends what arrives within `timeout`; false on timeout or once the connection is closed.
  bool ReadSome(std::string* buf, milliseconds timeout) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(timeout.count(), 0)));
    if (r <= 0) return false;
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) return true;
    if (n <= 0) {
      closed_ = n == 0 || errno == ECONNRESET;
      return false;
    }
    buf->append(tmp, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool closed_ = false;
};

TEST_F(ControlPlaneTest, InPlaceScriptFourTwoThreeAndKill) { RunInPlaceFourTwoThreeAndKill(); }

TEST_F(ControlPlaneTest, RestartModeRestartsEveryTrainerWithNewEnv) {
  StartServer("0 set 4\n3 set 2\n6 set 3\n", 4);
  auto c1 = StartClient("n1", "restart");
  auto c2 = StartClient("n2", "restart");
  ASSERT_TRUE(
      WaitForGeneration([](const json& g) { return g["generation"] == 3; }, milliseconds(60000)))
      << Diagnostics();
  const std::map<int64_t, int> want = {{1, 4}, {2, 2}, {3, 3}};
  std::map<int64_t, std::vector<json>> starts;  // generation -> start records
  std::set<int> terminated;
  // Replacements start once their slot is free: wait until generation 3's trainers all started
  // and every trainer of generations 1 and 2 recorded its SIGTERM.
  const bool settled = itest::WaitFor(
      [&] {
        starts.clear();
        terminated.clear();
        for (const json& r : ReadLines(records_)) {
          if (r["event"] == "start") starts[r["generation"].get<int64_t>()].push_back(r);
          if (r["event"] == "term") terminated.insert(r["pid"].get<int>());
        }
        if (starts[3].size() < 3) return false;
        for (int64_t gen : {1, 2}) {
          for (const json& s : starts[gen]) {
            if (!terminated.count(s["pid"].get<int>())) return false;
          }
        }
        return true;
      },
      milliseconds(60000));
  EXPECT_TRUE(settled) << Diagnostics();
  for (auto [gen, world] : want) {
    ASSERT_EQ(starts[gen].size(), static_cast<size_t>(world))
        << "generation " << gen << Diagnostics();
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
  std::filesystem::permissions(
      dir_.Join("wrong"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  // A client with the wrong secret is refused and exits 2 without starting trainers.
  auto bad = StartClient("intruder", "inplace", dir_.Join("wrong"));
  EXPECT_EQ(bad->Wait(milliseconds(15000)), 2);
  EXPECT_NE(Slurp(dir_.Join("intruder.log")).find("Unauthenticated"), std::string::npos);
  std::string out;
  EXPECT_EQ(Ctl({"scale", "3"}, &out, dir_.Join("wrong")), 1);
  EXPECT_NE(out.find("Unauthenticated"), std::string::npos) << out;
  // Raw garbage, an oversize header, a frame before hello and a hello with a bad MAC: each
  // connection is closed by the server (after at most an error frame), and nothing else happens.
  const std::string hello_bad_mac = proto::EncodeFrame(json{{"type", "hello"},
                                                            {"role", "ctl"},
                                                            {"mac", std::string(64, '0')},
                                                            {"nonce", std::string(64, '1')}});
  char oversize[proto::kFrameHeaderBytes];
  proto::EncodeFrameHeader(proto::kMaxFrameBytes + 1, oversize);
  // {what, bytes, the error the server must send first ("": none required, the close is enough)}
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"garbage", "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, '\xff'), ""},
      {"oversize header", std::string(oversize, sizeof(oversize)) + std::string(1024, 'x'), ""},
      {"frame before hello", proto::EncodeFrame(json{{"type", "ctl"}, {"command", "stop"}}),
       "expected 'hello'"},
      {"hello with a bad MAC", hello_bad_mac, "bad HMAC"}};
  for (const auto& [what, bytes, must_say] : cases) {
    SCOPED_TRACE(what);
    RawPeer peer(std::stoi(port_));
    json challenge;
    ASSERT_TRUE(peer.ReadFrame(&challenge)) << "no challenge from the server";
    EXPECT_EQ(challenge["type"], "challenge") << challenge.dump();
    ASSERT_TRUE(peer.Write(bytes));
    std::string rest;
    ASSERT_TRUE(peer.ReadUntilClosed(&rest, milliseconds(30000)))
        << "the server kept the connection open; received " << rest.size() << " bytes";
    // Whatever came before the close is error frames only, naming the problem.
    size_t off = 0;
    std::string errors;
    while (off < rest.size()) {
      json m;
      size_t used = 0;
      ASSERT_OK(proto::DecodeFrame(rest.substr(off), &m, &used));
      EXPECT_EQ(m["type"], "error") << m.dump();
      errors += m.dump();
      off += used;
    }
    std::cout << what << ": closed after " << (errors.empty() ? "no error frame" : errors) << "\n";
    if (!must_say.empty()) {
      EXPECT_NE(errors.find(must_say), std::string::npos) << errors;
    }
  }
  // The server still serves an authenticated ctl, and no trainer was started by anybody.
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0) << out;
  EXPECT_NE(out.find("\"world_size\": 0"), std::string::npos) << out;
  EXPECT_EQ(Slurp(records_), "");
}

// A node name is not an identity (PROTOCOL.md "Authentication"): a second client with the name of
// a live node, without that node's session token, is refused with a retryable error. It keeps
// retrying with backoff rather than exiting, and the real node keeps its place and its trainers.
TEST_F(ControlPlaneTest, SecondClientWithTheSameNodeNameIsRefused) {
  StartServer("", 2);
  auto c1 = StartClient("same", "inplace");
  ASSERT_TRUE(
      WaitForGeneration([](const json& g) { return g["generation"] == 1; }, milliseconds(20000)))
      << Diagnostics();
  const std::string dup_state = dir_.Join("dup-state");  // its own state dir: no token of "same"
  std::vector<std::string> argv = {test::EdlBinary(),
                                   "client",
                                   "--server",
                                   "127.0.0.1:" + port_,
                                   "--secret_file",
                                   secret_,
                                   "--node_name",
                                   "same",
                                   "--slots",
                                   "2",
                                   "--socket_path",
                                   dir_.Join("dup.sock"),
                                   "--state_dir",
                                   dup_state,
                                   "--",
                                   STAND_IN_TRAINER};
  Proc dup(argv, dir_.Join("dup.log"));
  auto refusals = [&] {
    const std::string log = Slurp(dir_.Join("dup.log"));
    size_t n = 0;
    for (size_t at = log.find("belongs to another client"); at != std::string::npos;
         at = log.find("belongs to another client", at + 1)) {
      ++n;
    }
    return n;
  };
  ASSERT_TRUE(itest::WaitFor([&] { return refusals() >= 2; }, milliseconds(30000)))
      << "the squatter was not refused twice:\n"
      << Slurp(dir_.Join("dup.log"));
  EXPECT_EQ(dup.Wait(milliseconds(0)), -1) << "a retryable refusal made the client exit";
  std::string out;
  ASSERT_EQ(Ctl({"status", "--json"}, &out), 0);
  EXPECT_NE(out.find("\"world_size\": 2"), std::string::npos) << out;
  dup.Stop();
}

// One client per machine (jobclient/host_slots.h): a second `edl client` on this machine that
// offers one of the first one's slots of the same host to the same server exits 1 at once, before
// any connection, naming the first one's node and pid and the fix; the first one carries on.
TEST_F(ControlPlaneTest, ASecondClientOnTheMachineIsRefusedAtOnceByTheClient) {
  StartServer("", 0);
  auto client = [&](const std::string& node, const std::string& slots) {
    return std::vector<std::string>{test::EdlBinary(),
                                    "client",
                                    "--server",
                                    "127.0.0.1:" + port_,
                                    "--secret_file",
                                    secret_,
                                    "--node_name",
                                    node,
                                    "--slots",
                                    slots,
                                    "--advertise_addr",
                                    "10.254.0.1",
                                    "--socket_path",
                                    dir_.Join(node + ".sock"),
                                    "--",
                                    STAND_IN_TRAINER};
  };
  Proc first(client("first", "2"), dir_.Join("first.log"));
  ASSERT_TRUE(itest::WaitFor(
      [&] { return Slurp(dir_.Join("first.log")).find("holds 2 slot(s)") != std::string::npos; },
      milliseconds(30000)))
      << Slurp(dir_.Join("first.log"));
  Proc second(client("second", "1"), dir_.Join("second.log"));
  EXPECT_EQ(second.Wait(milliseconds(30000)), 1) << Slurp(dir_.Join("second.log"));
  const std::string said = Slurp(dir_.Join("second.log"));
  EXPECT_NE(said.find("slot 0 of host 10.254.0.1 is offered to the server 127.0.0.1:" + port_ +
                      " by the edl client of node first (pid " + std::to_string(first.pid()) + ")"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("give the two disjoint slots"), std::string::npos) << said;
  EXPECT_TRUE(first.Running());
  first.Stop();
}

}  // namespace
}  // namespace edl
