#include "edl/net/auth.h"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::net {
namespace {

TEST(AuthTest, HmacMatchesRfc4231) {
  EXPECT_EQ(HmacHex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(AuthTest, NoncesAreFreshHex) {
  const std::string a = NewNonce(), b = NewNonce();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(AuthTest, MacsDependOnRoleNonceAndSecret) {
  const std::string n = NewNonce();
  EXPECT_TRUE(MacEqual(PeerMac("secret-secret-16", "client", n), PeerMac("secret-secret-16", "client", n)));
  EXPECT_FALSE(MacEqual(PeerMac("secret-secret-16", "client", n), PeerMac("secret-secret-17", "client", n)));
  EXPECT_FALSE(MacEqual(PeerMac("secret-secret-16", "client", n), PeerMac("secret-secret-16", "ctl", n)));
  EXPECT_FALSE(MacEqual(ServerMac("secret-secret-16", n), PeerMac("secret-secret-16", "client", n)));
  EXPECT_FALSE(MacEqual("abc", "ab"));
}

TEST(AuthTest, SecretFile) {
  test::ScratchDir dir;
  std::string s;
  EXPECT_EQ(ReadSecretFile("", &s).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile(dir.Join("missing"), &s).code(), Status::Code::kInvalidArgument);
  std::ofstream(dir.Join("short")) << "abc\n";
  EXPECT_EQ(ReadSecretFile(dir.Join("short"), &s).code(), Status::Code::kInvalidArgument);
  std::ofstream(dir.Join("good")) << "0123456789abcdef0123\n\n";
  ASSERT_OK(ReadSecretFile(dir.Join("good"), &s));
  EXPECT_EQ(s, "0123456789abcdef0123");
}

}  // namespace
}  // namespace edl::net
