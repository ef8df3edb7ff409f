#include "edl/net/auth.h"

#include <sys/stat.h>

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

TEST(AuthTest, HandshakeMacsCoverEveryFieldTheNonceAndTheSecret) {
  const std::string s = "cluster-secret-0123456789abcdefgh", n = NewNonce();
  const nlohmann::json hello = {{"type", "hello"},     {"role", "client"},
                                {"nonce", NewNonce()}, {"node", "n1"},
                                {"host", "10.0.0.1"},  {"mode", "inplace"},
                                {"slots", {0, 1}},     {"trainers", nlohmann::json::array()}};
  const std::string m = HelloMac(s, n, hello);
  EXPECT_EQ(m.size(), 64u);
  // The mac field itself is left out, and key order does not matter.
  nlohmann::json with_mac = hello;
  with_mac["mac"] = m;
  EXPECT_TRUE(MacEqual(m, HelloMac(s, n, with_mac)));
  EXPECT_TRUE(MacEqual(m, HelloMac(s, n, nlohmann::json::parse(with_mac.dump()))));
  // Every other field, the server's nonce and the secret are covered.
  for (const auto& [key, value] : hello.items()) {
    nlohmann::json changed = hello;
    changed[key] = key == "slots" ? nlohmann::json{0, 2} : nlohmann::json("other");
    EXPECT_FALSE(MacEqual(m, HelloMac(s, n, changed))) << key;
  }
  nlohmann::json extra = hello;
  extra["admin"] = true;
  EXPECT_FALSE(MacEqual(m, HelloMac(s, n, extra)));
  EXPECT_FALSE(MacEqual(m, HelloMac(s, NewNonce(), hello)));
  EXPECT_FALSE(MacEqual(m, HelloMac(s + "x", n, hello)));
  // A welcome MAC is not a hello MAC, and covers its fields.
  const nlohmann::json welcome = {{"type", "welcome"}, {"job_id", "j"}, {"heartbeat_ms", 500}};
  const std::string w = WelcomeMac(s, n, welcome);
  nlohmann::json slower = welcome;
  slower["heartbeat_ms"] = 3600000;
  EXPECT_FALSE(MacEqual(w, WelcomeMac(s, n, slower)));
  EXPECT_FALSE(MacEqual(w, HelloMac(s, n, welcome)));
  EXPECT_FALSE(MacEqual("abc", "ab"));
}

// Writes `content` to `path` with `mode`.
std::string WriteSecret(const std::string& path, const std::string& content, mode_t mode = 0600) {
  std::ofstream(path) << content;
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return path;
}

TEST(AuthTest, SecretFileMustBePrivateLongAndRandom) {
  test::ScratchDir dir;
  std::string s;
  const std::string good = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWo=";  // base64 of 32 bytes
  Status st = ReadSecretFile("", &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("head -c 32 /dev/urandom"), std::string::npos) << st.ToString();
  EXPECT_EQ(ReadSecretFile(dir.Join("missing"), &s).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile(dir.path(), &s).code(), Status::Code::kInvalidArgument);  // a directory

  st = ReadSecretFile(WriteSecret(dir.Join("short"), "0123456789abcdef0123456789\n"), &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("at least 32"), std::string::npos) << st.ToString();

  st = ReadSecretFile(WriteSecret(dir.Join("same"), std::string(64, 'a') + "\n"), &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not random"), std::string::npos) << st.ToString();
  st = ReadSecretFile(WriteSecret(dir.Join("few"), "abababababababababcdcdcdcdcdcdcdcdcdcd\n"), &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << "4 distinct byte values";

  for (mode_t mode : {0644, 0640, 0604, 0660, 0606}) {
    st = ReadSecretFile(WriteSecret(dir.Join("open"), good, mode), &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << std::oct << mode;
    EXPECT_NE(st.message().find("chmod 600"), std::string::npos) << st.ToString();
  }
  st = ReadSecretFile(WriteSecret(dir.Join("huge"), std::string(5000, 'x') + good), &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);

  ASSERT_OK(ReadSecretFile(WriteSecret(dir.Join("good"), good + "\n\n"), &s));
  EXPECT_EQ(s, good);
  ASSERT_OK(ReadSecretFile(WriteSecret(dir.Join("ro"), good, 0400), &s));
  // What scripts/edl_common.sh writes: 32 random bytes as 64 hex characters.
  ASSERT_OK(ReadSecretFile(WriteSecret(dir.Join("hex"), NewNonce()), &s));
  EXPECT_EQ(s.size(), 64u);
}

TEST(AuthTest, TokenFileHasTheSecretFilesChecksAndNamesItsFlag) {
  test::ScratchDir dir;
  std::string t;
  const std::string good = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWo=";
  Status st = ReadTokenFile(WriteSecret(dir.Join("open"), good, 0644), "--http_token_file", &t);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--http_token_file"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("chmod 600"), std::string::npos) << st.ToString();
  st = ReadTokenFile(WriteSecret(dir.Join("short"), "abc"), "--http_token_file", &t);
  EXPECT_NE(st.message().find("head -c 32 /dev/urandom | base64"), std::string::npos)
      << st.ToString();
  ASSERT_OK(ReadTokenFile(WriteSecret(dir.Join("good"), good + "\n"), "--http_token_file", &t));
  EXPECT_EQ(t, good);
}

// A reference MAC built the slow way, to pin the documented layout (PROTOCOL.md).
std::string RefTag(const std::string& secret, const std::string& ns, const std::string& np,
                   unsigned char dir, uint64_t seq, const std::string& header,
                   const std::string& payload) {
  const std::string key_hex = HmacHex(secret, "edl-session:" + ns + ":" + np);
  std::string key;
  for (size_t i = 0; i < key_hex.size(); i += 2)
    key += static_cast<char>(std::stoi(key_hex.substr(i, 2), nullptr, 16));
  std::string msg(1, static_cast<char>(dir));
  for (int i = 7; i >= 0; --i) msg += static_cast<char>(seq >> (8 * i));
  msg += header + payload;
  const std::string hex = HmacHex(key, msg);
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

TEST(SessionMacTest, MatchesTheDocumentedConstruction) {
  const std::string secret = "cluster-secret-0123456789abcdefgh", ns = NewNonce(), np = NewNonce();
  SessionMac server(secret, ns, np, /*server_side=*/true);
  SessionMac peer(secret, ns, np, /*server_side=*/false);
  const std::string header(12, 'H');
  for (uint64_t seq = 0; seq < 3; ++seq) {
    const std::string payload = "payload " + std::to_string(seq);
    char tag[SessionMac::kTagBytes];
    server.Seal(header.data(), payload.data(), payload.size(), tag);
    EXPECT_EQ(std::string(tag, sizeof(tag)), RefTag(secret, ns, np, 0x01, seq, header, payload));
    EXPECT_TRUE(peer.Open(header.data(), payload.data(), payload.size(), tag));
    peer.Seal(header.data(), payload.data(), payload.size(), tag);
    EXPECT_EQ(std::string(tag, sizeof(tag)), RefTag(secret, ns, np, 0x02, seq, header, payload));
    EXPECT_TRUE(server.Open(header.data(), payload.data(), payload.size(), tag));
  }
}

TEST(SessionMacTest, TamperedReplayedReorderedReflectedOrForeignFramesFail) {
  const std::string secret = "cluster-secret-0123456789abcdefgh", ns = NewNonce(), np = NewNonce();
  SessionMac server(secret, ns, np, true);
  SessionMac peer(secret, ns, np, false);
  const std::string header(12, 'H'), a = R"({"type":"kill"})", b = R"({"type":"stop"})";
  char ta[32], tb[32];
  server.Seal(header.data(), a.data(), a.size(), ta);
  server.Seal(header.data(), b.data(), b.size(), tb);
  // Reordered: b before a.
  EXPECT_FALSE(peer.Open(header.data(), b.data(), b.size(), tb));
  // Tampered payload or header.
  std::string a2 = a;
  a2[3] ^= 1;
  EXPECT_FALSE(peer.Open(header.data(), a2.data(), a2.size(), ta));
  std::string h2 = header;
  h2[11] ^= 1;
  EXPECT_FALSE(peer.Open(h2.data(), a.data(), a.size(), ta));
  // Reflected: our own frame sent back to us.
  EXPECT_FALSE(server.Open(header.data(), a.data(), a.size(), ta));  // the server's own tag
  // Foreign: another connection's key (same secret, other nonces) or another secret.
  SessionMac other(secret, NewNonce(), np, true);
  char to[32];
  other.Seal(header.data(), a.data(), a.size(), to);
  EXPECT_FALSE(peer.Open(header.data(), a.data(), a.size(), to));
  SessionMac wrong("another-secret-0123456789abcdefghij", ns, np, true);
  wrong.Seal(header.data(), a.data(), a.size(), to);
  EXPECT_FALSE(peer.Open(header.data(), a.data(), a.size(), to));
  // Failures did not advance the counter: the genuine sequence still opens, once.
  EXPECT_TRUE(peer.Open(header.data(), a.data(), a.size(), ta));
  EXPECT_FALSE(peer.Open(header.data(), a.data(), a.size(), ta));  // replayed
  EXPECT_TRUE(peer.Open(header.data(), b.data(), b.size(), tb));
}

TEST(AuthTest, ServerErrorMacBindsNonceCodeAndMessage) {
  const std::string s = "cluster-secret-0123456789abcdefgh", n = NewNonce();
  const std::string m = ServerErrorMac(s, n, "AlreadyExists", "node taken");
  EXPECT_TRUE(MacEqual(m, ServerErrorMac(s, n, "AlreadyExists", "node taken")));
  EXPECT_FALSE(MacEqual(m, ServerErrorMac(s, NewNonce(), "AlreadyExists", "node taken")));
  EXPECT_FALSE(MacEqual(m, ServerErrorMac(s, n, "Unauthenticated", "node taken")));
  EXPECT_FALSE(MacEqual(m, ServerErrorMac(s, n, "AlreadyExists", "node free")));
  EXPECT_FALSE(MacEqual(
      m,
      WelcomeMac(s, n, {{"type", "error"}, {"code", "AlreadyExists"}, {"message", "node taken"}})));
}

}  // namespace
}  // namespace edl::net
