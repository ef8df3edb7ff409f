// TrainerSocket: the node's Unix socket for its trainers and warm spares (EDL_CLIENT_SOCKET,
// edl/net/trainer_channel.h), created mode 0600 so only this user's processes connect, and the
// connections accepted on it, each known by a channel id (1, 2, ..., never reused). A connection
// has a 5 s idle timeout until its owner changes it (a trainer's hello); its frames and its close
// go to the callbacks given to Listen. The socket file is removed by Stop() or the destructor, and
// only when this object created it and it is still a socket.
//
// Thread-safety: none. Every method, and the callbacks, on the io_context thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/net/connection.h"

namespace edl::jobclient {

class TrainerSocket {
 public:
  using FrameFn = std::function<void(uint64_t channel, const nlohmann::json& msg)>;
  using CloseFn = std::function<void(uint64_t channel, const Status& why)>;

  // `io` is not owned and must outlive the socket.
  explicit TrainerSocket(boost::asio::io_context* io);
  ~TrainerSocket();
  TrainerSocket(const TrainerSocket&) = delete;
  TrainerSocket& operator=(const TrainerSocket&) = delete;

  // Binds `path` (removing a socket file a dead client left there) and accepts connections.
  // AlreadyExists when a live process accepts on `path`; IOError naming the path when it cannot
  // be bound. `on_close` runs once per connection, after which its id is unknown.
  Status Listen(const std::string& path, FrameFn on_frame, CloseFn on_close);
  // No-ops for an id that is not open.
  void Send(uint64_t channel, const nlohmann::json& msg);
  void SendAndClose(uint64_t channel, const nlohmann::json& msg, const Status& why);
  void Close(uint64_t channel, const Status& why);  // on_close runs before it returns
  void SetIdleTimeout(uint64_t channel, std::chrono::milliseconds t);
  // Stops accepting and removes the socket file; open connections stay.
  void Stop();

 private:
  void Accept();
  void RemoveSocketFile();

  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::string path_;
  bool bound_ = false;  // this object created the socket file (and so removes it)
  bool stopped_ = false;
  FrameFn on_frame_;
  CloseFn on_close_;
  std::map<uint64_t, std::shared_ptr<net::Connection>> channels_;  // the open ones
  uint64_t next_channel_ = 1;
};

}  // namespace edl::jobclient
