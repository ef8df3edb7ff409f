// HttpEndpoint (jobserver/http/http_endpoint.h) on a real socket, its io_context on its own thread
// as in `edl server`: the routes, and hostile requests (oversize, too many fields, a body,
// slowloris, path traversal, a foreign Host, a missing or wrong token, a connection flood) each get
// a 4xx or a closed connection while the endpoint keeps answering honest clients.
#include "jobserver/http/http_endpoint.h"

#include <sys/socket.h>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "edl/net/framed_socket.h"
#include "tests/http_client.h"
#include "tests/testutil.h"

namespace edl::jobserver {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using test::HttpGet;
using test::RawExchange;

class HttpEndpointTest : public ::testing::Test {
 protected:
  void Start(HttpOptions o) {
    o.addr = o.addr.empty() ? "127.0.0.1:0" : o.addr;
    metrics_ = std::make_unique<ServerMetrics>(Clock::Real());
    metrics_->OnRecord({{"type", "generation"},
                        {"job", "j1"},
                        {"generation", 2},
                        {"reason", "ctl"},
                        {"time", 1.0}});
    endpoint_ = std::make_unique<HttpEndpoint>(&io_, o, metrics_.get(), [this] {
      ++status_calls_;
      return json{{"job_id", "j1"},
                  {"generation", 2},
                  {"world_size", 3},
                  {"desired", 3},
                  {"nodes", json::array()}};
    });
    ASSERT_OK(endpoint_->Start());
    port_ = endpoint_->port();
    guard_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (!thread_.joinable()) return;
    boost::asio::post(io_, [this] { endpoint_->Stop(); });
    guard_.reset();
    thread_.join();
  }
  test::HttpReply Get(const std::string& target, std::map<std::string, std::string> headers = {}) {
    return HttpGet("127.0.0.1", port_, target, headers);
  }
  // Still serving honest requests.
  void ExpectServing() {
    const test::HttpReply r = Get("/api/status");
    EXPECT_EQ(r.status, 200) << r.error;
  }

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
  std::thread thread_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<HttpEndpoint> endpoint_;
  std::atomic<int> status_calls_{0};
  int port_ = 0;
};

// A peer of the control protocol (edl ctl, a client) pointed at the HTTP port by mistake hears
// what it reached, not a bare timeout waiting for the server's challenge.
TEST_F(HttpEndpointTest, AControlPeerAtTheHttpPortIsToldItIsTheHttpEndpoint) {
  Start({});
  auto sock = net::FramedSocket::ConnectTcp("127.0.0.1", port_, milliseconds(5000));
  ASSERT_OK(sock.status());
  proto::Hello hello;
  hello.role = proto::Role::kCtl;
  proto::Welcome w;
  const Status s = net::AuthenticateToServer(sock.value().get(), "0123456789abcdef0123456789abcdef",
                                             hello, milliseconds(300), &w);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("is an HTTP endpoint"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("--server_port"), std::string::npos) << s.ToString();
  ExpectServing();
}

TEST_F(HttpEndpointTest, ServesMetricsStatusEventsAndThePage) {
  Start({});
  test::HttpReply r = Get("/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("\nedl_job_trainers{job_name=\"j1\"} 3\n"), std::string::npos) << r.body;
  r = Get("/api/status");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(json::parse(r.body)["world_size"], 3);
  r = Get("/api/events?job=j1&since=0");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(json::parse(r.body)["records"][0]["generation"], 2);
  r = Get("/api/nodes");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_TRUE(json::parse(r.body)["nodes"].is_object());
  r = Get("/");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_NE(r.body.find("<title>EDL cluster</title>"), std::string::npos);
  EXPECT_NE(r.headers["content-security-policy"].find("default-src 'none'"), std::string::npos);
  EXPECT_EQ(r.body.find("http://"), r.body.find("http://www.w3.org/2000/svg"))
      << "no external resources";
  EXPECT_EQ(r.body.find("https://"), std::string::npos) << "no external resources";
  // Two requests on one connection (keep-alive), the second a HEAD.
  bool closed = false;
  const std::string both =
      RawExchange(port_,
                  "GET /api/status HTTP/1.1\r\nHost: localhost\r\n\r\n"
                  "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                  &closed);
  EXPECT_EQ(both.find("HTTP/1.1 200 OK"), 0u) << both;
  EXPECT_NE(both.find("HTTP/1.1 200 OK", 10), std::string::npos) << both;
  EXPECT_TRUE(closed);
  EXPECT_EQ(both.find("# HELP"), std::string::npos) << "a HEAD has no body: " << both;
  EXPECT_NE(Get("/metrics").body.find("edl_http_responses_total{code=\"200\"}"), std::string::npos);
}

TEST_F(HttpEndpointTest, HostileRequestsGet4xxOrACloseAndOthersAreStillServed) {
  HttpOptions o;
  o.request_timeout = milliseconds(500);
  Start(o);
  const int calls = status_calls_;
  auto status_line = [&](const std::string& req) {
    bool closed = false;
    const std::string got = RawExchange(port_, req, &closed);
    EXPECT_TRUE(closed) << req.substr(0, 80) << " -> " << got;
    return got.substr(0, got.find("\r\n"));
  };
  // Path traversal and unknown paths: 404, nothing from the file system.
  for (const char* path :
       {"/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/metrics/../../etc/passwd",
        "//etc/passwd", "/api/status/../../x", "/index.html/.."}) {
    EXPECT_EQ(Get(path).status, 404) << path;
  }
  EXPECT_EQ(Get("/api/events?job=../../x").status, 400);
  EXPECT_EQ(Get("/api/events?job=j1&since=-1").status, 400);
  EXPECT_EQ(Get("/api/events?since=1").status, 400);
  // Oversize head, too many fields, a body, another method, garbage, a foreign Host.
  EXPECT_EQ(status_line("GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"),
            "HTTP/1.1 431 Request Header Fields Too Large");
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i) many += "X" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(status_line(many + "\r\n"), "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(status_line("POST /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(status_line("DELETE /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(status_line("\x16\x03\x01\x02garbage\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(Get("/api/status", {{"Host", "evil.example:80"}}).status, 403) << "DNS rebinding";
  EXPECT_EQ(status_calls_, calls) << "no refused request reached the status";
  const test::HttpReply denied = Get("/nope");
  EXPECT_EQ(denied.body, "not found\n") << "no detail leaked";

  // Slowloris: heads that never end are closed after request_timeout, meanwhile others are served.
  boost::asio::io_context cio;  // outlives its sockets
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> slow;
  for (int i = 0; i < 8; ++i) {
    auto s = std::make_unique<boost::asio::ip::tcp::socket>(cio);
    s->connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port_)});
    boost::asio::write(*s, boost::asio::buffer(std::string("GET /metrics HTTP/1.1\r\nX-a: ")));
    slow.push_back(std::move(s));
  }
  ExpectServing();
  for (auto& s : slow) {
    timeval tv{10, 0};
    ::setsockopt(s->native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char c;
    boost::system::error_code ec;
    const size_t n = s->read_some(boost::asio::buffer(&c, 1), ec);
    EXPECT_EQ(n, 0u);
    EXPECT_TRUE(ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset)
        << ec.message();
  }
  ExpectServing();
}

TEST_F(HttpEndpointTest, AFloodOfIdleConnectionsPushesOutItsOwnOldest) {
  HttpOptions o;
  o.max_connections = 16;
  o.max_idle_connections = 8;
  Start(o);
  boost::asio::io_context cio;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> idle;
  for (int i = 0; i < 40; ++i) {
    auto s = std::make_unique<boost::asio::ip::tcp::socket>(cio);
    s->connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port_)});
    idle.push_back(std::move(s));
  }
  ExpectServing();  // evicts an idle one to make room, or finds room
  // The server closed all but the newest few.
  int open = 0;
  // Every one of them was accepted before the request above (the listen queue is FIFO), and a
  // closed one has its FIN here by now.
  for (auto& s : idle) {
    s->non_blocking(true);
    char c;
    boost::system::error_code ec;
    s->read_some(boost::asio::buffer(&c, 1), ec);
    open += ec == boost::asio::error::would_block;
  }
  EXPECT_LE(open, 8) << "idle connections beyond the bound stay open";
  ExpectServing();
}

TEST_F(HttpEndpointTest, ATokenIsRequiredAndComparedExactly) {
  HttpOptions o;
  o.token = "c2VjcmV0LXRva2VuLTAxMjM0NTY3ODlhYmNkZWY=";
  Start(o);
  EXPECT_EQ(Get("/").status, 200) << "the page holds no data; it asks for the token";
  for (const char* path : {"/metrics", "/api/status", "/api/events?job=j1", "/api/nodes"}) {
    test::HttpReply none = Get(path);
    EXPECT_EQ(none.status, 401) << path;
    EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
    EXPECT_EQ(none.body, "unauthorized\n");
    EXPECT_EQ(Get(path, {{"Authorization", "Bearer " + o.token + "x"}}).status, 401) << path;
    EXPECT_EQ(Get(path, {{"Authorization", "Bearer " + o.token.substr(1)}}).status, 401) << path;
    EXPECT_EQ(Get(path, {{"Authorization", "Basic " + o.token}}).status, 401) << path;
    EXPECT_EQ(Get(path, {{"Authorization", "Bearer " + o.token}}).status, 200) << path;
  }
  // With a token, the Host is not checked (the token is the defence).
  EXPECT_EQ(
      Get("/api/status", {{"Authorization", "Bearer " + o.token}, {"Host", "edl.example"}}).status,
      200);
}

TEST(HttpOptionsTest, AddressesAndTokens) {
  std::string host;
  int port = 0;
  ASSERT_OK(ParseHttpAddr("127.0.0.1:8181", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8181);
  ASSERT_OK(ParseHttpAddr("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  for (const char* bad : {"", "8181", "localhost:8181", "::1:80", "1.2.3.4:99999",
                          "1.2.3.4:", ":80", "1.2.3.4:8x", "[::1]80"}) {
    EXPECT_FALSE(ParseHttpAddr(bad, &host, &port).ok()) << bad;
  }
  EXPECT_TRUE(IsLoopbackIp("127.0.0.2"));
  EXPECT_TRUE(IsLoopbackIp("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsLoopbackIp("0.0.0.0"));
  HttpOptions o;
  o.addr = "0.0.0.0:8181";
  const Status s = CheckHttpOptions(o);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("--http_token_file"), std::string::npos) << s.ToString();
  o.token = "has space in it but is long enough 0123456789";
  EXPECT_FALSE(CheckHttpOptions(o).ok());
  o.token = "c2VjcmV0LXRva2VuLTAxMjM0NTY3ODlhYmNkZWY=";
  EXPECT_OK(CheckHttpOptions(o));
  o.addr = "127.0.0.1:1";
  o.token.clear();
  EXPECT_OK(CheckHttpOptions(o));
}

}  // namespace
}  // namespace edl::jobserver
