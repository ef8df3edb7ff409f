#include "jobclient/trainer_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <glog/logging.h>

namespace edl::jobclient {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

// Before its hello a connection is closed after this long without a frame.
constexpr std::chrono::milliseconds kHelloTimeout{5000};

// True when a process accepts connections on the Unix socket at `path` (another live client).
bool SocketInUse(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;  // binding it fails with a clear error
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

TrainerSocket::TrainerSocket(asio::io_context* io) : acceptor_(*io) {}

TrainerSocket::~TrainerSocket() { RemoveSocketFile(); }

Status TrainerSocket::Listen(const std::string& path, FrameFn on_frame, CloseFn on_close) {
  path_ = path;
  on_frame_ = std::move(on_frame);
  on_close_ = std::move(on_close);
  if (SocketInUse(path_)) {
    return Status::AlreadyExists("trainer socket " + path_ +
                                 " is in use by a running client; "
                                 "give each client its own --socket_path");
  }
  struct stat st;  // left by a client that was killed: only a socket file is removed
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path_.c_str());
  boost::system::error_code ec;
  asio::local::stream_protocol::endpoint ep(path_);
  const mode_t old = ::umask(0177);  // the socket is created 0600: this node's trainers only
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  bound_ = !ec;
  ::umask(old);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return FromErrorCode("trainer socket " + path_, ec).WithContext("--socket_path");
  ::chmod(path_.c_str(), 0600);
  Accept();
  return Status::OK();
}

void TrainerSocket::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec,
                                asio::local::stream_protocol::socket socket) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if (!ec) {
      net::ConnectionOptions o;
      o.idle_timeout = kHelloTimeout;
      auto conn = net::Connection::Create(net::ToGeneric(std::move(socket)), "trainer socket", o);
      const uint64_t id = next_channel_++;
      channels_[id] = conn;
      conn->Start([this, id](const json& m) { on_frame_(id, m); },
                  [this, id](const Status& s) {
                    channels_.erase(id);
                    on_close_(id, s);
                  });
    }
    Accept();
  });
}

void TrainerSocket::Send(uint64_t channel, const json& msg) {
  auto it = channels_.find(channel);
  if (it != channels_.end()) it->second->Send(msg);
}

void TrainerSocket::SendAndClose(uint64_t channel, const json& msg, const Status& why) {
  auto it = channels_.find(channel);
  if (it != channels_.end()) it->second->SendAndClose(msg, why);
}

void TrainerSocket::Close(uint64_t channel, const Status& why) {
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  std::shared_ptr<net::Connection> conn = it->second;  // its close erases the entry
  conn->Close(why);
}

void TrainerSocket::SetIdleTimeout(uint64_t channel, std::chrono::milliseconds t) {
  auto it = channels_.find(channel);
  if (it != channels_.end()) it->second->SetIdleTimeout(t);
}

void TrainerSocket::Stop() {
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  RemoveSocketFile();
}

void TrainerSocket::RemoveSocketFile() {
  if (!bound_) return;  // never another client's
  bound_ = false;
  // Only a socket file: never whatever else the path may name by now.
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path_.c_str());
}

}  // namespace edl::jobclient
