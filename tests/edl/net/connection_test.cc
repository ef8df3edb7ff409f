#include "edl/net/connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "edl/net/framed_socket.h"
#include "tests/testutil.h"

namespace edl::net {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// A Connection on one end of a fresh AF_UNIX socket pair; *peer_fd receives the other end.
std::shared_ptr<Connection> PairConnection(asio::io_context& io, int* peer_fd,
                                           ConnectionOptions options = {}) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return nullptr;
  Connection::Socket s(io);
  s.assign(asio::generic::stream_protocol(AF_UNIX, 0), fds[0]);
  *peer_fd = fds[1];
  return Connection::Create(std::move(s), "pair", options);
}

// An Asio Connection on one end of a socket pair, a blocking FramedSocket on the other.
class ConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fd = -1;
    conn_ = PairConnection(io_, &fd);
    ASSERT_NE(conn_, nullptr);
    peer_ = std::make_unique<FramedSocket>(fd, "peer");
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
  for (int i = 0; i < 50; ++i)
    ASSERT_OK(peer_->Send(json{{"type", "x"}, {"i", i}}, milliseconds(5000)));
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

// A handler that throws costs its own connection only: the connection closes with Internal (and
// says so), a second connection on the same io_context keeps working, and nothing escapes run().
TEST(RawConnectionTest, AThrowingHandlerClosesItsConnectionOnly) {
  asio::io_context io;
  int bad_fd = -1, good_fd = -1;
  auto bad = PairConnection(io, &bad_fd);
  auto good = PairConnection(io, &good_fd);
  ASSERT_NE(bad, nullptr);
  ASSERT_NE(good, nullptr);
  FramedSocket bad_peer(bad_fd, "bad peer"), good_peer(good_fd, "good peer");
  Status bad_closed;
  bad->Start([](const json& m) { (void)m.at("missing").get<std::string>(); },  // throws
             [&](const Status& s) { bad_closed = s; });
  good->Start([&](const json& m) { good->Send(m); }, [](const Status&) {});
  std::thread t([&] { io.run_for(std::chrono::seconds(20)); });
  ASSERT_OK(bad_peer.Send(json{{"type", "x"}}, milliseconds(5000)));
  json m;
  EXPECT_EQ(bad_peer.Receive(&m, milliseconds(10000)).code(), Status::Code::kUnavailable)
      << "not closed";
  ASSERT_OK(good_peer.Send(json{{"type", "x"}, {"i", 1}}, milliseconds(5000)));
  ASSERT_OK(good_peer.Receive(&m, milliseconds(10000)));
  EXPECT_EQ(m["i"], 1);
  asio::post(io, [&] {
    EXPECT_TRUE(bad->handler_failed());
    EXPECT_EQ(bad_closed.code(), Status::Code::kInternal) << bad_closed.ToString();
    EXPECT_FALSE(good->handler_failed());
    good->Close(Status::Aborted("test over"));
  });
  t.join();
}

TEST(RawConnectionTest, BadFramesAreRejectedWithReason) {
  for (int kind = 0; kind < 3; ++kind) {
    asio::io_context io;
    int fds[2] = {-1, -1};
    auto conn = PairConnection(io, &fds[1]);
    ASSERT_NE(conn, nullptr);
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

namespace edl::net {
namespace {

// A sealed Connection (the server's side) on one end of a socket pair; the test writes raw bytes
// as the peer, sealed with its own SessionMac, and reads replies through a sealed FramedSocket.
class SealedConnectionTest : public ::testing::Test {
 protected:
  const std::string secret_ = "cluster-secret-0123456789abcdefgh";
  const std::string ns_ = NewNonce(), np_ = NewNonce();

  void SetUp() override {
    conn_ = PairConnection(io_, &fd_);
    ASSERT_NE(conn_, nullptr);
    conn_->StartSession(std::make_unique<SessionMac>(secret_, ns_, np_, /*server_side=*/true),
                        proto::kMaxFrameBytes);
    reader_ = std::make_unique<FramedSocket>(fd_, "peer");
    reader_->StartSession(std::make_unique<SessionMac>(secret_, ns_, np_, /*server_side=*/false));
    conn_->Start(
        [this](const json& m) {
          seen_.push_back(m);
          conn_->Send(m);  // echo, sealed
        },
        [this](const Status& s) { closed_ = s; });
  }
  // Header + payload + MAC as `mac` seals it (advancing its counter).
  static std::string Sealed(SessionMac* mac, const json& m) {
    std::string frame = proto::EncodeFrame(m);
    const std::string payload = frame.substr(proto::kFrameHeaderBytes);
    char header[proto::kFrameHeaderBytes];
    proto::EncodeFrameHeader(static_cast<uint32_t>(payload.size() + proto::kSealTagBytes), header,
                             proto::kFrameSealed);
    char tag[proto::kSealTagBytes];
    mac->Seal(header, payload.data(), payload.size(), tag);
    return std::string(header, sizeof(header)) + payload + std::string(tag, sizeof(tag));
  }
  void Write(const std::string& bytes) {
    ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // Runs the loop until the connection closed (or 10 s passed).
  void RunUntilClosed() {
    for (int i = 0; i < 1000 && !conn_->closed(); ++i) io_.run_for(milliseconds(10));
  }

  asio::io_context io_;
  std::shared_ptr<Connection> conn_;
  int fd_ = -1;
  std::unique_ptr<FramedSocket> reader_;  // owns fd_
  std::vector<json> seen_;
  Status closed_;
  SessionMac peer_{secret_, ns_, np_, /*server_side=*/false};
};

TEST_F(SealedConnectionTest, SealedFramesFlowBothWays) {
  for (int i = 0; i < 5; ++i) Write(Sealed(&peer_, json{{"type", "kill"}, {"i", i}}));
  for (int i = 0; i < 200 && seen_.size() < 5; ++i) io_.run_for(milliseconds(10));
  ASSERT_EQ(seen_.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    io_.run_for(milliseconds(1));
    json m;
    ASSERT_OK(reader_->Receive(&m, milliseconds(5000)));  // the echo passed the reader's MAC check
    EXPECT_EQ(m["i"], i);
  }
  EXPECT_FALSE(conn_->closed());
}

TEST_F(SealedConnectionTest, ReplayedFrameCloses) {
  const std::string a = Sealed(&peer_, json{{"type", "stop"}});
  Write(a);
  Write(a);
  RunUntilClosed();
  EXPECT_EQ(seen_.size(), 1u);
  EXPECT_TRUE((closed_.code() == Status::Code::kUnauthenticated)) << closed_.ToString();
  EXPECT_NE(closed_.message().find("session MAC"), std::string::npos) << closed_.ToString();
}

TEST_F(SealedConnectionTest, ReorderedOrDroppedAndResentFrameCloses) {
  const std::string a = Sealed(&peer_, json{{"type", "kill"}, {"trainer_ids", {"t1"}}});
  const std::string b = Sealed(&peer_, json{{"type", "stop"}});
  Write(b);  // `a` was dropped on the way (or comes later)
  Write(a);
  RunUntilClosed();
  EXPECT_TRUE(seen_.empty());
  EXPECT_TRUE((closed_.code() == Status::Code::kUnauthenticated)) << closed_.ToString();
}

TEST_F(SealedConnectionTest, TamperedFrameCloses) {
  std::string a = Sealed(&peer_, json{{"type", "kill"}, {"trainer_ids", {"t1"}}});
  a[a.find("t1")] = 'x';
  Write(a);
  RunUntilClosed();
  EXPECT_TRUE(seen_.empty());
  EXPECT_TRUE((closed_.code() == Status::Code::kUnauthenticated)) << closed_.ToString();
}

TEST_F(SealedConnectionTest, InjectedUnsealedFrameCloses) {
  Write(proto::EncodeFrame(json{{"type", "stop"}}));
  RunUntilClosed();
  EXPECT_TRUE(seen_.empty());
  EXPECT_TRUE(closed_.IsCorruption()) << closed_.ToString();
  EXPECT_NE(closed_.message().find("unsealed"), std::string::npos) << closed_.ToString();
}

TEST_F(SealedConnectionTest, FrameSealedForTheOtherDirectionOrConnectionCloses) {
  SessionMac reflected(secret_, ns_, np_, /*server_side=*/true);
  Write(Sealed(&reflected, json{{"type", "stop"}}));
  RunUntilClosed();
  EXPECT_TRUE(seen_.empty());
  EXPECT_TRUE((closed_.code() == Status::Code::kUnauthenticated)) << closed_.ToString();
}

TEST_F(SealedConnectionTest, FrameFromAnotherSessionCloses) {
  SessionMac other(secret_, NewNonce(), np_, /*server_side=*/false);
  Write(Sealed(&other, json{{"type", "stop"}}));
  RunUntilClosed();
  EXPECT_TRUE(seen_.empty());
  EXPECT_TRUE((closed_.code() == Status::Code::kUnauthenticated)) << closed_.ToString();
}

TEST_F(SealedConnectionTest, FramedSocketRejectsTamperedAndReplayedFrames) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FramedSocket sock(fds[0], "server");
  sock.StartSession(std::make_unique<SessionMac>(secret_, ns_, np_, /*server_side=*/false));
  SessionMac server(secret_, ns_, np_, /*server_side=*/true);
  const std::string a = Sealed(&server, json{{"type", "ctl_reply"}, {"n", 1}});
  ASSERT_EQ(::write(fds[1], a.data(), a.size()), static_cast<ssize_t>(a.size()));
  json m;
  ASSERT_OK(sock.Receive(&m, milliseconds(5000)));
  EXPECT_EQ(m["n"], 1);
  ASSERT_EQ(::write(fds[1], a.data(), a.size()), static_cast<ssize_t>(a.size()));  // replay
  Status s = sock.Receive(&m, milliseconds(5000));
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated) << s.ToString();
  ::close(fds[1]);
}

TEST(GrowingBufferTest, AnnouncedLengthIsNotAllocatedUpFront) {
  asio::io_context io;
  int fds[2] = {-1, -1};
  auto conn = PairConnection(io, &fds[1]);
  ASSERT_NE(conn, nullptr);
  std::vector<json> seen;
  conn->Start([&](const json& m) { seen.push_back(m); }, [](const Status&) {});
  // A 4 MiB frame announced, then sent slowly: the buffer follows what arrived.
  std::string payload = R"({"type":"x","pad":")";
  payload += std::string(proto::kMaxFrameBytes - payload.size() - 2, 'p') + "\"}";
  ASSERT_EQ(payload.size(), proto::kMaxFrameBytes);
  char header[proto::kFrameHeaderBytes];
  proto::EncodeFrameHeader(static_cast<uint32_t>(payload.size()), header);
  ASSERT_EQ(::write(fds[1], header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  for (int i = 0; i < 500 && conn->read_buffer_bytes() == 0; ++i) io.run_for(milliseconds(10));
  EXPECT_GT(conn->read_buffer_bytes(), 0u);
  EXPECT_LE(conn->read_buffer_bytes(), 128u << 10) << "allocated before the bytes came";
  // Now the rest, from a thread (the socket buffer is smaller than 4 MiB): the first half, then
  // (once the test has seen the buffer hold it) the second. The frame cannot complete before the
  // second half is written, so the grown buffer is observed however fast the machine is.
  const size_t half = payload.size() / 2;
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;  // guarded by mu
  std::atomic<size_t> sent{0};
  std::thread rest([&] {
    auto write_to = [&](size_t end) {
      while (sent < end) {
        const ssize_t n =
            ::write(fds[1], payload.data() + sent, std::min<size_t>(end - sent, 65536));
        if (n <= 0) return false;
        sent += static_cast<size_t>(n);
      }
      return true;
    };
    if (!write_to(half)) return;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return go; });
    }
    write_to(payload.size());
  });
  size_t max_seen = 0;
  for (int i = 0; i < 12000 && max_seen < half; ++i) {
    io.run_for(milliseconds(5));
    max_seen = std::max(max_seen, conn->read_buffer_bytes());
  }
  EXPECT_TRUE(seen.empty()) << "a frame was delivered before its second half was sent";
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_one();
  for (int i = 0; i < 12000 && seen.empty(); ++i) io.run_for(milliseconds(5));
  rest.join();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0]["pad"].get_ref<const std::string&>().size(), proto::kMaxFrameBytes - 21);
  EXPECT_GE(max_seen, half);  // it grew with the bytes that came
  EXPECT_LT(conn->read_buffer_bytes(), 128u << 10)
      << "the large buffer is released after the frame";
  conn->Close(Status::Aborted("test over"));
  ::close(fds[1]);
}

TEST(PreAuthLimitTest, LargeFrameBeforeAuthenticationCloses) {
  asio::io_context io;
  int fds[2] = {-1, -1};
  ConnectionOptions o;
  o.max_frame_bytes = proto::kMaxPreAuthFrameBytes;
  auto conn = PairConnection(io, &fds[1], o);
  ASSERT_NE(conn, nullptr);
  Status closed;
  conn->Start([](const json&) {}, [&](const Status& st) { closed = st; });
  char header[proto::kFrameHeaderBytes];
  proto::EncodeFrameHeader(proto::kMaxPreAuthFrameBytes + 1, header);
  ASSERT_EQ(::write(fds[1], header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  for (int i = 0; i < 500 && !conn->closed(); ++i) io.run_for(milliseconds(10));
  EXPECT_TRUE(closed.IsCorruption()) << closed.ToString();
  EXPECT_NE(closed.message().find("exceeds"), std::string::npos) << closed.ToString();
  ::close(fds[1]);
}

}  // namespace
}  // namespace edl::net
