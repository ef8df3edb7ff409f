#include "edl/net/framed_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "edl/net/auth.h"
#include "edl/net/handshake.h"
#include "edl/proto/frame.h"

namespace edl::net {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Non-blocking connect with a deadline; returns the connected fd (blocking mode) or an error.
StatusOr<int> ConnectFd(int family, const sockaddr* addr, socklen_t len, const std::string& what,
                        std::chrono::milliseconds timeout) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return PosixError("socket for " + what, errno);
  if (::connect(fd, addr, len) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    return PosixError("connect to " + what, err).WithContext("is the server running there?");
  }
  pollfd p{fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  int err = 0;
  socklen_t elen = sizeof(err);
  if (n == 0) {
    ::close(fd);
    return Status::Timeout("connect to " + what + " timed out after " +
                           std::to_string(timeout.count()) + " ms");
  }
  if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
    if (err == 0) err = errno;
    ::close(fd);
    return PosixError("connect to " + what, err);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

Status ParseHostPort(const std::string& s, const std::string& what, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
    return Status::InvalidArgument(what + " '" + s + "' is not HOST:PORT (e.g. 127.0.0.1:8180)");
  }
  const std::string p = s.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || v < 1 || v > 65535) {
    return Status::InvalidArgument(what + " '" + s + "': port '" + p + "' is not in 1..65535");
  }
  *host = s.substr(0, colon);
  *port = static_cast<int>(v);
  return Status::OK();
}

Status ParseHostPortList(const std::string& s, const std::string& what,
                         std::vector<std::pair<std::string, int>>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    std::pair<std::string, int> hp;
    EDL_RETURN_IF_ERROR(ParseHostPort(s.substr(pos, comma - pos), what, &hp.first, &hp.second));
    if (out->size() == 16) return Status::InvalidArgument(what + ": at most 16 servers");
    out->push_back(std::move(hp));
    pos = comma + 1;
  }
  return Status::OK();
}

FramedSocket::FramedSocket(int fd, std::string peer)
    : fd_(fd), peer_(std::move(peer)), max_frame_bytes_(proto::kMaxFrameBytes) {}

FramedSocket::~FramedSocket() { ::close(fd_); }

StatusOr<std::unique_ptr<FramedSocket>> FramedSocket::ConnectTcp(
    const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string what = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return Status::NotFound("cannot resolve " + what + ": " + gai_strerror(rc));
  }
  Status last = Status::Unavailable("no address for " + what);
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    StatusOr<int> fd = ConnectFd(a->ai_family, a->ai_addr, a->ai_addrlen, what, timeout);
    if (fd.ok()) {
      ::freeaddrinfo(res);
      int one = 1;
      ::setsockopt(fd.value(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::make_unique<FramedSocket>(fd.value(), what);
    }
    last = fd.status();
  }
  ::freeaddrinfo(res);
  return last;
}

StatusOr<std::unique_ptr<FramedSocket>> FramedSocket::ConnectUnix(
    const std::string& path, std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("Unix socket path " + path + " is longer than " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  StatusOr<int> fd = ConnectFd(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr),
                               "Unix socket " + path, timeout);
  if (!fd.ok()) return fd.status();
  return std::make_unique<FramedSocket>(fd.value(), path);
}

Status FramedSocket::WaitFd(short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd_, events, 0};
    const int n = ::poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return Status::OK();
    if (n == 0) return Status::Timeout("no data from " + peer_ + " in time");
    if (errno != EINTR) return PosixError("poll " + peer_, errno);
  }
}

Status FramedSocket::SendAll(const char* p, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    EDL_RETURN_IF_ERROR(WaitFd(POLLOUT, deadline));
    const ssize_t r = ::send(fd_, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return PosixError("send to " + peer_, errno);
    }
    off += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status FramedSocket::Send(const nlohmann::json& msg, std::chrono::milliseconds timeout) {
  const std::string frame = proto::EncodeFrame(msg);
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&write_mu_);
  if (session_ == nullptr) return SendAll(frame.data(), frame.size(), deadline);
  const size_t size = frame.size() - proto::kFrameHeaderBytes;
  char header[proto::kFrameHeaderBytes];
  char tag[proto::kSealTagBytes];
  proto::EncodeFrameHeader(static_cast<uint32_t>(size + proto::kSealTagBytes), header,
                           proto::kFrameSealed);
  session_->Seal(header, frame.data() + proto::kFrameHeaderBytes, size, tag);
  EDL_RETURN_IF_ERROR(SendAll(header, sizeof(header), deadline));
  EDL_RETURN_IF_ERROR(SendAll(frame.data() + proto::kFrameHeaderBytes, size, deadline));
  return SendAll(tag, sizeof(tag), deadline);
}

Status FramedSocket::ReadFull(char* p, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    Status s = WaitFd(POLLIN, deadline);
    if (!s.ok())
      return Status::IOError(peer_ + " stalled in the middle of a frame: " + s.message());
    const ssize_t r = ::recv(fd_, p + off, n - off, MSG_DONTWAIT);
    if (r == 0) return Status::Unavailable(peer_ + " closed the connection");
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return PosixError("recv from " + peer_, errno);
    }
    off += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status FramedSocket::Receive(nlohmann::json* msg, std::chrono::milliseconds timeout) {
  EDL_RETURN_IF_ERROR(WaitFd(POLLIN, Clock::now() + timeout));
  const auto deadline =
      Clock::now() + std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(10));
  char header[proto::kFrameHeaderBytes];
  EDL_RETURN_IF_ERROR(ReadFull(header, sizeof(header), deadline));
  uint32_t len = 0;
  EDL_RETURN_IF_ERROR(proto::DecodeFrameHeader(header, max_frame_bytes_, session_ != nullptr, &len)
                          .WithContext(peer_));
  // Grow with the bytes that arrive (at most doubling), never to the announced length at once.
  std::string body;
  while (body.size() < len) {
    const size_t have = body.size();
    const size_t step = std::min<size_t>(len - have, std::max<size_t>(have, 64u << 10));
    body.resize(have + step);
    EDL_RETURN_IF_ERROR(ReadFull(body.data() + have, step, deadline));
  }
  size_t size = body.size();
  if (session_ != nullptr) {
    size -= proto::kSealTagBytes;
    if (!session_->Open(header, body.data(), size, body.data() + size)) {
      Shutdown();
      return Status::Unauthenticated("frame from " + peer_ +
                                     " failed its session MAC (altered, injected, replayed or "
                                     "reordered on the way); connection closed");
    }
  }
  return proto::DecodePayload(body.data(), size, msg).WithContext(peer_);
}

void FramedSocket::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

bool FramedSocket::ProbeHttp(std::chrono::milliseconds timeout) {
  static constexpr char kRequest[] = "HEAD / HTTP/1.0\r\n\r\n";
  const auto deadline = Clock::now() + timeout;
  {
    MutexLock lock(&write_mu_);
    if (!SendAll(kRequest, sizeof(kRequest) - 1, deadline).ok()) return false;
  }
  char head[5];
  return ReadFull(head, sizeof(head), deadline).ok() && std::string(head, sizeof(head)) == "HTTP/";
}

Status AuthenticateToServer(FramedSocket* sock, const std::string& secret, proto::Hello hello,
                            std::chrono::milliseconds timeout, proto::Welcome* welcome) {
  sock->set_max_frame_bytes(proto::kMaxPreAuthFrameBytes);
  PeerHandshake hs(secret, std::move(hello));
  nlohmann::json in, out;
  if (Status s = sock->Receive(&in, timeout); !s.ok()) {
    // An edl server speaks first; a silent one may be an HTTP server (its --http_addr) that waits
    // for a request: then say so, instead of a bare timeout.
    if (s.IsTimeout() && sock->ProbeHttp(std::chrono::milliseconds(2000))) {
      return Status::InvalidArgument(
          sock->peer() +
          " is an HTTP endpoint (edl server --http_addr serves the "
          "metrics and the dashboard there), not the server's port: point --server at "
          "the server's --server_port (default 8180; the scripts' EDL_SERVER_PORT)");
    }
    return s.WithContext("waiting for the server's challenge");
  }
  EDL_RETURN_IF_ERROR(hs.OnChallenge(in, sock->peer(), &out));
  EDL_RETURN_IF_ERROR(sock->Send(out, timeout));
  EDL_RETURN_IF_ERROR(sock->Receive(&in, timeout).WithContext("waiting for the server's welcome"));
  bool proven = false;
  EDL_RETURN_IF_ERROR(hs.OnReply(in, sock->peer(), welcome, &proven));
  sock->StartSession(hs.TakeSession());
  sock->set_max_frame_bytes(proto::kMaxFrameBytes);
  return Status::OK();
}

Status AuthenticatePeer(FramedSocket* sock, const std::string& secret, proto::Welcome welcome,
                        std::chrono::milliseconds timeout, proto::Hello* hello,
                        const std::function<Status(const proto::Hello&)>& admit) {
  sock->set_max_frame_bytes(proto::kMaxPreAuthFrameBytes);
  ServerHandshake hs(secret);
  EDL_RETURN_IF_ERROR(sock->Send(hs.Challenge(), timeout));
  nlohmann::json j;
  EDL_RETURN_IF_ERROR(sock->Receive(&j, timeout).WithContext("waiting for the peer's hello"));
  Status s = hs.OnHello(j, sock->peer(), hello);
  if (s.ok()) s = admit(*hello);
  if (!s.ok()) {
    (void)sock->Send(hs.Refusal(s), timeout);  // best effort: the peer may be gone
    return s;
  }
  EDL_RETURN_IF_ERROR(sock->Send(hs.Welcome(welcome), timeout));
  sock->StartSession(hs.TakeSession());
  sock->set_max_frame_bytes(proto::kMaxFrameBytes);
  return Status::OK();
}

}  // namespace edl::net
