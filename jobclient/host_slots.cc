#include "jobclient/host_slots.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "edl/proto/messages.h"

namespace edl::jobclient {

namespace {

// A file-name part: letters, digits, '.' and '-' kept, anything else (':' of an IPv6 literal or
// of HOST:PORT) as '_'.
std::string NamePart(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-';
    if (!keep) c = '_';
  }
  return out;
}

constexpr int kSameNodeWaitMs = 15000;

// What a holder wrote into its file ("<pid> <node>"), bounded; empty when unreadable.
std::string HolderLine(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.find(' ') == std::string::npos ? "" : s;
}
std::string HolderNode(int fd) {
  const std::string s = HolderLine(fd);
  return s.empty() ? "" : s.substr(s.find(' ') + 1);
}
// The holder, for the refusal.
std::string Holder(int fd) {
  const std::string s = HolderLine(fd);
  if (s.empty()) return "another edl client";
  const size_t space = s.find(' ');
  return "the edl client of node " + s.substr(space + 1) + " (pid " + s.substr(0, space) + ")";
}

// This process's network namespace ("4026531992" of "net:[4026531992]"): a host address names
// one machine within one namespace (containers and test namespaces share a filesystem, not a
// network). "" when /proc does not say.
std::string NetNamespace() {
  char buf[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", buf, sizeof(buf) - 1);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  const size_t open = s.find('['), close = s.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : s.substr(open + 1, close - open - 1);
}

}  // namespace

HostSlotClaim::~HostSlotClaim() { Release(); }

void HostSlotClaim::Release() {
  // Unlinked while still locked: a client that opened the file meanwhile finds, once it has the
  // lock, that its file is no longer the path's and opens the new one (see Claim).
  for (size_t i = 0; i < fds_.size(); ++i) {
    ::unlink(paths_[i].c_str());
    ::close(fds_[i]);
  }
  fds_.clear();
  paths_.clear();
}

Status HostSlotClaim::Claim(const std::string& lock_dir, const std::string& server,
                            const std::string& host, const std::vector<int>& slots,
                            const std::string& node) {
  if (proto::IsLoopbackHost(host)) return Status::OK();
  const std::string prefix = lock_dir + "/edl-slot-" + NamePart(server) + "-" + NamePart(host) +
                             "-" + NamePart(NetNamespace()) + "-";
  for (int slot : slots) {
    const std::string path = prefix + std::to_string(slot) + ".lock";
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
      // Another user's file: a read-only descriptor locks it just as well.
      if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        Release();
        return PosixError("host slot lock " + path + " (one edl client per machine; " + lock_dir +
                              " must be writable)",
                          err);
      }
      bool locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      // The previous client of this very node still on its way out (a restart): wait for it,
      // bounded.
      for (int waited_ms = 0; !locked && waited_ms < kSameNodeWaitMs && HolderNode(fd) == node;
           waited_ms += 100) {
        ::usleep(100 * 1000);
        locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      }
      if (!locked) {
        const std::string holder = Holder(fd);
        ::close(fd);
        Release();
        return Status::AlreadyExists("slot " + std::to_string(slot) + " of host " + host +
                                     " is offered to the server " + server + " by " + holder +
                                     " on this machine (" + path +
                                     "): " + proto::kOneClientPerMachineFix);
      }
      // The holder released (and unlinked) the file between our open and our lock: try the path
      // again, or two clients would hold locks on two different files of one name.
      struct stat by_fd, by_path;
      if (::fstat(fd, &by_fd) != 0 || ::stat(path.c_str(), &by_path) != 0 ||
          by_fd.st_ino != by_path.st_ino || by_fd.st_dev != by_path.st_dev) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) {
      Release();
      return Status::Unavailable("host slot lock " + path +
                                 " kept changing under this client; start it again");
    }
    const std::string line = std::to_string(::getpid()) + " " + node + "\n";
    if ((::fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR &&
        (::ftruncate(fd, 0) != 0 ||
         ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))) {
      const int err = errno;
      ::close(fd);
      Release();
      return PosixError("host slot lock " + path, err);
    }
    fds_.push_back(fd);
    paths_.push_back(path);
  }
  return Status::OK();
}

}  // namespace edl::jobclient
