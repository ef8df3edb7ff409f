// The job's state in etcd, with leader election (jobserver/state/STATE.md "Backends" and "Standby
// servers"): `edl server --state_store etcd://...` keeps the same keys and values as the RocksDB
// backend in etcd, and several servers of one job elect one leader through an etcd lease.
//
// Election: the leader holds the key "leader/<job_id>", created in a transaction that succeeds only
// while the key is absent and attached to a lease of --lease_ttl_s seconds that the leader keeps
// alive. Standbys poll the key and try again once it is gone (the leader's lease ended: it died,
// hung, or resigned). Fencing: every state write is a transaction that compares the leader key's
// create_revision with the one this server created, so a deposed leader's writes fail even if it
// has not noticed yet.
//
// Thread-safety: the backend is used from one thread (the server's); it renews its lease from a
// thread of its own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "edl/base/status.h"
#include "jobserver/state/etcd_client.h"
#include "jobserver/state/job_state.h"

namespace edl::jobserver {

struct EtcdStateOptions {
  std::string url;  // --state_store, "etcd://HOST:PORT[,HOST:PORT...]"
  std::string job_id;
  int64_t lease_ttl_s = 5;     // --lease_ttl_s
  std::string self;            // this server's address, stored as the leader key's value (for logs)
  std::function<bool()> stop;  // polled while waiting as a standby: true ends the wait (Aborted)
};

// The leader key of `job_id`.
std::string EtcdLeaderKey(const std::string& job_id);

// Blocks until this server leads job o.job_id (logging who leads while it waits), then returns a
// backend whose writes are fenced by the leader key and that keeps the lease alive. `on_lost` is
// called once, from the renewal thread, when the lease is gone or could not be renewed within its
// TTL; the backend's writes fail from then on. Destroying the backend revokes the lease, so a
// standby takes over at once after a clean stop. Unavailable naming the endpoints when etcd cannot
// be reached on the first try.
Status BecomeEtcdLeader(const EtcdStateOptions& o, std::function<void(const Status&)> on_lost,
                        std::unique_ptr<StateBackend>* out);

}  // namespace edl::jobserver
