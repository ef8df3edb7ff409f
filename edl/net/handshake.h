// The authentication handshake (auth.h; PROTOCOL.md "Authentication") as two sans-I/O state
// machines, one per side: frames in, frames and a verdict out. Every site that authenticates a
// connection uses them, whatever carries the bytes: the server (Asio, jobserver/server.cc), the job
// client (Asio, jobclient/client.cc), the blocking FramedSocket of ctl, teachers and students
// (framed_socket.cc) and the simulated clients of the control-plane benchmark.
//
//   server                                   peer
//   ServerHandshake::Challenge()   ------>   PeerHandshake::OnChallenge() -> hello (with its MAC)
//   ServerHandshake::OnHello()     <------
//     admitted: Welcome()          ------>   PeerHandshake::OnReply() -> OK, the welcome
//     refused:  Refusal(why)       ------>   PeerHandshake::OnReply() -> the server's error
//   both: TakeSession() seals every later frame (SessionMac).
//
// The rules live here once: the MAC is checked before anything else of a hello is read; a refusal
// after a valid MAC carries the server's proof over the peer's nonce (even when the rest of the
// hello does not decode), a refusal before it carries none; a peer acts on an error before the
// welcome only when the proof verifies, and never on an unproven one (anybody can send those).
//
// Thread-safety: none; one handshake per connection, used from one thread at a time.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/net/auth.h"
#include "edl/proto/messages.h"

namespace edl::net {

class ServerHandshake {
 public:
  enum class State { kChallenged, kHelloProven, kWelcomed, kRefused };

  // `secret` is the cluster secret; a fresh nonce is drawn for this connection.
  explicit ServerHandshake(std::string secret);

  // The first frame to send: the challenge.
  nlohmann::json Challenge() const;
  // The peer's first frame. OK with *hello decoded when it is a hello whose MAC verifies and whose
  // fields decode; Unauthenticated for anything else before the MAC verified (Refusal() then
  // carries no proof), or the decoder's error after it (Refusal() then carries the proof).
  // `peer` names the connection in messages.
  Status OnHello(const nlohmann::json& frame, const std::string& peer, proto::Hello* hello);
  // After OnHello succeeded: the welcome frame, sealed for the peer's nonce. The session starts
  // after it (TakeSession).
  nlohmann::json Welcome(const proto::Welcome& w);
  // The error frame refusing the peer for `why`: with the server's proof when the hello's MAC
  // verified (the peer can trust it and act on it), without one otherwise.
  nlohmann::json Refusal(const Status& why);
  // The frame MAC state for after the welcome (server side). REQUIRES: Welcome() was called.
  std::unique_ptr<SessionMac> TakeSession() const;

  State state() const { return state_; }
  const std::string& nonce() const { return nonce_; }
  // Whether the peer proved it holds the secret (its hello's MAC verified).
  bool proven() const { return state_ == State::kHelloProven || state_ == State::kWelcomed; }

 private:
  const std::string secret_;
  const std::string nonce_;
  std::string peer_nonce_;  // from a hello whose MAC verified; empty otherwise
  bool mac_ok_ = false;
  State state_ = State::kChallenged;
};

class PeerHandshake {
 public:
  enum class State { kWaitingChallenge, kHelloSent, kWelcomed, kFailed };

  // `hello` is what this peer says of itself (role and fields); its nonce is drawn here.
  PeerHandshake(std::string secret, proto::Hello hello);

  // The server's first frame: a challenge gives *hello_out, the hello to send (with its MAC). An
  // error frame gives the server's error, unproven (no nonce was sent yet); anything else
  // Corruption. `peer` names the server in messages.
  Status OnChallenge(const nlohmann::json& frame, const std::string& peer,
                     nlohmann::json* hello_out);
  // The server's answer to the hello. OK with *welcome when it is a welcome the server proves;
  // Unauthenticated when it cannot prove it; for an error frame, the server's own error when its
  // proof verifies (*proven true), else an Unavailable (or Unauthenticated when the server claims
  // that) naming `peer` and saying nothing is proven (*proven false).
  Status OnReply(const nlohmann::json& frame, const std::string& peer, proto::Welcome* welcome,
                 bool* proven);
  // The frame MAC state for after the welcome (peer side). REQUIRES: OnReply returned OK.
  std::unique_ptr<SessionMac> TakeSession() const;

  State state() const { return state_; }
  const std::string& nonce() const { return hello_.nonce; }

 private:
  const std::string secret_;
  proto::Hello hello_;
  std::string server_nonce_;
  State state_ = State::kWaitingChallenge;
};

// The status an `error` frame before the welcome stands for, for a peer that sent `nonce` (empty:
// none yet): the server's own words when it proved them (ServerErrorMac over the nonce; *proven
// true), else an Unavailable (Unauthenticated when the server claims that) naming `peer` and
// saying nothing is proven.
Status PreAuthError(const nlohmann::json& frame, const std::string& secret,
                    const std::string& nonce, const std::string& peer, bool* proven);

}  // namespace edl::net
