// The handshake's two state machines (edl/net/handshake.h) talking to each other frame by frame,
// with no sockets: an admitted peer and a sealed session both ways; a peer with another secret
// refused without proof; a peer with the secret and a field the server refuses gets an error it can
// prove (it must not retry for ever, PROTOCOL.md "Authentication"); a forged welcome; anything but
// a hello first.
#include "edl/net/handshake.h"

#include <gtest/gtest.h>

#include "tests/testutil.h"

namespace edl::net {
namespace {

using nlohmann::json;

constexpr char kSecret[] = "cluster-secret-0123456789abcdefgh";

proto::Hello ClientHello(const std::string& host = "10.0.0.1") {
  proto::Hello h;
  h.role = proto::Role::kClient;
  h.node = "n1";
  h.host = host;
  h.mode = proto::NodeMode::kInplace;
  h.slots = {0, 1};
  return h;
}

// Seals one frame on `from` and opens it on `to`.
bool Travels(SessionMac* from, SessionMac* to, const std::string& payload) {
  const char header[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  char tag[SessionMac::kTagBytes];
  from->Seal(header, payload.data(), payload.size(), tag);
  return to->Open(header, payload.data(), payload.size(), tag);
}

TEST(HandshakeTest, AnAdmittedPeerAndTheServerShareASealedSession) {
  ServerHandshake server(kSecret);
  PeerHandshake peer(kSecret, ClientHello());
  json hello;
  ASSERT_OK(peer.OnChallenge(server.Challenge(), "server", &hello));
  EXPECT_EQ(peer.state(), PeerHandshake::State::kHelloSent);
  proto::Hello got;
  ASSERT_OK(server.OnHello(hello, "peer", &got));
  EXPECT_TRUE(server.proven());
  EXPECT_EQ(got.node, "n1");
  EXPECT_EQ(got.nonce, peer.nonce());
  proto::Welcome w;
  w.job_id = "job";
  proto::Welcome back;
  bool proven = false;
  ASSERT_OK(peer.OnReply(server.Welcome(w), "server", &back, &proven));
  EXPECT_EQ(back.job_id, "job");
  EXPECT_EQ(peer.state(), PeerHandshake::State::kWelcomed);
  auto s = server.TakeSession(), p = peer.TakeSession();
  EXPECT_TRUE(Travels(s.get(), p.get(), "to the peer"));
  EXPECT_TRUE(Travels(p.get(), s.get(), "to the server"));
  EXPECT_FALSE(Travels(s.get(), s.get(), "reflected"))
      << "a frame reflected to its sender must not open";
}

TEST(HandshakeTest, APeerWithAnotherSecretIsRefusedWithoutProof) {
  ServerHandshake server(kSecret);
  PeerHandshake peer("another-secret-0123456789abcdefghij", ClientHello());
  json hello;
  ASSERT_OK(peer.OnChallenge(server.Challenge(), "server", &hello));
  proto::Hello got;
  const Status s = server.OnHello(hello, "10.0.0.9:4242", &got);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated) << s.ToString();
  EXPECT_NE(s.message().find("bad HMAC from 10.0.0.9:4242"), std::string::npos) << s.ToString();
  EXPECT_FALSE(server.proven());
  const json refusal = server.Refusal(s);
  EXPECT_FALSE(refusal.contains("mac") && !refusal["mac"].get<std::string>().empty())
      << refusal.dump();
  proto::Welcome w;
  bool proven = true;
  const Status r = peer.OnReply(refusal, "server", &w, &proven);
  EXPECT_FALSE(proven);
  EXPECT_EQ(r.code(), Status::Code::kUnauthenticated) << r.ToString();
  EXPECT_NE(r.message().find("cannot prove"), std::string::npos) << r.ToString();
}

// Issue 32, item 10: `edl client --advertise_addr '[::1]'` holds the secret, so the server's
// refusal of its host must carry the proof, and the client can act on it instead of retrying.
TEST(HandshakeTest, ARefusalAfterAValidMacCarriesTheServersProofEvenWhenTheHelloDoesNotDecode) {
  ServerHandshake server(kSecret);
  PeerHandshake peer(kSecret, ClientHello("[::1]"));
  json hello;
  ASSERT_OK(peer.OnChallenge(server.Challenge(), "server", &hello));
  proto::Hello got;
  const Status s = server.OnHello(hello, "peer", &got);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.ToString();
  EXPECT_TRUE(server.proven()) << "the MAC verified";
  proto::Welcome w;
  bool proven = false;
  const Status r = peer.OnReply(server.Refusal(s), "server", &w, &proven);
  EXPECT_TRUE(proven);
  EXPECT_EQ(r.code(), s.code());
  EXPECT_NE(r.message().find("is not a host name or IP address"), std::string::npos)
      << r.ToString();
  // The same after an admission refusal (e.g. a node name held by another client).
  ServerHandshake server2(kSecret);
  PeerHandshake peer2(kSecret, ClientHello());
  ASSERT_OK(peer2.OnChallenge(server2.Challenge(), "server", &hello));
  ASSERT_OK(server2.OnHello(hello, "peer", &got));
  const Status held = Status::Unavailable("node name 'n1' belongs to another client");
  ASSERT_FALSE(peer2.OnReply(server2.Refusal(held), "server", &w, &proven).ok());
  EXPECT_TRUE(proven);
}

TEST(HandshakeTest, AWelcomeTheServerCannotProveIsRefused) {
  ServerHandshake impostor("impostor-secret-0123456789abcdefghij");
  PeerHandshake peer(kSecret, ClientHello());
  json hello;
  ASSERT_OK(peer.OnChallenge(impostor.Challenge(), "server", &hello));
  proto::Hello got;
  ASSERT_FALSE(impostor.OnHello(hello, "peer", &got).ok());  // it cannot check our MAC either
  // An impostor sends a welcome anyway, sealed with its own secret.
  proto::Welcome w;
  w.job_id = "job";
  json forged;
  w.EncodeTo(&forged);
  forged["mac"] = WelcomeMac("impostor-secret-0123456789abcdefghij", peer.nonce(), forged);
  proto::Welcome back;
  bool proven = true;
  const Status r = peer.OnReply(forged, "server", &back, &proven);
  EXPECT_EQ(r.code(), Status::Code::kUnauthenticated) << r.ToString();
  EXPECT_NE(r.message().find("could not prove"), std::string::npos) << r.ToString();
  EXPECT_EQ(peer.state(), PeerHandshake::State::kFailed);
}

TEST(HandshakeTest, OnlyAHelloOpensAndOnlyAChallengeAnswersAConnect) {
  ServerHandshake server(kSecret);
  proto::Hello got;
  const Status s = server.OnHello(json{{"type", "ctl"}, {"command", "status"}}, "peer", &got);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated) << s.ToString();
  EXPECT_NE(s.message().find("expected 'hello'"), std::string::npos) << s.ToString();
  EXPECT_FALSE(server.proven());
  PeerHandshake peer(kSecret, ClientHello());
  json hello;
  EXPECT_EQ(peer.OnChallenge(json{{"type", "welcome"}}, "server", &hello).code(),
            Status::Code::kCorruption);
  // A hello altered after its MAC was computed (a relay changing the slots) is refused.
  ServerHandshake server2(kSecret);
  PeerHandshake peer2(kSecret, ClientHello());
  ASSERT_OK(peer2.OnChallenge(server2.Challenge(), "server", &hello));
  hello["slots"] = json::array({0, 1, 2, 3});
  EXPECT_EQ(server2.OnHello(hello, "peer", &got).code(), Status::Code::kUnauthenticated);
}

}  // namespace
}  // namespace edl::net
