#include "edl/net/handshake.h"

#include "edl/proto/fields.h"
#include "edl/proto/frame.h"

namespace edl::net {

using nlohmann::json;

namespace {

bool IsNonce(const json& j) {
  const std::string* p = j.get_ptr<const std::string*>();  // null unless a string
  if (p == nullptr) return false;
  const std::string& s = *p;
  if (s.size() != proto::kSessionTokenBytes) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

Status PreAuthError(const json& frame, const std::string& secret, const std::string& nonce,
                    const std::string& peer, bool* proven) {
  *proven = false;
  proto::ErrorMsg e;
  EDL_RETURN_IF_ERROR(e.DecodeFrom(frame));
  if (!nonce.empty() && MacEqual(e.mac, ServerErrorMac(secret, nonce, e.code, e.message))) {
    *proven = true;
    return e.ToStatus();
  }
  const Status claimed = e.ToStatus();
  return Status(claimed.code() == Status::Code::kUnauthenticated ? Status::Code::kUnauthenticated
                                                                 : Status::Code::kUnavailable,
                peer +
                    " refused the handshake with an error it cannot prove (a server with a "
                    "different --secret_file, or not the edl server): " +
                    claimed.ToString());
}

// ---- the server's side

ServerHandshake::ServerHandshake(std::string secret)
    : secret_(std::move(secret)), nonce_(NewNonce()) {}

json ServerHandshake::Challenge() const {
  proto::Challenge ch;
  ch.nonce = nonce_;
  json j;
  ch.EncodeTo(&j);
  return j;
}

Status ServerHandshake::OnHello(const json& frame, const std::string& peer, proto::Hello* hello) {
  const std::string& type = proto::TypeOf(frame);
  if (type != proto::msg::kHello) {
    return Status::Unauthenticated("expected 'hello' before anything else, got " +
                                   proto::Quote(type));
  }
  // The MAC first: a peer without the secret gets no further than this, whatever else it sent.
  const std::string* mac = proto::FieldOf(frame, "mac").get_ptr<const std::string*>();
  mac_ok_ = mac != nullptr && MacEqual(*mac, HelloMac(secret_, nonce_, frame));
  if (!mac_ok_) {
    return Status::Unauthenticated("bad HMAC from " + peer +
                                   ": the peer's --secret_file differs from the server's");
  }
  state_ = State::kHelloProven;
  // From here on the peer holds the secret: a refusal carries our proof over its nonce, even when
  // another field of its hello is refused (it would otherwise retry, unable to trust the error).
  if (const json& n = proto::FieldOf(frame, "nonce"); IsNonce(n))
    peer_nonce_ = *n.get_ptr<const std::string*>();
  EDL_RETURN_IF_ERROR(hello->DecodeFrom(frame));
  peer_nonce_ = hello->nonce;
  return Status::OK();
}

json ServerHandshake::Welcome(const proto::Welcome& w) {
  json j;
  w.EncodeTo(&j);
  j["mac"] = WelcomeMac(secret_, peer_nonce_, j);
  state_ = State::kWelcomed;
  return j;
}

json ServerHandshake::Refusal(const Status& why) {
  proto::ErrorMsg e = proto::ErrorMsg::From(why);
  if (mac_ok_ && !peer_nonce_.empty())
    e.mac = ServerErrorMac(secret_, peer_nonce_, e.code, e.message);
  state_ = State::kRefused;
  json j;
  e.EncodeTo(&j);
  return j;
}

std::unique_ptr<SessionMac> ServerHandshake::TakeSession() const {
  return std::make_unique<SessionMac>(secret_, nonce_, peer_nonce_, /*server_side=*/true);
}

// ---- the peer's side

PeerHandshake::PeerHandshake(std::string secret, proto::Hello hello)
    : secret_(std::move(secret)), hello_(std::move(hello)) {
  hello_.nonce = NewNonce();
}

Status PeerHandshake::OnChallenge(const json& frame, const std::string& peer, json* hello_out) {
  const std::string& type = proto::TypeOf(frame);
  if (type == proto::msg::kError) {
    state_ = State::kFailed;
    bool proven = false;
    return PreAuthError(frame, secret_, "", peer, &proven);
  }
  if (type != proto::msg::kChallenge) {
    state_ = State::kFailed;
    return Status::Corruption("expected a challenge from " + peer + ", got " + proto::Quote(type));
  }
  proto::Challenge ch;
  EDL_RETURN_IF_ERROR(ch.DecodeFrom(frame));
  server_nonce_ = ch.nonce;
  hello_.EncodeTo(hello_out);
  (*hello_out)["mac"] = HelloMac(secret_, server_nonce_, *hello_out);
  state_ = State::kHelloSent;
  return Status::OK();
}

Status PeerHandshake::OnReply(const json& frame, const std::string& peer, proto::Welcome* welcome,
                              bool* proven) {
  *proven = false;
  state_ = State::kFailed;
  const std::string& type = proto::TypeOf(frame);
  if (type == proto::msg::kError) return PreAuthError(frame, secret_, hello_.nonce, peer, proven);
  if (type != proto::msg::kWelcome) {
    return Status::Corruption("expected a welcome from " + peer + ", got " + proto::Quote(type));
  }
  EDL_RETURN_IF_ERROR(welcome->DecodeFrom(frame));
  if (!MacEqual(welcome->mac, WelcomeMac(secret_, hello_.nonce, frame))) {
    return Status::Unauthenticated("server " + peer +
                                   " could not prove it holds the cluster secret: check "
                                   "--secret_file on both sides");
  }
  state_ = State::kWelcomed;
  return Status::OK();
}

std::unique_ptr<SessionMac> PeerHandshake::TakeSession() const {
  return std::make_unique<SessionMac>(secret_, server_nonce_, hello_.nonce, /*server_side=*/false);
}

}  // namespace edl::net
