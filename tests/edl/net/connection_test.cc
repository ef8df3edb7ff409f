#include "edl/net/connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "edl/net/framed_socket.h"
#include "tests/testutil.h"

namespace edl::net {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// An Asio Connection on one end of a socket pair, a blocking FramedSocket on the other.
class ConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    Connection::Socket s(io_);
    s.assign(asio::generic::stream_protocol(AF_UNIX, 0), fds[0]);
    conn_ = Connection::Create(std::move(s), "pair");
    peer_ = std::make_unique<FramedSocket>(fds[1], "peer");
  }
  void StartEcho(ConnectionOptions opts = {}) {
    if (opts.idle_timeout.count() > 0) conn_->SetIdleTimeout(opts.idle_timeout);
    conn_->Start([this](const json& m) { conn_->Send(m); },
                 [this](const Status& s) { closed_ = s; });
    thread_ = std::thread([this] { io_.run_for(std::chrono::seconds(20)); });
  }
  void TearDown() override {
    asio::post(io_, [this] { conn_->Close(Status::Aborted("test over")); });
    if (thread_.joinable()) thread_.join();
  }
  asio::io_context io_;
  std::shared_ptr<Connection> conn_;
  std::unique_ptr<FramedSocket> peer_;
  std::thread thread_;
  Status closed_;
};

TEST_F(ConnectionTest, EchoesFramesInOrder) {
  StartEcho();
  for (int i = 0; i < 50; ++i) ASSERT_OK(peer_->Send(json{{"type", "x"}, {"i", i}}, milliseconds(5000)));
  for (int i = 0; i < 50; ++i) {
    json m;
    ASSERT_OK(peer_->Receive(&m, milliseconds(5000)));
    EXPECT_EQ(m["i"], i);
  }
}

TEST_F(ConnectionTest, IdleTimeoutCloses) {
  ConnectionOptions o;
  o.idle_timeout = milliseconds(200);
  StartEcho(o);
  json m;
  Status s = peer_->Receive(&m, milliseconds(10000));
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
}

TEST(RawConnectionTest, BadFramesAreRejectedWithReason) {
  for (int kind = 0; kind < 3; ++kind) {
    asio::io_context io;
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    Connection::Socket s(io);
    s.assign(asio::generic::stream_protocol(AF_UNIX, 0), fds[0]);
    auto conn = Connection::Create(std::move(s), "pair");
    Status closed;
    int messages = 0;
    conn->Start([&](const json&) { ++messages; }, [&](const Status& st) { closed = st; });
    std::string bytes;
    if (kind == 0) {
      char header[proto::kFrameHeaderBytes];
      proto::EncodeFrameHeader(proto::kMaxFrameBytes + 1, header);
      bytes.assign(header, sizeof(header));
    } else if (kind == 1) {
      bytes = "GET / HTTP/1.1\r\n\r\n";
    } else {
      std::string payload = "{broken";
      char header[proto::kFrameHeaderBytes];
      proto::EncodeFrameHeader(static_cast<uint32_t>(payload.size()), header);
      bytes = std::string(header, sizeof(header)) + payload;
    }
    ASSERT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    io.run_for(std::chrono::seconds(5));
    EXPECT_TRUE(closed.IsCorruption()) << kind << ": " << closed.ToString();
    EXPECT_EQ(messages, 0);
    ::close(fds[1]);
  }
}

}  // namespace
}  // namespace edl::net
