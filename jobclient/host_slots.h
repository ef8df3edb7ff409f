// HostSlotClaim: one edl client per machine and server, checked by the client itself before it
// contacts anybody. A client that advertises a non-loopback host takes an exclusive lock per slot
// it offers, in a file of the machine's lock directory named by the server, the advertised host,
// the network namespace (the host's address names a machine within one) and the slot; a second
// client on the machine offering one of those slots to the same server is refused at once with the
// holder's node and pid and the fix (proto::kOneClientPerMachineFix), the same rule the server's
// node registry applies to the nodes that reach it. A holder of the same node name is that node's
// previous client on its way out (a restart): waited for, 15 s. Loopback is the one-machine setup
// (several nodes on this machine on purpose) and claims nothing. The kernel drops the locks when
// the process ends, SIGKILL included; the files go with a clean release.
//
// Thread-safety: none (taken once at start, released at exit).
#pragma once

#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::jobclient {

// The machine-wide directory of the claims (every user's clients see each other's).
inline constexpr char kHostLockDir[] = "/tmp";

class HostSlotClaim {
 public:
  HostSlotClaim() = default;
  ~HostSlotClaim();  // releases every slot
  HostSlotClaim(const HostSlotClaim&) = delete;
  HostSlotClaim& operator=(const HostSlotClaim&) = delete;

  // Claims `slots` of `host` for the server `server` ("HOST:PORT") under `lock_dir`, writing
  // "<pid> <node>" into each file. AlreadyExists naming the holder and the fix when another
  // client holds one (nothing is kept); IOError when the directory cannot hold the files.
  // Nothing is claimed (OK) when `host` is loopback.
  Status Claim(const std::string& lock_dir, const std::string& server, const std::string& host,
               const std::vector<int>& slots, const std::string& node);
  // The lock files held (tests).
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  void Release();

  std::vector<std::string> paths_;
  std::vector<int> fds_;
};

}  // namespace edl::jobclient
