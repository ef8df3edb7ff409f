// FramedSocket: a blocking, connected stream socket (TCP or Unix) that sends and receives whole
// frames (edl/proto/frame.h) with a deadline on every call. Used where a thread may block: the
// trainer side of TrainerChannel and `edl ctl`. Daemons use the asynchronous Connection instead.
//
// Payload buffers grow as bytes arrive. After StartSession every frame is sealed and checked
// (edl/net/auth.h SessionMac); a frame that fails its MAC shuts the socket down for good.
//
// Thread-safety: Send may be called from several threads at once (a mutex serialises writers);
// Receive from one thread at a time. Shutdown may be called from any thread and makes a blocked
// Receive return. StartSession and set_max_frame_bytes only while no Send or Receive runs.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/base/thread_annotations.h"
#include "edl/net/auth.h"
#include "edl/proto/messages.h"

namespace edl::net {

// Splits "host:port" (port 1..65535). InvalidArgument naming `what` (e.g. "--server") otherwise.
Status ParseHostPort(const std::string& s, const std::string& what, std::string* host, int* port);
// A comma-separated list of "host:port" (a leader and its standbys, docs/CHECKPOINTS.md "Standby
// servers"), in order, at most 16.
Status ParseHostPortList(const std::string& s, const std::string& what,
                         std::vector<std::pair<std::string, int>>* out);

class FramedSocket {
 public:
  // Owns `fd` (a connected stream socket); closes it in the destructor.
  FramedSocket(int fd, std::string peer);
  ~FramedSocket();
  FramedSocket(const FramedSocket&) = delete;
  FramedSocket& operator=(const FramedSocket&) = delete;

  // Unavailable naming the address when nothing listens there; Timeout after `timeout`.
  static StatusOr<std::unique_ptr<FramedSocket>> ConnectTcp(const std::string& host, int port,
                                                            std::chrono::milliseconds timeout);
  static StatusOr<std::unique_ptr<FramedSocket>> ConnectUnix(const std::string& path,
                                                             std::chrono::milliseconds timeout);

  // Sends one frame; IOError when the peer is gone, Timeout when it does not drain in time.
  Status Send(const nlohmann::json& msg, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for a frame to start (Timeout, nothing consumed, when none does), then
  // reads it whole (a stalled half frame is an IOError after max(timeout, 10 s)). Corruption on a
  // bad frame; Unavailable when the peer closed the connection.
  Status Receive(nlohmann::json* msg, std::chrono::milliseconds timeout);
  void Shutdown();
  // On a connection whose peer has sent nothing, sends an HTTP request line and says whether the
  // peer answers as an HTTP server (within `timeout`): what listens there is not an edl peer. The
  // connection is of no further use either way.
  bool ProbeHttp(std::chrono::milliseconds timeout);

  // Seal and check every later frame under `session` (after the handshake).
  void StartSession(std::unique_ptr<SessionMac> session) { session_ = std::move(session); }
  // Largest payload Receive accepts (default proto::kMaxFrameBytes).
  void set_max_frame_bytes(uint32_t n) { max_frame_bytes_ = n; }

  const std::string& peer() const { return peer_; }

 private:
  Status WaitFd(short events, std::chrono::steady_clock::time_point deadline);
  Status ReadFull(char* p, size_t n, std::chrono::steady_clock::time_point deadline);
  // Every write to fd_ goes through SendAll, under write_mu_: frames from concurrent Sends never
  // interleave, and they leave in the order session_ sealed them.
  Status SendAll(const char* p, size_t n, std::chrono::steady_clock::time_point deadline)
      REQUIRES(write_mu_);

  const int fd_;
  const std::string peer_;
  Mutex write_mu_;
  std::unique_ptr<SessionMac> session_;  // set before any Send or Receive (StartSession)
  uint32_t max_frame_bytes_;
};

// Client side of the TCP handshake (auth.h): reads the challenge, sends `hello` (its role and
// fields filled in by the caller; mac and nonce are set here), checks the server's proof and
// starts the sealed session. Unauthenticated when the server rejects the secret or proves a
// different one; an `error` the server cannot prove (ServerErrorMac) is reported as unverified.
Status AuthenticateToServer(FramedSocket* sock, const std::string& secret, proto::Hello hello,
                            std::chrono::milliseconds timeout, proto::Welcome* welcome);

// Server side of the same handshake, for a blocking server (an `edl teacher`): sends a fresh
// challenge, checks the hello's MAC before anything else in it, decodes it into *hello, asks
// `admit` (whose non-OK status goes back to the peer as a proven `error`), then sends `welcome`
// (its mac set here) and starts the sealed session. Unauthenticated for a bad MAC or a first frame
// that is not a hello; Timeout when the peer is slower than `timeout` at any step.
Status AuthenticatePeer(FramedSocket* sock, const std::string& secret, proto::Welcome welcome,
                        std::chrono::milliseconds timeout, proto::Hello* hello,
                        const std::function<Status(const proto::Hello&)>& admit);

}  // namespace edl::net
