#include "edl/net/connection.h"

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

void Connection::ReadHeader() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(header_, sizeof(header_)),
                   [self](const boost::system::error_code& ec, size_t) {
                     if (self->closed_) return;
                     if (ec) {
                       self->Close(ec == asio::error::eof
                                       ? Status::Unavailable("peer " + self->peer_ + " closed the connection")
                                       : FromErrorCode("read from " + self->peer_, ec));
                       return;
                     }
                     uint32_t len = 0;
                     Status s = proto::DecodeFrameHeader(self->header_, self->options_.max_frame_bytes, &len);
                     if (!s.ok()) {
                       self->Close(s.WithContext("frame from " + self->peer_));
                       return;
                     }
                     self->ReadPayload(len);
                   });
}

void Connection::ReadPayload(uint32_t length) {
  payload_.resize(length);
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(payload_.data(), length),
                   [self](const boost::system::error_code& ec, size_t) {
                     if (self->closed_) return;
                     if (ec) {
                       self->Close(FromErrorCode("read from " + self->peer_, ec));
                       return;
                     }
                     nlohmann::json msg;
                     Status s = proto::DecodePayload(self->payload_.data(), self->payload_.size(), &msg);
                     std::string().swap(self->payload_);
                     if (!s.ok()) {
                       self->Close(s.WithContext("frame from " + self->peer_));
                       return;
                     }
                     self->ArmIdleTimer();
                     if (self->on_message_) {
                       MessageFn fn = self->on_message_;  // Close() inside may reset the member
                       fn(msg);
                     }
                     if (!self->closed_) self->ReadHeader();
                   });
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
  queue_.push_back(std::move(frame));
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
  std::shared_ptr<const std::string> frame = queue_.front();
  asio::async_write(socket_, asio::buffer(*frame),
                    [self, frame](const boost::system::error_code& ec, size_t) {
                      if (self->closed_) return;
                      if (ec) {
                        self->Close(FromErrorCode("write to " + self->peer_, ec));
                        return;
                      }
                      self->queued_bytes_ -= frame->size();
                      self->queue_.pop_front();
                      self->WriteNext();
                    });
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
