// EtcdClient: the few etcd v3 calls `edl server --state_store etcd://...` needs
// (jobserver/state/STATE.md, "Backends"), through etcd's own JSON gateway (HTTP POST /v3/kv/range,
// /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values base64) over
// Boost.Beast. Every call has a deadline and a bounded reply; replies are parsed as hostile bytes
// (size, nesting, field types and ranges). The endpoints are tried in order; the one that answered
// last is tried first next time.
//
// Thread-safety: none; one client per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"

namespace edl::jobserver {

struct EtcdEndpoint {
  std::string host;
  int port = 0;
};

// Parses "etcd://HOST:PORT[,HOST:PORT...]". InvalidArgument naming the form otherwise.
Status ParseEtcdUrl(const std::string& spec, std::vector<EtcdEndpoint>* out);

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

// One operation of a transaction.
struct EtcdOp {
  enum class Kind { kPut, kDelete, kRange } kind = Kind::kPut;
  std::string key, value;
  int64_t lease = 0;  // put: attach to this lease (0: none)
};

struct EtcdClientOptions {
  std::vector<EtcdEndpoint> endpoints;
  std::chrono::milliseconds timeout{2000};     // one request, connect to reply, per endpoint
  size_t max_reply_bytes = size_t{160} << 20;  // a whole HTTP reply (body and headers)
};

// Largest key accepted in a reply (etcd allows 1.5 MiB requests by default; ours are short).
constexpr size_t kMaxEtcdKeyBytes = 4096;
// Most key-value pairs or transaction responses accepted in one reply.
constexpr size_t kMaxEtcdItems = 100000;

// ---- reply parsing (exposed for tests). Every function treats its input as hostile: Corruption
// naming the field for a wrong type, a bad base64 text, a number out of range or too many items.

// The body of an HTTP reply: at most `max_bytes`, nested at most 32 deep, a JSON object. An
// object with "error" or "code"/"message" (the gateway's error form) is Unavailable quoting it.
Status ParseEtcdReply(const std::string& body, size_t max_bytes, nlohmann::json* out);
// The "kvs" of a range reply (absent: none).
Status ParseRangeReply(const nlohmann::json& j, std::vector<EtcdKv>* out);
// "succeeded" (absent: false) and, per response that is a response_range, its kvs (other
// responses give an empty list at their position).
Status ParseTxnReply(const nlohmann::json& j, bool* succeeded,
                     std::vector<std::vector<EtcdKv>>* ranges);
Status ParseLeaseGrantReply(const nlohmann::json& j, int64_t* id, int64_t* ttl);
// The TTL left after a keepalive (0 or less: the lease is gone). Accepts the stream form
// {"result": {...}} as well as the bare one.
Status ParseKeepAliveReply(const nlohmann::json& j, int64_t* ttl);
// Strict base64 (RFC 4648 alphabet, '=' padding only at the end, length a multiple of 4).
Status DecodeBase64(const std::string& in, std::string* out);
std::string EncodeBase64(const std::string& in);

class EtcdClient {
 public:
  explicit EtcdClient(EtcdClientOptions options);

  // Key `key` alone (range_end empty) or [key, range_end).
  Status Range(const std::string& key, const std::string& range_end, std::vector<EtcdKv>* out);
  // If every compare holds (key's create_revision == the given value; 0: the key is absent),
  // applies `success`, else `failure`; *ranges as ParseTxnReply.
  Status Txn(const std::vector<std::pair<std::string, int64_t>>& create_revision_equals,
             const std::vector<EtcdOp>& success, const std::vector<EtcdOp>& failure,
             bool* succeeded, std::vector<std::vector<EtcdKv>>* ranges);
  Status LeaseGrant(int64_t ttl_s, int64_t* id);
  // *ttl: seconds left (0 or less: the lease has expired or was revoked).
  Status LeaseKeepAlive(int64_t id, int64_t* ttl);
  Status LeaseRevoke(int64_t id);

  // One POST of `body` to `path`, trying each endpoint; the parsed reply object.
  Status Post(const std::string& path, const nlohmann::json& body, nlohmann::json* reply);
  std::string Describe() const;  // "etcd://h:p,h:p" for messages

 private:
  Status PostTo(const EtcdEndpoint& e, const std::string& path, const std::string& body,
                std::string* reply);

  EtcdClientOptions options_;
  size_t preferred_ = 0;
};

// The prefix end of `prefix` for a range over every key starting with it (etcd's convention).
std::string EtcdPrefixEnd(const std::string& prefix);

}  // namespace edl::jobserver
