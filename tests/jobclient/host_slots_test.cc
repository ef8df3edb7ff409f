// HostSlotClaim (jobclient/host_slots.h): one edl client per machine and server, refused by the
// client itself at once, with the holder and the fix; loopback, disjoint slots and another
// server stay allowed; a restarting node's new client waits for its old one.
#include "jobclient/host_slots.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "edl/proto/messages.h"
#include "tests/testutil.h"

namespace edl::jobclient {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(HostSlotClaimTest, ASecondClaimOfOneSlotIsRefusedWithTheHolderAndTheFix) {
  test::ScratchDir dir("edl-slots");
  HostSlotClaim a;
  ASSERT_OK(a.Claim(dir.path(), "10.0.0.9:8180", "10.0.0.1", {0, 1}, "a"));
  ASSERT_EQ(a.paths().size(), 2u);
  EXPECT_EQ(Slurp(a.paths()[0]), std::to_string(::getpid()) + " a\n");

  HostSlotClaim b;
  const Status s = b.Claim(dir.path(), "10.0.0.9:8180", "10.0.0.1", {1, 2}, "b");
  ASSERT_EQ(s.code(), Status::Code::kAlreadyExists) << s.ToString();
  EXPECT_NE(s.message().find("slot 1 of host 10.0.0.1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("node a (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find(proto::kOneClientPerMachineFix), std::string::npos) << s.ToString();
  EXPECT_TRUE(b.paths().empty()) << "a refused claim keeps nothing";

  // Disjoint slots, another server, another advertised host: not the same offer.
  HostSlotClaim c, d, e;
  EXPECT_OK(c.Claim(dir.path(), "10.0.0.9:8180", "10.0.0.1", {2, 3}, "c"));
  EXPECT_OK(d.Claim(dir.path(), "10.0.0.9:9999", "10.0.0.1", {0}, "d"));
  EXPECT_OK(e.Claim(dir.path(), "10.0.0.9:8180", "10.0.0.2", {0}, "e"));
}

TEST(HostSlotClaimTest, LoopbackClaimsNothingAndAReleaseFreesTheSlotsAndRemovesTheFiles) {
  test::ScratchDir dir("edl-slots");
  HostSlotClaim lo1, lo2;
  EXPECT_OK(lo1.Claim(dir.path(), "127.0.0.1:8180", "127.0.0.1", {0}, "n1"));
  EXPECT_OK(lo2.Claim(dir.path(), "127.0.0.1:8180", "localhost", {0}, "n2"));
  EXPECT_TRUE(lo1.paths().empty());
  std::vector<std::string> paths;
  {
    HostSlotClaim a;
    ASSERT_OK(a.Claim(dir.path(), "s:1", "fd00::1", {0}, "a"));
    paths = a.paths();
    ASSERT_EQ(paths.size(), 1u);
    EXPECT_EQ(paths[0].find(':', dir.path().size()), std::string::npos) << paths[0];
  }
  EXPECT_FALSE(std::filesystem::exists(paths[0]));
  HostSlotClaim b;
  EXPECT_OK(b.Claim(dir.path(), "s:1", "fd00::1", {0}, "b"));
}

TEST(HostSlotClaimTest, TheNewClientOfARestartingNodeWaitsForItsOldOne) {
  test::ScratchDir dir("edl-slots");
  auto old_client = std::make_unique<HostSlotClaim>();
  ASSERT_OK(old_client->Claim(dir.path(), "s:1", "10.0.0.1", {0}, "n1"));
  Status got = Status::Internal("not run");
  std::thread restart([&] {
    HostSlotClaim fresh;
    got = fresh.Claim(dir.path(), "s:1", "10.0.0.1", {0}, "n1");
  });
  old_client.reset();  // the old client exits (before or while the new one waits: both must work)
  restart.join();
  EXPECT_OK(got);
}

TEST(HostSlotClaimTest, AnUnwritableDirectoryIsNamed) {
  HostSlotClaim a;
  const Status s = a.Claim("/nonexistent-edl-dir", "s:1", "10.0.0.1", {0}, "a");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("/nonexistent-edl-dir must be writable"), std::string::npos)
      << s.ToString();
}

// Two network namespaces are two machines that may share a filesystem (containers, the ssh tests'
// nodes): the same address and slot claimed in each are two offers, not one.
TEST(HostSlotClaimTest, AnotherNetworkNamespaceIsAnotherMachine) {
  test::ScratchDir dir("edl-slots");
  HostSlotClaim here;
  ASSERT_OK(here.Claim(dir.path(), "s:1", "10.0.0.1", {0}, "a"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 2: no namespace could be made (not root); 0: claimed there; 1: refused there.
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(2);
    HostSlotClaim there;
    ::_exit(there.Claim(dir.path(), "s:1", "10.0.0.1", {0}, "b").ok() ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  ASSERT_NE(WEXITSTATUS(st), 2)
      << "unshare(CLONE_NEWNET) failed: this test needs root, as the network-namespace tests do";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "a claim in another network namespace was refused";
}

}  // namespace
}  // namespace edl::jobclient
