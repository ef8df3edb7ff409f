// HttpEndpoint: `edl server --http_addr HOST:PORT`, the read-only window onto the cluster
// (docs/WATCHING.md, "The dashboard and the HTTP endpoint"), on Boost.Beast in the server's own
// io_context:
//   /             the dashboard (one page embedded in the binary:
//   jobserver/http/dashboard/index.html) /metrics      Prometheus text (ServerMetrics::Render of
//   the status body) /api/status   the status body, as `edl ctl status --json` prints it
//   /api/events?job=J&since=N   the job's recent timeline records (ServerMetrics::Recent)
//   /api/nodes    heartbeat age and utilisation per node (ServerMetrics::NodesJson)
// Nothing a request carries reaches the control plane: the endpoint reads the status callback and
// the metrics, never changes them.
//
// Security. Bound to a loopback address, it answers anyone on this machine, and only requests
// whose Host names a loopback address or "localhost" (a web page cannot reach it through DNS
// rebinding). Bound to any other address it requires `Authorization: Bearer <token>` on everything
// but the static page (the page asks for the token and sends it with its own requests; it holds no
// data), compared in constant time. Bounds: the request head (HttpLimits), no body, the open
// connections, those among them still reading a request (the oldest is dropped for a new one,
// net::AdmissionControl), the time to send a whole request head (slowloris) and to take a
// response. Anything refused gets a 4xx with a fixed body, or a closed connection; refusals are
// logged rate-limited.
//
// Thread-safety: none; construct, Start, Stop and destroy on the io_context's thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "jobserver/http/http_request.h"
#include "jobserver/http/metrics.h"

namespace edl::jobserver {

struct HttpOptions {
  std::string addr;       // "HOST:PORT" (--http_addr; HOST an IP literal, [v6] bracketed); "": off
  std::string token;      // the bearer token (--http_token_file); required off loopback
  std::string port_file;  // when set, the bound port is written here once listening
  HttpLimits limits;
  size_t max_connections = 64;       // open at once; a new one beyond is closed at once
  size_t max_idle_connections = 32;  // waiting for (or sending) a request; the oldest makes room
  std::chrono::milliseconds request_timeout{
      10000};  // to send a whole request head, or keep-alive idle
  std::chrono::milliseconds write_timeout{10000};  // to take a whole response
};

// Splits "HOST:PORT" ("[::1]:9100" for IPv6). InvalidArgument naming --http_addr and the form.
Status ParseHttpAddr(const std::string& addr, std::string* host, int* port);
using proto::IsLoopbackIp;  // edl/proto/messages.h
// The --http_addr / --http_token_file rules: a valid address; a token whenever the address is not
// loopback; a token made of bearer-token characters (RFC 6750 b64token).
Status CheckHttpOptions(const HttpOptions& options);

class HttpEndpoint {
 public:
  using StatusFn = std::function<nlohmann::json()>;
  // `io` and `metrics` are not owned and must outlive the endpoint; `status` builds the status
  // body on demand.
  HttpEndpoint(boost::asio::io_context* io, HttpOptions options, ServerMetrics* metrics,
               StatusFn status);
  ~HttpEndpoint();  // Stop()
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Binds and listens (IOError naming the address when taken), writes the port file.
  Status Start();
  // Stops accepting and closes every connection. Idempotent.
  void Stop();
  int port() const { return port_; }

 private:
  struct Core;  // what the connections share with the endpoint (they may outlive it)
  class Session;
  void Accept();

  boost::asio::io_context* const io_;
  std::shared_ptr<Core> core_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int port_ = 0;
};

}  // namespace edl::jobserver
