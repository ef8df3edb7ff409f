// Connection: one framed, asynchronous stream connection (TCP or Unix) on an Asio io_context.
// It reads frames forever, hands each decoded message to `on_message`, queues outgoing frames and
// writes them in order, and closes itself with a logged reason on a bad frame, a peer that goes
// silent for `idle_timeout`, a peer that does not drain its queue (`max_queued_bytes`), or EOF.
// `on_close` runs exactly once, with the reason. A payload buffer grows as its bytes arrive, never
// to the length a header merely announces. After StartSession every frame in both directions is
// sealed (edl/net/auth.h SessionMac); a frame that fails its MAC closes the connection. An
// exception escaping `on_message` closes this connection (logged; handler_failed()), nothing else.
//
// Thread-safety: none. Every method must be called on the thread running the io_context (the
// daemons run one such thread, so their state needs no locks). Owned by shared_ptr: pending
// handlers hold a reference, so the object lives until the last one has run.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/net/auth.h"
#include "edl/proto/frame.h"

namespace edl::net {

namespace asio = boost::asio;

struct ConnectionOptions {
  // Close the connection when no frame arrives for this long. 0: never.
  std::chrono::milliseconds idle_timeout{0};
  // Close the connection when more than this many bytes wait to be written (a stuck peer).
  size_t max_queued_bytes = 512u << 20;
  // Largest frame payload accepted from the peer (raise it with StartSession once the peer has
  // authenticated).
  uint32_t max_frame_bytes = proto::kMaxFrameBytes;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Socket = asio::generic::stream_protocol::socket;
  using MessageFn = std::function<void(const nlohmann::json&)>;
  using CloseFn = std::function<void(const Status&)>;

  static std::shared_ptr<Connection> Create(Socket socket, std::string peer,
                                            ConnectionOptions options = {});
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts reading. Callbacks run on the io_context thread.
  void Start(MessageFn on_message, CloseFn on_close);
  // Queues one message (a JSON object with "type"). No-op once closed.
  void Send(const nlohmann::json& msg);
  // Queues a pre-encoded frame, shared between connections (a generation pushed to every node).
  void SendFrame(std::shared_ptr<const std::string> frame);
  // Sends `msg` and closes once it is written (or after 1 s).
  void SendAndClose(const nlohmann::json& msg, const Status& why);
  // Closes now; `on_close(why)` runs (once). Idempotent.
  void Close(const Status& why);
  void SetIdleTimeout(std::chrono::milliseconds t);
  std::chrono::milliseconds idle_timeout() const { return options_.idle_timeout; }
  // From now on seal every frame sent and require every frame received to be sealed under
  // `session`, and accept payloads up to `max_frame_bytes`. Call it right after sending (server)
  // or receiving (peer) the welcome, from the message callback, so the switch point is exact.
  void StartSession(std::unique_ptr<SessionMac> session, uint32_t max_frame_bytes);

  bool closed() const { return closed_; }
  // True once `on_message` threw: the connection was closed with Internal (and the error logged),
  // the process and its other connections untouched.
  bool handler_failed() const { return handler_failed_; }
  // Bytes held for the frame being read (tests: buffers grow with what arrives).
  size_t read_buffer_bytes() const { return body_.capacity(); }
  size_t queued_bytes() const { return queued_bytes_; }  // waiting to be written
  const std::string& peer() const { return peer_; }

 private:
  Connection(Socket socket, std::string peer, ConnectionOptions options);
  struct Outgoing {
    std::shared_ptr<const std::string> frame;  // unsealed header + payload, maybe shared
    bool sealed = false;
    char header[proto::kFrameHeaderBytes];  // sealed: this connection's header
    char tag[proto::kSealTagBytes];         // sealed: the session MAC
  };
  void ReadHeader();
  void ReadBody(uint32_t length);
  void OnBody();
  void ArmIdleTimer();
  void WriteNext();

  Socket socket_;
  const std::string peer_;
  ConnectionOptions options_;
  asio::steady_timer idle_timer_;
  MessageFn on_message_;
  CloseFn on_close_;
  bool closed_ = false;
  bool handler_failed_ = false;
  bool closing_after_write_ = false;
  Status close_reason_;
  std::unique_ptr<SessionMac> session_;
  char header_[proto::kFrameHeaderBytes];
  std::string body_;  // payload (+ MAC when sealed) of the frame being read
  std::deque<std::shared_ptr<Outgoing>> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false;
};

// Converts a connected TCP or Unix socket into the generic socket a Connection holds.
template <typename Protocol>
Connection::Socket ToGeneric(asio::basic_stream_socket<Protocol>&& s) {
  return Connection::Socket(std::move(s));
}

}  // namespace edl::net
