#include "jobclient/session_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <glog/logging.h>

#include "edl/base/status.h"
#include "edl/proto/messages.h"

namespace edl::jobclient {

namespace {

bool IsHexToken(const std::string& s) {
  if (s.size() != proto::kSessionTokenBytes) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Reads the session token at `path`: only from a regular file of ours that nobody else can read
// or write (it proves the node's identity to the server). Empty when there is none.
std::string LoadSessionFile(const std::string& path) {
  if (path.empty()) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  char buf[proto::kSessionTokenBytes + 2] = {};
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 077) == 0) {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } else {
    LOG(WARNING) << "ignoring session file " << path << ": not a regular file of this user with "
                 << "mode 0600";
  }
  ::close(fd);
  std::string token(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  return IsHexToken(token) ? token : "";
}

// Writes `token` to `path` (mode 0600) atomically: a new file, then rename.
Status SaveSessionFile(const std::string& path, const std::string& token) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError("session file " + tmp + " (--state_dir)", errno);
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  ::close(fd);
  if (!ok) return PosixError("session file " + tmp, err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("session file " + path, errno);
  return Status::OK();
}

}  // namespace

SessionFile::~SessionFile() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void SessionFile::Open(const std::string& path, const std::string& node) {
  if (path.empty()) return;
  // The kernel drops the lock when the process dies, SIGKILL included.
  const std::string lock = path + ".lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    LOG(WARNING) << "another edl client of node " << node << " holds " << lock
                 << "; this one does not use the node's session token (give each client its own "
                    "--node_name)";
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
    return;
  }
  path_ = path;
  token_ = LoadSessionFile(path_);
  if (!token_.empty()) LOG(INFO) << "session token of node " << node << " from " << path_;
}

void SessionFile::Keep(const std::string& token) {
  if (token == token_ || !IsHexToken(token)) return;
  token_ = token;
  if (path_.empty()) return;
  Status s = SaveSessionFile(path_, token);
  if (!s.ok()) {
    LOG(WARNING) << "cannot keep the node's session token: " << s.ToString()
                 << "; a restarted client will wait until the server has lost this node";
  }
}

}  // namespace edl::jobclient
