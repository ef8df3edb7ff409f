#include "jobserver/state/etcd_state.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <thread>

#include <glog/logging.h>

#include "edl/base/thread_annotations.h"
#include "edl/proto/frame.h"

namespace edl::jobserver {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

EtcdClientOptions ClientOptions(const std::vector<EtcdEndpoint>& endpoints, int64_t ttl_s) {
  EtcdClientOptions c;
  c.endpoints = endpoints;
  // A renewal must fit well inside the TTL, with room for a second endpoint.
  c.timeout = milliseconds(std::clamp<int64_t>(ttl_s * 1000 / 4, 200, 2000));
  return c;
}

class EtcdBackend : public StateBackend {
 public:
  EtcdBackend(const std::vector<EtcdEndpoint>& endpoints, const EtcdStateOptions& o, int64_t lease,
              int64_t leader_revision, std::function<void(const Status&)> on_lost)
      : client_(ClientOptions(endpoints, o.lease_ttl_s)),
        renew_client_(ClientOptions(endpoints, o.lease_ttl_s)),
        key_(EtcdLeaderKey(o.job_id)),
        ttl_(std::chrono::seconds(o.lease_ttl_s)),
        lease_(lease),
        revision_(leader_revision),
        on_lost_(std::move(on_lost)) {
    renewer_ = std::thread([this] { Renew(); });
  }

  ~EtcdBackend() override {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    renewer_.join();
    if (!lost_) {
      Status s = renew_client_.LeaseRevoke(lease_);
      LOG_IF(WARNING, !s.ok()) << "resigning the leadership (revoking lease " << lease_
                               << "): " << s.ToString()
                               << "; a standby takes over when the lease ends";
    }
  }

  Status Get(const std::string& key, std::string* value, bool* found) override {
    std::vector<EtcdKv> kvs;
    EDL_RETURN_IF_ERROR(
        client_.Range(key, "", &kvs).WithContext("reading " + key + " from " + Describe()));
    *found = !kvs.empty();
    if (*found) *value = std::move(kvs[0].value);
    return Status::OK();
  }

  Status Scan(const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>* out) override {
    std::vector<EtcdKv> kvs;
    EDL_RETURN_IF_ERROR(client_.Range(prefix, EtcdPrefixEnd(prefix), &kvs)
                            .WithContext("scanning " + prefix + " in " + Describe()));
    out->clear();
    for (EtcdKv& kv : kvs) {
      if (kv.key.compare(0, prefix.size(), prefix) != 0) {
        return Status::Corruption("etcd returned key " + proto::Quote(kv.key) +
                                  " outside the range " + prefix);
      }
      out->emplace_back(std::move(kv.key), std::move(kv.value));
    }
    return Status::OK();
  }

  Status Write(const std::map<std::string, std::string>& puts,
               const std::vector<std::string>& deletes) override {
    if (lost_) return Lost("its lease is gone");
    std::vector<EtcdOp> ops;
    for (const std::string& key : deletes) ops.push_back({EtcdOp::Kind::kDelete, key, "", 0});
    for (const auto& [key, value] : puts) ops.push_back({EtcdOp::Kind::kPut, key, value, 0});
    bool ok = false;
    std::vector<std::vector<EtcdKv>> ranges;
    EDL_RETURN_IF_ERROR(client_.Txn({{key_, revision_}}, ops, {}, &ok, &ranges)
                            .WithContext("writing the job state to " + Describe()));
    if (!ok) {
      lost_ = true;
      return Lost("the leader key " + key_ +
                  " is no longer the one it created (another server leads)");
    }
    return Status::OK();
  }

  std::string Describe() const override { return "--state_store " + client_.Describe(); }

 private:
  Status Lost(const std::string& why) const {
    return Status::FailedPrecondition("this edl server is no longer the leader: " + why +
                                      "; it stops without writing (fail-stop)");
  }

  // Renews the lease every TTL/3 until stopped; reports a lost lease once.
  void Renew() {
    auto last_ok = SteadyClock::now();
    MutexLock l(&mu_);
    while (!stop_) {
      cv_.wait_for(l.native(), ttl_ / 3, [this]() REQUIRES(mu_) { return stop_; });
      if (stop_) break;
      l.Unlock();
      const auto sent = SteadyClock::now();
      int64_t left = 0;
      Status s = renew_client_.LeaseKeepAlive(lease_, &left);
      Status lost;
      if (s.ok() && left > 0) {
        last_ok = sent;
      } else if (s.ok()) {
        lost = Status::FailedPrecondition("etcd says lease " + std::to_string(lease_) +
                                          " of the leader key " + key_ +
                                          " has expired or was revoked");
      } else if (SteadyClock::now() - last_ok >= ttl_) {
        lost = s.WithContext("the leader lease could not be renewed within its TTL of " +
                             std::to_string(ttl_.count()) + " s");
      } else {
        LOG(WARNING) << "renewing the leader lease: " << s.ToString() << " (retrying)";
      }
      if (!lost.ok()) {
        lost_ = true;
        on_lost_(lost);
        return;
      }
      l.Lock();
    }
  }

  EtcdClient client_;        // the server thread's
  EtcdClient renew_client_;  // the renewal thread's (and the destructor's, after it joined)
  const std::string key_;
  const std::chrono::seconds ttl_;
  const int64_t lease_, revision_;
  const std::function<void(const Status&)> on_lost_;
  std::atomic<bool> lost_{false};
  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread renewer_;
};

}  // namespace

std::string EtcdLeaderKey(const std::string& job_id) { return "leader/" + job_id; }

Status BecomeEtcdLeader(const EtcdStateOptions& o, std::function<void(const Status&)> on_lost,
                        std::unique_ptr<StateBackend>* out) {
  std::vector<EtcdEndpoint> endpoints;
  EDL_RETURN_IF_ERROR(ParseEtcdUrl(o.url, &endpoints));
  if (o.lease_ttl_s < 1 || o.lease_ttl_s > 3600)
    return Status::InvalidArgument("--lease_ttl_s must be in 1..3600");
  EtcdClient c(ClientOptions(endpoints, o.lease_ttl_s));
  const std::string key = EtcdLeaderKey(o.job_id);
  const auto poll = milliseconds(std::clamp<int64_t>(o.lease_ttl_s * 1000 / 5, 100, 1000));
  bool first = true;
  std::string seen_leader;
  for (;; first = false, std::this_thread::sleep_for(poll)) {
    if (o.stop && o.stop()) return Status::Aborted("stopped while a standby for job " + o.job_id);
    std::vector<EtcdKv> kvs;
    Status s = c.Range(key, "", &kvs);
    if (!s.ok()) {
      if (first) {
        return s.WithContext("cannot reach etcd at " + c.Describe() +
                             " (--state_store); is etcd running there?");
      }
      LOG_EVERY_N(WARNING, 20) << "standby for job " << o.job_id << ": " << s.ToString()
                               << " (retrying)";
      continue;
    }
    if (kvs.empty()) {
      int64_t lease = 0;
      s = c.LeaseGrant(o.lease_ttl_s, &lease);
      bool won = false;
      std::vector<std::vector<EtcdKv>> ranges;
      if (s.ok()) {
        s = c.Txn({{key, 0}},
                  {{EtcdOp::Kind::kPut, key, o.self, lease}, {EtcdOp::Kind::kRange, key, "", 0}},
                  {{EtcdOp::Kind::kRange, key, "", 0}}, &won, &ranges);
      }
      if (s.ok() && won) {
        if (ranges.size() != 2 || ranges[1].size() != 1 || ranges[1][0].lease != lease ||
            ranges[1][0].create_revision <= 0) {
          return Status::Corruption(
              "etcd's reply to the leader election does not hold the key it created");
        }
        LOG(INFO) << "edl server " << o.self << " leads job " << o.job_id << " (leader key " << key
                  << " at revision " << ranges[1][0].create_revision << ", lease " << lease
                  << ", TTL " << o.lease_ttl_s << " s, " << c.Describe() << ")";
        *out = std::make_unique<EtcdBackend>(endpoints, o, lease, ranges[1][0].create_revision,
                                             std::move(on_lost));
        return Status::OK();
      }
      if (lease != 0) (void)c.LeaseRevoke(lease);  // best effort: it expires within its TTL anyway
      if (!s.ok()) {
        LOG_EVERY_N(WARNING, 20) << "standby for job " << o.job_id << ": " << s.ToString()
                                 << " (retrying)";
        continue;
      }
      if (ranges.size() == 1) kvs = ranges[0];
    }
    if (!kvs.empty() && kvs[0].value != seen_leader) {
      seen_leader = kvs[0].value;
      LOG(INFO) << "standby for job " << o.job_id << ": the leader is "
                << proto::Quote(seen_leader, 200) << "; this server takes over when its lease ("
                << key << " in " << c.Describe() << ") ends. Not listening until then";
    }
  }
}

}  // namespace edl::jobserver
