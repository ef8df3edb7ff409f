// Status: the result of an operation that can fail for expected reasons (peer gone, spawn failed,
// bad frame, corrupt checkpoint, bad config). Modelled on leveldb's Status: OK is cheap, an error
// carries a code and a message that names the object and suggests a fix.
//
// Status and StatusOr are [[nodiscard]]: a call whose result is dropped does not compile silently.
// Where dropping it is right, the call says so: `(void)Call();  // why`.
//
// Thread-safety: a Status is a value; distinct objects may be used from distinct threads freely.
#pragma once

#include <string>
#include <utility>

#include <boost/system/error_code.hpp>

namespace edl {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,     // bad flag, bad config, malformed input from a user
    kNotFound,            // file, key, checkpoint or peer does not exist
    kCorruption,          // bytes failed validation: bad frame, checksum mismatch, wrong magic
    kIOError,             // OS or network failure
    kTimeout,             // a bounded wait ran out
    kAborted,             // the operation was cancelled (communicator abort, shutdown)
    kUnauthenticated,     // HMAC challenge failed or no credentials
    kAlreadyExists,       // e.g. node name already connected
    kFailedPrecondition,  // e.g. stale generation, incompatible fingerprint
    kUnavailable,         // peer or service not reachable right now; retry may work
    kInternal,            // a bug or an unexpected library failure
  };

  Status() = default;
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {Code::kIOError, std::move(m)}; }
  static Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {Code::kFailedPrecondition, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  bool IsTimeout() const { return code_ == Code::kTimeout; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsAborted() const { return code_ == Code::kAborted; }

  // Returns a copy with `context + ": "` prepended to the message (no-op on OK).
  Status WithContext(const std::string& context) const;

  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  static const char* CodeName(Code code);

 private:
  Code code_ = Code::kOk;
  std::string msg_;
};

// The one place errno and boost::system::error_code become a Status (leveldb PosixError).
// `context` names the object (a path, an address) so the message says what failed.
Status PosixError(const std::string& context, int err_number);
Status FromErrorCode(const std::string& context, const boost::system::error_code& ec);

// A value or an error. REQUIRES: ok() before value().
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status s) : status_(std::move(s)) {}  // NOLINT: implicit by design
  StatusOr(T v) : value_(std::move(v)) {}        // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

 private:
  Status status_;
  T value_{};
};

}  // namespace edl

// Returns early from the enclosing function with the Status of `expr` when it is not OK.
#define EDL_RETURN_IF_ERROR(expr)      \
  do {                                 \
    ::edl::Status _edl_st = (expr);    \
    if (!_edl_st.ok()) return _edl_st; \
  } while (0)
