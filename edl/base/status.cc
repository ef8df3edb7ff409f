#include "edl/base/status.h"

#include <cstring>

namespace edl {

const char* Status::CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kNotFound:
      return "NotFound";
    case Code::kCorruption:
      return "Corruption";
    case Code::kIOError:
      return "IOError";
    case Code::kTimeout:
      return "Timeout";
    case Code::kAborted:
      return "Aborted";
    case Code::kUnauthenticated:
      return "Unauthenticated";
    case Code::kAlreadyExists:
      return "AlreadyExists";
    case Code::kFailedPrecondition:
      return "FailedPrecondition";
    case Code::kUnavailable:
      return "Unavailable";
    case Code::kInternal:
      return "Internal";
  }
  return "Unknown";
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + msg_);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + msg_;
}

Status PosixError(const std::string& context, int err_number) {
  std::string msg = context + ": " + std::strerror(err_number);
  switch (err_number) {
    case ENOENT:
      return Status::NotFound(msg);
    case ETIMEDOUT:
      return Status::Timeout(msg);
    case EINVAL:
      return Status::InvalidArgument(msg);
    case EEXIST:
      return Status::AlreadyExists(msg);
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return Status::Unavailable(msg);
    default:
      return Status::IOError(msg);
  }
}

Status FromErrorCode(const std::string& context, const boost::system::error_code& ec) {
  if (!ec) return Status::OK();
  if (ec.category() == boost::system::system_category() ||
      ec.category() == boost::system::generic_category()) {
    return PosixError(context, ec.value());
  }
  return Status::IOError(context + ": " + ec.message());
}

}  // namespace edl
