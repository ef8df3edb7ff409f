#include "edl/net/connection.h"

#include <array>

#include <glog/logging.h>

namespace edl::net {

std::shared_ptr<Connection> Connection::Create(Socket socket, std::string peer,
                                               ConnectionOptions options) {
  return std::shared_ptr<Connection>(new Connection(std::move(socket), std::move(peer), options));
}

Connection::Connection(Socket socket, std::string peer, ConnectionOptions options)
    : socket_(std::move(socket)),
      peer_(std::move(peer)),
      options_(options),
      idle_timer_(socket_.get_executor()) {}

void Connection::Start(MessageFn on_message, CloseFn on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  ArmIdleTimer();
  ReadHeader();
}

void Connection::SetIdleTimeout(std::chrono::milliseconds t) {
  options_.idle_timeout = t;
  ArmIdleTimer();
}

void Connection::ArmIdleTimer() {
  if (closed_ || options_.idle_timeout.count() <= 0) {
    idle_timer_.cancel();
    return;
  }
  idle_timer_.expires_after(options_.idle_timeout);
  auto self = shared_from_this();
  idle_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    self->Close(Status::Timeout("peer " + self->peer_ + " sent nothing for " +
                                std::to_string(self->options_.idle_timeout.count()) + " ms"));
  });
}

void Connection::StartSession(std::unique_ptr<SessionMac> session, uint32_t max_frame_bytes) {
  session_ = std::move(session);
  options_.max_frame_bytes = max_frame_bytes;
}

void Connection::ReadHeader() {
  auto self = shared_from_this();
  asio::async_read(
      socket_, asio::buffer(header_, sizeof(header_)),
      [self](const boost::system::error_code& ec, size_t) {
        if (self->closed_) return;
        if (ec) {
          self->Close(ec == asio::error::eof
                          ? Status::Unavailable("peer " + self->peer_ + " closed the connection")
                          : FromErrorCode("read from " + self->peer_, ec));
          return;
        }
        uint32_t len = 0;
        const bool sealed = self->session_ != nullptr;
        Status s =
            proto::DecodeFrameHeader(self->header_, self->options_.max_frame_bytes, sealed, &len);
        if (!s.ok()) {
          self->Close(s.WithContext("frame from " + self->peer_));
          return;
        }
        self->body_.clear();
        self->ReadBody(len);
      });
}

// Reads the rest of a `length`-byte body in steps that at most double what has arrived (64 KiB
// first), so a header announcing 4 MiB costs nothing until the bytes really come.
void Connection::ReadBody(uint32_t length) {
  const size_t have = body_.size();
  if (have == length) return OnBody();
  const size_t step = std::min<size_t>(length - have, std::max<size_t>(have, 64u << 10));
  body_.resize(have + step);
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(body_.data() + have, step),
                   [self, length](const boost::system::error_code& ec, size_t) {
                     if (self->closed_) return;
                     if (ec) {
                       self->Close(FromErrorCode("read from " + self->peer_, ec));
                       return;
                     }
                     self->ReadBody(length);
                   });
}

void Connection::OnBody() {
  size_t size = body_.size();
  if (session_ != nullptr) {
    size -= proto::kSealTagBytes;
    if (!session_->Open(header_, body_.data(), size, body_.data() + size)) {
      std::string().swap(body_);
      Close(Status::Unauthenticated("frame from " + peer_ +
                                    " failed its session MAC (altered, injected, replayed or "
                                    "reordered on the way)"));
      return;
    }
  }
  nlohmann::json msg;
  Status s = proto::DecodePayload(body_.data(), size, &msg);
  if (body_.capacity() > (64u << 10)) {
    std::string().swap(body_);  // do not keep a large buffer for an idle peer
  }
  if (!s.ok()) {
    Close(s.WithContext("frame from " + peer_));
    return;
  }
  ArmIdleTimer();
  if (on_message_) {
    MessageFn fn = on_message_;  // Close() inside may reset the member
    try {
      fn(msg);
    } catch (const std::exception& e) {
      // A handler's bug must cost this peer its connection, never the process its other peers
      // share: the frame is dropped and the connection closed, with the reason logged.
      handler_failed_ = true;
      LOG(ERROR) << "handling a frame from " << peer_ << " failed: " << e.what()
                 << "; closing its connection";
      Close(Status::Internal(std::string("handling a frame failed: ") + e.what()));
      return;
    }
  }
  if (!closed_) ReadHeader();
}

void Connection::Send(const nlohmann::json& msg) {
  if (closed_ || closing_after_write_) return;
  SendFrame(std::make_shared<const std::string>(proto::EncodeFrame(msg)));
}

void Connection::SendFrame(std::shared_ptr<const std::string> frame) {
  if (closed_ || closing_after_write_) return;
  queued_bytes_ += frame->size();
  if (queued_bytes_ > options_.max_queued_bytes) {
    Close(Status::IOError("peer " + peer_ + " does not read: " + std::to_string(queued_bytes_) +
                          " bytes queued"));
    return;
  }
  auto out = std::make_shared<Outgoing>();
  if (session_ != nullptr) {
    // Sealed in queue order, which is wire order. The payload is not copied: a frame shared
    // between connections gets this connection's header and MAC around the same bytes.
    const size_t size = frame->size() - proto::kFrameHeaderBytes;
    out->sealed = true;
    proto::EncodeFrameHeader(static_cast<uint32_t>(size + proto::kSealTagBytes), out->header,
                             proto::kFrameSealed);
    session_->Seal(out->header, frame->data() + proto::kFrameHeaderBytes, size, out->tag);
  }
  out->frame = std::move(frame);
  queue_.push_back(std::move(out));
  if (!writing_) WriteNext();
}

void Connection::SendAndClose(const nlohmann::json& msg, const Status& why) {
  if (closed_) return;
  Send(msg);
  closing_after_write_ = true;
  close_reason_ = why;
  if (!writing_) {
    Close(why);
    return;
  }
  // Bound the wait for the final write.
  options_.idle_timeout = std::chrono::milliseconds(1000);
  ArmIdleTimer();
}

void Connection::WriteNext() {
  if (queue_.empty() || closed_) {
    writing_ = false;
    if (closing_after_write_ && !closed_) Close(close_reason_);
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  std::shared_ptr<Outgoing> out = queue_.front();
  // The handler holds `out`, so the buffers outlive the write even if Close() clears the queue.
  auto done = [self, out](const boost::system::error_code& ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->Close(FromErrorCode("write to " + self->peer_, ec));
      return;
    }
    self->queued_bytes_ -= out->frame->size();
    self->queue_.pop_front();
    self->WriteNext();
  };
  if (!out->sealed) {
    asio::async_write(socket_, asio::buffer(*out->frame), std::move(done));
    return;
  }
  const std::array<asio::const_buffer, 3> bufs = {
      asio::buffer(out->header, sizeof(out->header)),
      asio::buffer(out->frame->data() + proto::kFrameHeaderBytes,
                   out->frame->size() - proto::kFrameHeaderBytes),
      asio::buffer(out->tag, sizeof(out->tag))};
  asio::async_write(socket_, bufs, std::move(done));
}

void Connection::Close(const Status& why) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  idle_timer_.cancel();
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  queue_.clear();
  queued_bytes_ = 0;
  CloseFn on_close = std::move(on_close_);
  on_close_ = nullptr;
  on_message_ = nullptr;  // break reference cycles held by the callbacks
  if (on_close) on_close(why);
}

}  // namespace edl::net
