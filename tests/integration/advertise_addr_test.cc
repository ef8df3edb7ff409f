// A client that advertises a loopback address while connecting from another machine is refused
// by the server with the fix, and exits (docs/SSH.md, "Without ssh"). A real server
// and real clients; "another machine" is this machine's own non-loopback address, which the
// server sees as the connection's source.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/testutil.h"

namespace edl {
namespace {

using itest::Proc;
using itest::Slurp;
using itest::WaitFor;
using std::chrono::milliseconds;

TEST(AdvertiseAddrTest, LoopbackAdvertisedFromAnotherAddressIsRefusedWithTheFix) {
  const std::string addr = itest::NonLoopbackAddress();
  if (addr.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to connect from";
  test::ScratchDir dir("advertise");
  const std::string secret = dir.Join("secret");
  itest::WriteSecretFile(secret, "advertise-addr-test-secret-0123456789abcdef");
  Proc server({test::EdlBinary(), "server", "--server_port", "0", "--bind", "0.0.0.0",
               "--port_file", dir.Join("port"), "--secret_file", secret, "--job_id", "adv",
               "--trainers", "1", "--min_trainers", "1", "--events_dir", dir.Join("events")},
              dir.Join("server.log"));
  const std::string port = itest::WaitForPortFile(dir.Join("port"), &server);
  ASSERT_FALSE(port.empty()) << Slurp(dir.Join("server.log"));
  auto client = [&](const std::string& name, const std::string& server_addr,
                    const std::string& advertise) {
    return std::make_unique<Proc>(
        std::vector<std::string>{test::EdlBinary(), "client", "--server", server_addr + ":" + port,
                                 "--secret_file", secret, "--node_name", name, "--slots", "1",
                                 "--advertise_addr", advertise, "--socket_path",
                                 dir.Join(name + ".sock"), "--log_dir", dir.Join("logs"), "--",
                                 "/bin/sleep", "1000"},
        dir.Join(name + ".log"));
  };

  // From the non-loopback address with 127.0.0.1 advertised: refused, and the client stops.
  auto bad = client("remote", addr, "127.0.0.1");
  EXPECT_EQ(bad->Wait(milliseconds(60000)), 2) << Slurp(dir.Join("remote.log"), 4000);
  const std::string why = Slurp(dir.Join("remote.log"));
  EXPECT_NE(
      why.find("node remote advertises the loopback address 127.0.0.1 but connects from " + addr),
      std::string::npos)
      << why;
  EXPECT_NE(why.find("--advertise_addr"), std::string::npos) << "the fix is named: " << why;

  // The same address advertised as it is reached, and loopback over loopback: both join.
  auto good = client("remote2", addr, addr);
  auto local = client("local", "127.0.0.1", "127.0.0.1");
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string log = Slurp(dir.Join("server.log"));
        return log.find("node remote2 registered") != std::string::npos &&
               log.find("node local registered") != std::string::npos;
      },
      milliseconds(60000)))
      << Slurp(dir.Join("server.log"), 4000);
  EXPECT_LT(good->Wait(milliseconds(0)), 0) << "a correctly configured client exited";

  // An address the server cannot take ('[::1]' is no host: IPv6 literals go without brackets):
  // the client holds the secret, so the refusal carries the server's proof and the client exits 2
  // naming the field, instead of retrying for ever (issue 32, item 10).
  auto brackets = client("brackets", "127.0.0.1", "[::1]");
  EXPECT_EQ(brackets->Wait(milliseconds(60000)), 2) << Slurp(dir.Join("brackets.log"), 4000);
  const std::string refused = Slurp(dir.Join("brackets.log"));
  EXPECT_NE(refused.find("server refused us"), std::string::npos) << refused;
  EXPECT_NE(refused.find("is not a host name or IP address"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("cannot prove"), std::string::npos) << refused;
}

}  // namespace
}  // namespace edl
