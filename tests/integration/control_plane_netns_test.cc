// Control-plane integration across network namespaces: the loopback scenario (script 4 -> 2 -> 3
// plus a kill) with the server and each client in their own namespace with their own addresses;
// and a cut link: the node behind it is lost by the heartbeat bound, the others train on, and once
// the link is back the node is told it was dropped and rejoins.
// The topology is a star of veth pairs around the server's namespace:
//
//   edl-<pid>-n1  10.231.1.2/24 --veth-- 10.231.1.1/24 --+
//                                                         +-- edl-<pid>-srv (server binds 0.0.0.0)
//   edl-<pid>-n2  10.231.2.2/24 --veth-- 10.231.2.1/24 --+
//
// Veth pairs are created directly inside the namespaces, so nothing appears in the host's
// namespace; deleting the namespaces (in the destructor, also on failure) removes them. Needs
// root and `ip netns`; otherwise the test skips and says why.
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/integration/control_plane_harness.h"

namespace edl {
namespace {

using itest::json;
using itest::milliseconds;
using itest::ReadLines;
using itest::WaitFor;

constexpr char kIp[] = "/usr/sbin/ip";

// The namespaces and links of one test; removed (by name) when the object goes away.
class NetnsStar {
 public:
  NetnsStar(std::string log, std::vector<std::string> leaves) : log_(std::move(log)) {
    const std::string tag = "edl-" + std::to_string(::getpid()) + "-";
    server_ns_ = tag + "srv";
    for (const std::string& leaf : leaves) leaf_ns_[leaf] = tag + leaf;
  }
  ~NetnsStar() {
    for (const std::string& ns : created_) itest::RunCommand({kIp, "netns", "delete", ns}, log_);
  }
  NetnsStar(const NetnsStar&) = delete;
  NetnsStar& operator=(const NetnsStar&) = delete;

  // Why this machine cannot run the test, or "" when it can.
  static std::string WhyUnsupported(const std::string& log) {
    if (::geteuid() != 0) return "needs root to create network namespaces";
    if (::access(kIp, X_OK) != 0) return std::string(kIp) + " not found (install iproute2)";
    if (itest::RunCommand({kIp, "netns", "list"}, log) != 0)
      return "`ip netns list` failed; see " + log;
    return "";
  }

  // Creates the namespaces and links. The first failure is returned with the command's log.
  std::string Build() {
    if (!Add(server_ns_)) return "ip netns add " + server_ns_ + " failed: " + itest::Slurp(log_);
    if (!Run({kIp, "-n", server_ns_, "link", "set", "lo", "up"}))
      return Failed("lo up in " + server_ns_);
    int i = 0;
    for (auto& [leaf, ns] : leaf_ns_) {
      ++i;
      if (!Add(ns)) return Failed("ip netns add " + ns);
      const std::string net = "10.231." + std::to_string(i) + ".";
      const std::string hub_if = "s" + std::to_string(i), leaf_if = "c" + std::to_string(i);
      if (!Run({kIp, "link", "add", hub_if, "netns", server_ns_, "type", "veth", "peer", "name",
                leaf_if, "netns", ns}) ||
          !Run({kIp, "-n", server_ns_, "addr", "add", net + "1/24", "dev", hub_if}) ||
          !Run({kIp, "-n", server_ns_, "link", "set", hub_if, "up"}) ||
          !Run({kIp, "-n", ns, "addr", "add", net + "2/24", "dev", leaf_if}) ||
          !Run({kIp, "-n", ns, "link", "set", leaf_if, "up"}) ||
          !Run({kIp, "-n", ns, "link", "set", "lo", "up"})) {
        return Failed("veth " + server_ns_ + " <-> " + ns);
      }
      hub_addr_[leaf] = net + "1";
      leaf_addr_[leaf] = net + "2";
    }
    return "";
  }

  // argv prefix running a command in `leaf`'s namespace ("" = the server's). `ip netns exec`
  // execs the command in place, so the pid we hold is the command's.
  std::vector<std::string> Exec(const std::string& leaf) const {
    return {kIp, "netns", "exec", leaf.empty() ? server_ns_ : leaf_ns_.at(leaf)};
  }
  const std::string& HubAddr(const std::string& leaf) const { return hub_addr_.at(leaf); }
  // Takes `leaf`'s link down (up) at the server's end: a cut cable, with no packet and no reset
  // reaching either side.
  bool SetLink(const std::string& leaf, bool up) {
    int i = 0;
    for (const auto& [name, ns] : leaf_ns_) {
      ++i;
      if (name == leaf)
        return Run(
            {kIp, "-n", server_ns_, "link", "set", "s" + std::to_string(i), up ? "up" : "down"});
    }
    return false;
  }
  const std::string& LeafAddr(const std::string& leaf) const { return leaf_addr_.at(leaf); }

 private:
  bool Run(const std::vector<std::string>& argv) { return itest::RunCommand(argv, log_) == 0; }
  bool Add(const std::string& ns) {
    if (!Run({kIp, "netns", "add", ns})) return false;
    created_.push_back(ns);
    return true;
  }
  std::string Failed(const std::string& what) { return what + " failed: " + itest::Slurp(log_); }

  const std::string log_;
  std::string server_ns_;
  std::map<std::string, std::string> leaf_ns_;  // leaf name -> namespace
  std::map<std::string, std::string> hub_addr_, leaf_addr_;
  std::vector<std::string> created_;
};

class NetnsControlPlaneTest : public itest::ControlPlaneHarness {
 protected:
  void SetUp() override {
    ControlPlaneHarness::SetUp();
    const std::string log = dir_.Join("netns.log");
    const std::string why = NetnsStar::WhyUnsupported(log);
    if (!why.empty()) GTEST_SKIP() << "network-namespace test skipped: " << why;
    star_ = std::make_unique<NetnsStar>(log, std::vector<std::string>{"n1", "n2"});
    const std::string err = star_->Build();
    ASSERT_EQ(err, "") << "cannot build the namespace topology";
  }
  // star_ would be destroyed before the harness's server: stop the server (clients are the test
  // body's locals, already stopped) before removing the namespaces.
  void TearDown() override {
    server_.reset();
    star_.reset();
  }

  std::vector<std::string> Wrap(const std::string& role) override {
    if (role == "server" || role == "ctl") return star_->Exec("");
    return star_->Exec(role);
  }
  std::string ServerBind() override { return "0.0.0.0"; }
  std::string ServerAddrFor(const std::string& role) override {
    return role == "ctl" ? "127.0.0.1" : star_->HubAddr(role);
  }
  std::string AdvertiseAddrFor(const std::string& node) override { return star_->LeafAddr(node); }

  std::unique_ptr<NetnsStar> star_;
};

TEST_F(NetnsControlPlaneTest, InPlaceScriptFourTwoThreeAndKillAcrossNamespaces) {
  RunInPlaceFourTwoThreeAndKill([this](const json& start) {
    // MASTER_ADDR is rank 0's node address: one of the clients' own namespace addresses.
    const std::string master = start["master"];
    EXPECT_TRUE(master.rfind(star_->LeafAddr("n1") + ":", 0) == 0 ||
                master.rfind(star_->LeafAddr("n2") + ":", 0) == 0)
        << master;
  });
  // The server saw each client connect from that client's own address.
  const std::string log = itest::Slurp(dir_.Join("server.log"));
  EXPECT_NE(log.find("node n1 registered from " + star_->LeafAddr("n1")), std::string::npos) << log;
  EXPECT_NE(log.find("node n2 registered from " + star_->LeafAddr("n2")), std::string::npos) << log;
}

// A cut link (n2's veth down at the server's end: no FIN, no RST) is a node loss by heartbeat:
// the server drops n2 ("no heartbeat for ..." rather than a closed connection) and the survivors
// on n1 re-form in place and go on; with the link back, n2 learns it was dropped, stops its stale
// trainers and rejoins, and the job grows back to 4.
TEST_F(NetnsControlPlaneTest, CutLinkIsANodeLossByHeartbeatAndTheOthersTrainOn) {
  StartServer("", 4, {"--backoff_min_s", "0", "--backoff_max_s", "0"});
  if (HasFatalFailure()) return;
  auto c1 = StartClient("n1", "inplace");
  auto c2 = StartClient("n2", "inplace");
  ASSERT_TRUE(WaitFor([&] { return KvRounds(1) == 4; }, milliseconds(60000))) << Diagnostics();
  ASSERT_TRUE(star_->SetLink("n2", false)) << itest::Slurp(dir_.Join("netns.log"));
  bool trained_on = false;
  const int64_t lost = WaitForFailureAndReform(2, &trained_on);
  ASSERT_TRUE(star_->SetLink("n2", true)) << itest::Slurp(dir_.Join("netns.log"));
  ASSERT_GT(lost, 0) << Diagnostics();
  ASSERT_TRUE(trained_on) << "the survivors did not re-form" << Diagnostics();
  std::string why;
  for (const json& e : Events()) {
    if (e["type"] == "node_lost" && e["node"] == "n2") why = e["why"];
  }
  EXPECT_EQ(why.rfind("no heartbeat for 3000 ms", 0), 0u) << "lost by the heartbeat bound: " << why;
  for (const json& r : ReadLines(records_)) {
    if (r["event"] == "kv" && r["generation"] == lost) {
      EXPECT_EQ(r["trainer_id"].get<std::string>().rfind("n1-", 0), 0u) << r.dump();
    }
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        const int64_t grown = FirstGeneration([&](const json& g) {
          return g["generation"].get<int64_t>() > lost && g["world_size_after"] == 4;
        });
        return grown > 0 && KvRounds(grown) == 4;
      },
      milliseconds(60000)))
      << Diagnostics();
  EXPECT_NE(itest::Slurp(dir_.Join("n2.log")).find("the server dropped this node"),
            std::string::npos)
      << itest::Slurp(dir_.Join("n2.log"));
  std::string out;
  ASSERT_EQ(Ctl({"stop"}, &out), 0) << out;
  EXPECT_EQ(server_->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c1->Wait(milliseconds(20000)), 0);
  EXPECT_EQ(c2->Wait(milliseconds(20000)), 0);
}

}  // namespace
}  // namespace edl
