#include "jobserver/http/http_endpoint.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include <glog/logging.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "edl/net/admission.h"
#include "edl/net/auth.h"
#include "edl/proto/messages.h"

namespace edl::jobserver {

// jobserver/http/dashboard/index.html, embedded at build time (cmake/embed_file.cmake).
extern const unsigned char kDashboardHtml[];
extern const size_t kDashboardHtmlBytes;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using asio::ip::tcp;

namespace {

// The page runs its own inline script and style, talks only to this server, loads nothing else.
constexpr char kDashboardPolicy[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

bool IsB64Token(const std::string& t) {
  // RFC 6750: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
  size_t i = 0;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '.' || c == '_' || c == '~' || c == '+' || c == '/')) {
      break;
    }
  }
  if (i == 0) return false;
  for (; i < t.size(); ++i) {
    if (t[i] != '=') return false;
  }
  return true;
}

// The host part of a Host field: "127.0.0.1:8181" -> "127.0.0.1", "[::1]:80" -> "::1".
std::string HostOf(const std::string& field) {
  if (!field.empty() && field[0] == '[') {
    const size_t close = field.find(']');
    return close == std::string::npos ? "" : field.substr(1, close - 1);
  }
  return field.substr(0, field.find(':'));
}

}  // namespace

Status ParseHttpAddr(const std::string& addr, std::string* host, int* port) {
  const Status bad =
      Status::InvalidArgument("--http_addr '" + addr +
                              "': give HOST:PORT with HOST an IP address (127.0.0.1:8181, "
                              "[::1]:8181, or this machine's address with --http_token_file)");
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= addr.size()) return bad;
  std::string h = addr.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return bad;
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad;  // an IPv6 address without brackets
  }
  boost::system::error_code ec;
  asio::ip::make_address(h, ec);
  if (ec) return bad;
  const std::string p = addr.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return bad;
  const int n = std::stoi(p);
  if (n > 65535) return bad;
  *host = h;
  *port = n;
  return Status::OK();
}

Status CheckHttpOptions(const HttpOptions& o) {
  std::string host;
  int port = 0;
  EDL_RETURN_IF_ERROR(ParseHttpAddr(o.addr, &host, &port));
  if (o.token.empty() && !IsLoopbackIp(host)) {
    return Status::InvalidArgument(
        "--http_addr " + o.addr +
        " is not a loopback address: anyone who reaches it could read the cluster's state, so "
        "give --http_token_file FILE (a bearer token, mode 0600; create one with "
        "`head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`), or bind 127.0.0.1");
  }
  if (!o.token.empty() && !IsB64Token(o.token)) {
    return Status::InvalidArgument(
        "--http_token_file: the token must be one line of base64 or "
        "[A-Za-z0-9-._~+/] characters (`head -c 32 /dev/urandom | base64`)");
  }
  return Status::OK();
}

struct HttpEndpoint::Core {
  HttpOptions options;
  ServerMetrics* metrics = nullptr;  // null once stopped
  StatusFn status;
  bool loopback = false;
  std::string token_key;  // random; the token is compared as HMAC(token_key, .) in constant time
  std::string token_mac;
  net::AdmissionControl admission;  // connections still reading a request
  net::LogLimiter log{20, std::chrono::seconds(10)};
  std::map<uint64_t, std::weak_ptr<Session>> sessions;
  uint64_t next_id = 1;
  bool stopped = false;

  explicit Core(const HttpOptions& o)
      : options(o),
        admission(net::AdmissionControl::Limits{o.max_idle_connections,
                                                std::max<size_t>(4, o.max_idle_connections / 2)}) {}

  void Log(const std::string& line) {
    size_t suppressed = 0;
    if (!log.Allow(std::chrono::steady_clock::now(), &suppressed)) return;
    LOG(WARNING) << "http: " << line
                 << (suppressed == 0
                         ? ""
                         : " (" + std::to_string(suppressed) + " similar lines suppressed)");
  }
};

class HttpEndpoint::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Core> core, tcp::socket socket, uint64_t id, std::string source)
      : core_(std::move(core)),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(core_->options.limits.max_head_bytes),
        id_(id),
        source_(std::move(source)) {}

  uint64_t id() const { return id_; }

  void Start() {
    if (core_->metrics) core_->metrics->HttpConnectionOpened();
    ReadRequest();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    core_->admission.Remove(id_);
    core_->sessions.erase(id_);
    if (core_->metrics) core_->metrics->HttpConnectionClosed();
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
  }

 private:
  void ReadRequest() {
    // Counted among the connections that hold a slot without having asked anything yet: a new
    // one may push out the oldest of them.
    const uint64_t evict = core_->admission.Admit(id_, source_);
    if (evict != 0) {
      auto it = core_->sessions.find(evict);
      if (it != core_->sessions.end()) {
        if (auto s = it->second.lock()) {
          core_->Log("too many idle connections (" +
                     std::to_string(core_->options.max_idle_connections) +
                     "): dropped the oldest, from " + s->source_);
          s->Close();
        }
      }
    }
    parser_.emplace(core_->options.limits);
    Deadline(core_->options.request_timeout);
    auto self = shared_from_this();
    http::async_read(socket_, buffer_, *parser_,
                     [self](const boost::system::error_code& ec, size_t) { self->OnRead(ec); });
  }

  void Deadline(std::chrono::milliseconds d) {
    timer_.expires_after(d);
    auto self = shared_from_this();
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || self->closed_) return;
      self->Close();  // a slow request (slowloris) or a peer that does not read: no answer
    });
  }

  void OnRead(const boost::system::error_code& ec) {
    if (closed_ || core_->stopped) return Close();
    if (ec) {
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
          !parser_->got_some()) {
        return Close();
      }
      const HttpRefusal r = parser_->RefusalOf(ec);
      core_->Log("refused a request from " + source_ + ": " + std::to_string(HttpStatusOf(r)));
      return Answer(HttpStatusOf(r), "text/plain", "bad request\n", false);
    }
    core_->admission.Remove(id_);
    try {
      Route(parser_->head(), parser_->keep_alive());
    } catch (const std::exception& e) {
      // A bug in answering one request costs that request, never the server.
      core_->Log("answering a request from " + source_ + " failed: " + e.what());
      if (core_->metrics) core_->metrics->FrameRefused(FrameRefusal::kHandlerError);
      Answer(500, "text/plain", "internal error\n", false);
    }
  }

  bool Authorized(const HttpRequestHead& h) const {
    if (core_->token_mac.empty()) return true;
    return net::MacEqual(net::HmacHex(core_->token_key, h.bearer), core_->token_mac);
  }

  void Route(const HttpRequestHead& h, bool keep_alive) {
    if (h.method == HttpMethod::kOther) {
      return Answer(405, "text/plain", "method not allowed\n", false);
    }
    if (core_->loopback && core_->token_mac.empty() && !h.host.empty()) {
      const std::string host = HostOf(h.host);
      if (host != "localhost" && !IsLoopbackIp(host)) {
        core_->Log("refused a request from " + source_ + " for a non-loopback Host");
        return Answer(403, "text/plain", "forbidden\n", false);
      }
    }
    head_only_ = h.method == HttpMethod::kHead;
    if (h.path == "/" || h.path == "/index.html") {
      return Answer(200, "text/html; charset=utf-8",
                    std::string(reinterpret_cast<const char*>(kDashboardHtml), kDashboardHtmlBytes),
                    keep_alive, /*page=*/true);
    }
    const bool known = h.path == "/metrics" || h.path == "/api/status" || h.path == "/api/events" ||
                       h.path == "/api/nodes";
    if (!known) return Answer(404, "text/plain", "not found\n", keep_alive);
    if (!Authorized(h)) {
      core_->Log("refused a request from " + source_ + ": " +
                 (h.has_authorization ? "wrong bearer token" : "no bearer token"));
      return Answer(401, "text/plain", "unauthorized\n", false);
    }
    if (!core_->metrics || !core_->status) return Close();
    if (h.path == "/metrics") {
      return Answer(200, "text/plain; version=0.0.4; charset=utf-8",
                    core_->metrics->Render(core_->status()), keep_alive);
    }
    if (h.path == "/api/status") {
      return Answer(200, "application/json",
                    core_->status().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    keep_alive);
    }
    if (h.path == "/api/nodes") {
      return Answer(200, "application/json", core_->metrics->NodesJson().dump(), keep_alive);
    }
    std::map<std::string, std::string> q;
    if (!ParseHttpQuery(h.query, core_->options.limits.max_query_params, &q)) {
      return Answer(400, "text/plain", "bad request\n", false);
    }
    const auto job_it = q.find("job"), since_it = q.find("since");
    const std::string job = job_it != q.end() ? job_it->second : "";
    const std::string since = since_it != q.end() ? since_it->second : "0";
    if (!proto::IsValidName(job) || since.empty() || since.size() > 18 ||
        since.find_first_not_of("0123456789") != std::string::npos) {
      return Answer(400, "text/plain", "bad request\n", false);
    }
    Answer(200, "application/json", core_->metrics->Recent(job, std::stoull(since)), keep_alive);
  }

  void Answer(int code, const char* type, std::string body, bool keep_alive, bool page = false) {
    if (core_->metrics) core_->metrics->HttpAnswered(code);
    response_ = {};
    response_.version(11);
    response_.result(static_cast<unsigned>(code));
    response_.set(http::field::content_type, type);
    response_.set(http::field::cache_control, "no-store");
    response_.set("X-Content-Type-Options", "nosniff");
    response_.set("Referrer-Policy", "no-referrer");
    if (page) response_.set("Content-Security-Policy", kDashboardPolicy);
    if (code == 401) response_.set(http::field::www_authenticate, "Bearer");
    if (code == 405) response_.set(http::field::allow, "GET, HEAD");
    response_.keep_alive(keep_alive);
    response_.body() = std::move(body);
    response_.prepare_payload();
    if (head_only_) response_.body().clear();  // Content-Length stays the GET's
    head_only_ = false;
    Deadline(core_->options.write_timeout);
    auto self = shared_from_this();
    http::async_write(socket_, response_,
                      [self, keep_alive](const boost::system::error_code& ec, size_t) {
                        if (ec || self->closed_ || self->core_->stopped) return self->Close();
                        if (!keep_alive) return self->Linger();
                        self->ReadRequest();
                      });
  }

  // After a last answer: no more sending, and what the peer still sends is read and dropped for a
  // while (at most kLingerBytes, the write timeout), so closing with unread bytes does not reset
  // the connection before the peer has read the answer.
  void Linger() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Close();
    Deadline(core_->options.write_timeout);
    Drain();
  }
  void Drain() {
    static constexpr size_t kLingerBytes = 256 << 10;
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(drain_),
                            [self](const boost::system::error_code& ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->closed_ || self->drained_ > kLingerBytes) {
                                return self->Close();
                              }
                              self->Drain();
                            });
  }

  std::shared_ptr<Core> core_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;  // bounded: a head that does not fit is a 431
  std::optional<HttpRequestParser> parser_;
  http::response<http::string_body> response_;
  const uint64_t id_;
  const std::string source_;
  bool head_only_ = false;
  std::array<char, 4096> drain_;
  size_t drained_ = 0;
  bool closed_ = false;
};

HttpEndpoint::HttpEndpoint(asio::io_context* io, HttpOptions options, ServerMetrics* metrics,
                           StatusFn status)
    : io_(io), core_(std::make_shared<Core>(options)), acceptor_(*io) {
  core_->metrics = metrics;
  core_->status = std::move(status);
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

Status HttpEndpoint::Start() {
  Core& c = *core_;
  EDL_RETURN_IF_ERROR(CheckHttpOptions(c.options));
  std::string host;
  int port = 0;
  EDL_RETURN_IF_ERROR(ParseHttpAddr(c.options.addr, &host, &port));
  c.loopback = IsLoopbackIp(host);
  if (!c.options.token.empty()) {
    c.token_key = net::NewNonce();
    c.token_mac = net::HmacHex(c.token_key, c.options.token);
  }
  boost::system::error_code ec;
  const tcp::endpoint ep(asio::ip::make_address(host), static_cast<uint16_t>(port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return FromErrorCode("--http_addr: listen on " + c.options.addr, ec)
        .WithContext("pick another port");
  port_ = acceptor_.local_endpoint().port();
  const std::string shown = ep.address().is_v6() ? "[" + host + "]" : host;
  LOG(INFO) << "edl server: dashboard at http://" << shown << ":" << port_
            << "/ (Prometheus: /metrics" << (c.token_mac.empty() ? "" : "; bearer token required")
            << ")";
  if (!c.options.port_file.empty()) {
    const std::string tmp = c.options.port_file + ".tmp";
    std::ofstream(tmp) << port_ << "\n";
    if (std::rename(tmp.c_str(), c.options.port_file.c_str()) != 0) {
      return PosixError("--http_port_file " + c.options.port_file, errno);
    }
  }
  Accept();
  return Status::OK();
}

void HttpEndpoint::Stop() {
  if (core_->stopped) return;
  core_->stopped = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  auto sessions = core_->sessions;
  for (auto& [id, weak] : sessions) {
    if (auto s = weak.lock()) s->Close();
  }
  core_->metrics = nullptr;
  core_->status = nullptr;
}

void HttpEndpoint::Accept() {
  acceptor_.async_accept(
      [this, core = core_](const boost::system::error_code& ec, tcp::socket socket) {
        if (core->stopped) return;
        if (ec) {
          core->Log("accept: " + ec.message());
          if (ec == asio::error::no_descriptors) {
            auto t = std::make_shared<asio::steady_timer>(*io_, std::chrono::milliseconds(100));
            t->async_wait([this, t, core](const boost::system::error_code&) {
              if (!core->stopped) Accept();
            });
            return;
          }
        } else {
          boost::system::error_code rec;
          const auto remote = socket.remote_endpoint(rec);
          const std::string source = rec ? "unknown" : remote.address().to_string();
          if (core->sessions.size() >= core->options.max_connections) {
            core->Log("refused a connection from " + source + ": " +
                      std::to_string(core->sessions.size()) + " are open, the limit");
            socket.close(rec);
            Accept();
            return;
          }
          auto s = std::make_shared<Session>(core, std::move(socket), core->next_id++, source);
          core->sessions[s->id()] = s;
          s->Start();
        }
        Accept();
      });
}

}  // namespace edl::jobserver
