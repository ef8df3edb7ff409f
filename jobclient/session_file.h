// SessionFile: the node's session token (PROTOCOL.md "Authentication") kept across client restarts,
// so a restarted client re-attaches as its node: a file of the client's user, mode 0600, written
// atomically, and a lock next to it (<path>.lock) held for the client's life, so that two clients
// under one node name and state directory do not take the node from each other in turn (the
// second one uses no token; the server refuses it with a retryable error).
//
// Thread-safety: none (the client's io_context thread).
#pragma once

#include <string>

namespace edl::jobclient {

class SessionFile {
 public:
  SessionFile() = default;
  ~SessionFile();  // releases the lock
  SessionFile(const SessionFile&) = delete;
  SessionFile& operator=(const SessionFile&) = delete;

  // Locks `path` for this client and reads the token kept there (only from a regular file of
  // this user that nobody else can read or write). Empty `path`, or a lock another client holds
  // (a warning names the fix): no file is used and the token lives in memory only.
  void Open(const std::string& path, const std::string& node);
  // The node's token (64 hex); empty before the first welcome when no file had one.
  const std::string& token() const { return token_; }
  // The token of a welcome: kept, and saved when it is new and the file is this client's (a
  // failure to save is logged: a restarted client then waits until the server has lost the node).
  void Keep(const std::string& token);

 private:
  std::string path_;  // the file while this client holds its lock, else ""
  std::string token_;
  int lock_fd_ = -1;
};

}  // namespace edl::jobclient
