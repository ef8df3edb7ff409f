// etcd's JSON gateway: the v3 API's protobuf messages as JSON (int64 fields as decimal strings,
// bytes fields base64, fields with default values left out). See jobserver/state/STATE.md
// "Backends".
#include "jobserver/state/etcd_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>

#include "edl/net/framed_socket.h"
#include "edl/proto/frame.h"

namespace edl::jobserver {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

namespace {

Status Bad(const std::string& what) {
  return Status::Corruption("etcd reply: " + what +
                            " (is the --state_store address an etcd v3 server?)");
}

// An int64 field as the gateway writes it (a decimal string) or as a JSON integer. Absent: 0.
Status Int64Field(const json& j, const char* name, int64_t* out) {
  *out = 0;
  const auto it = j.find(name);
  if (it == j.end()) return Status::OK();
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(std::string("field '") + name + "' is out of range");
    }
    *out = it->get<int64_t>();
    return Status::OK();
  }
  if (!it->is_string()) return Bad(std::string("field '") + name + "' is not an integer");
  const std::string& s = it->get_ref<const std::string&>();
  const bool neg = !s.empty() && s[0] == '-';
  if (s.size() < 1u + neg || s.size() > 19u + neg)
    return Bad(std::string("field '") + name + "' is not an int64");
  int64_t v = 0;
  for (size_t i = neg; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return Bad(std::string("field '") + name + "' is not an int64");
    if (v > (INT64_MAX - (s[i] - '0')) / 10)
      return Bad(std::string("field '") + name + "' is out of range");
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return Status::OK();
}

// A bytes field (base64). Absent: empty.
Status BytesField(const json& j, const char* name, size_t max, std::string* out) {
  out->clear();
  const auto it = j.find(name);
  if (it == j.end()) return Status::OK();
  if (!it->is_string()) return Bad(std::string("field '") + name + "' is not a base64 string");
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() / 4 * 3 > max)
    return Bad(std::string("field '") + name + "' is over " + std::to_string(max) + " bytes");
  Status st = DecodeBase64(s, out);
  return st.ok() ? st : Bad(std::string("field '") + name + "': " + st.message());
}

// A list field of objects. Absent: empty.
Status ObjectList(const json& j, const char* name, const json** out) {
  static const json kEmpty = json::array();
  *out = &kEmpty;
  const auto it = j.find(name);
  if (it == j.end()) return Status::OK();
  if (!it->is_array()) return Bad(std::string("field '") + name + "' is not a list");
  if (it->size() > kMaxEtcdItems)
    return Bad(std::string("field '") + name + "' has too many items");
  for (const json& x : *it) {
    if (!x.is_object()) return Bad(std::string("an item of '") + name + "' is not an object");
  }
  *out = &*it;
  return Status::OK();
}

json OpJson(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut: {
      json p = {{"key", EncodeBase64(op.key)}, {"value", EncodeBase64(op.value)}};
      if (op.lease != 0) p["lease"] = std::to_string(op.lease);
      return {{"request_put", p}};
    }
    case EtcdOp::Kind::kDelete:
      return {{"request_delete_range", {{"key", EncodeBase64(op.key)}}}};
    case EtcdOp::Kind::kRange:
      return {{"request_range", {{"key", EncodeBase64(op.key)}}}};
  }
  return {};
}

}  // namespace

Status ParseEtcdUrl(const std::string& spec, std::vector<EtcdEndpoint>* out) {
  out->clear();
  const std::string scheme = "etcd://";
  const auto bad = [&] {
    return Status::InvalidArgument(
        "--state_store '" + proto::Escape(spec) +
        "': expected etcd://HOST:PORT[,HOST:PORT...] (etcd's client URLs)");
  };
  if (spec.compare(0, scheme.size(), scheme) != 0 || spec.size() == scheme.size()) return bad();
  size_t pos = scheme.size();
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    EtcdEndpoint e;
    if (!net::ParseHostPort(spec.substr(pos, comma - pos), "--state_store", &e.host, &e.port)
             .ok() ||
        e.port <= 0 || out->size() >= 16) {
      return bad();
    }
    out->push_back(std::move(e));
    pos = comma + 1;
  }
  return Status::OK();
}

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string EncodeBase64(const std::string& in) {
  std::string out(beast::detail::base64::encoded_size(in.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), in.data(), in.size()));
  return out;
}

Status DecodeBase64(const std::string& in, std::string* out) {
  if (in.size() % 4 != 0)
    return Status::Corruption("base64 text of a length that is not a multiple of 4");
  size_t pad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '+' || c == '/';
    if (c == '=') {
      ++pad;
    } else if (!alpha || pad > 0) {
      return Status::Corruption(
          "base64 text with a character outside the alphabet or after padding");
    }
  }
  if (pad > 2) return Status::Corruption("base64 text with more than two padding characters");
  out->assign(beast::detail::base64::decoded_size(in.size()), '\0');
  const auto [written, read] = beast::detail::base64::decode(out->data(), in.data(), in.size());
  if (read != in.size() - pad && read != in.size())
    return Status::Corruption("base64 text that does not decode");
  out->resize(written);
  return Status::OK();
}

Status ParseEtcdReply(const std::string& body, size_t max_bytes, json* out) {
  if (body.size() > max_bytes)
    return Bad("reply of " + std::to_string(body.size()) + " bytes, over the limit");
  EDL_RETURN_IF_ERROR(proto::CheckJsonDepth(body.data(), body.size()).WithContext("etcd reply"));
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object())
    return Bad("not a JSON object: " + proto::Quote(body));
  const auto err = out->find("error");
  const auto msg = out->find("message");
  if (err != out->end() || (msg != out->end() && out->contains("code"))) {
    const json& m = err != out->end() ? *err : *msg;
    return Status::Unavailable("etcd refused the request: " +
                               (m.is_string() ? proto::Quote(*m.get_ptr<const std::string*>(), 200)
                                              : proto::QuoteJson(m)));
  }
  return Status::OK();
}

Status ParseRangeReply(const json& j, std::vector<EtcdKv>* out) {
  out->clear();
  const json* kvs = nullptr;
  EDL_RETURN_IF_ERROR(ObjectList(j, "kvs", &kvs));
  for (const json& x : *kvs) {
    EtcdKv kv;
    EDL_RETURN_IF_ERROR(BytesField(x, "key", kMaxEtcdKeyBytes, &kv.key));
    EDL_RETURN_IF_ERROR(BytesField(x, "value", size_t{128} << 20, &kv.value));
    EDL_RETURN_IF_ERROR(Int64Field(x, "create_revision", &kv.create_revision));
    EDL_RETURN_IF_ERROR(Int64Field(x, "mod_revision", &kv.mod_revision));
    EDL_RETURN_IF_ERROR(Int64Field(x, "lease", &kv.lease));
    if (kv.key.empty() || kv.create_revision < 0 || kv.mod_revision < kv.create_revision ||
        kv.lease < 0) {
      return Bad("a key-value pair with an empty key or revisions out of order");
    }
    out->push_back(std::move(kv));
  }
  return Status::OK();
}

Status ParseTxnReply(const json& j, bool* succeeded, std::vector<std::vector<EtcdKv>>* ranges) {
  *succeeded = false;
  ranges->clear();
  const auto s = j.find("succeeded");
  if (s != j.end()) {
    if (!s->is_boolean()) return Bad("field 'succeeded' is not a boolean");
    *succeeded = s->get<bool>();
  }
  const json* responses = nullptr;
  EDL_RETURN_IF_ERROR(ObjectList(j, "responses", &responses));
  for (const json& r : *responses) {
    ranges->emplace_back();
    const auto rr = r.find("response_range");
    if (rr == r.end()) continue;
    if (!rr->is_object()) return Bad("field 'response_range' is not an object");
    EDL_RETURN_IF_ERROR(ParseRangeReply(*rr, &ranges->back()));
  }
  return Status::OK();
}

Status ParseLeaseGrantReply(const json& j, int64_t* id, int64_t* ttl) {
  EDL_RETURN_IF_ERROR(Int64Field(j, "ID", id));
  EDL_RETURN_IF_ERROR(Int64Field(j, "TTL", ttl));
  if (*id <= 0 || *ttl <= 0) return Bad("lease grant without a lease id or TTL");
  return Status::OK();
}

Status ParseKeepAliveReply(const json& j, int64_t* ttl) {
  const json* r = &j;
  const auto res = j.find("result");
  if (res != j.end()) {
    if (!res->is_object()) return Bad("field 'result' is not an object");
    r = &*res;
  }
  return Int64Field(*r, "TTL", ttl);
}

// ---- the client

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {}

std::string EtcdClient::Describe() const {
  std::string s = "etcd://";
  for (size_t i = 0; i < options_.endpoints.size(); ++i) {
    s += (i ? "," : "") + options_.endpoints[i].host + ":" +
         std::to_string(options_.endpoints[i].port);
  }
  return s;
}

Status EtcdClient::PostTo(const EtcdEndpoint& e, const std::string& path, const std::string& body,
                          std::string* reply) {
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, e.host);
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(options_.max_reply_bytes);
  boost::system::error_code result = asio::error::would_block;
  const std::string where = e.host + ":" + std::to_string(e.port);
  stream.expires_after(options_.timeout);
  resolver.async_resolve(
      e.host, std::to_string(e.port), [&](boost::system::error_code ec, auto results) {
        if (ec) return void(result = ec);
        stream.async_connect(results, [&](boost::system::error_code ec2, const auto&) {
          if (ec2) return void(result = ec2);
          http::async_write(stream, req, [&](boost::system::error_code ec3, size_t) {
            if (ec3) return void(result = ec3);
            http::async_read(stream, buffer, parser,
                             [&](boost::system::error_code ec4, size_t) { result = ec4; });
          });
        });
      });
  // The stream's expiry bounds connect, write and read; the resolver gets the same deadline.
  if (io.run_for(options_.timeout + std::chrono::milliseconds(100)) == 0 ||
      result == asio::error::would_block) {
    io.stop();
  }
  if (result == asio::error::would_block || result == beast::error::timeout) {
    return Status::Timeout("etcd at " + where + " did not answer " + path + " within " +
                           std::to_string(options_.timeout.count()) + " ms");
  }
  if (result)
    return Status::Unavailable("etcd at " + where + " (" + path + "): " + result.message());
  const auto& res = parser.get();
  const unsigned status = res.result_int();
  *reply = res.body();
  if (status != 200) {
    json j;
    Status s = ParseEtcdReply(*reply, options_.max_reply_bytes, &j);
    return Status::Unavailable("etcd at " + where + " answered " + path + " with HTTP " +
                               std::to_string(status) +
                               (s.ok() ? std::string() : ": " + s.message()));
  }
  return Status::OK();
}

Status EtcdClient::Post(const std::string& path, const json& body, json* reply) {
  const std::string text = body.dump();
  Status last = Status::Unavailable("no etcd endpoint");
  for (size_t i = 0; i < options_.endpoints.size(); ++i) {
    const size_t k = (preferred_ + i) % options_.endpoints.size();
    std::string raw;
    last = PostTo(options_.endpoints[k], path, text, &raw);
    if (last.ok()) {
      preferred_ = k;
      return ParseEtcdReply(raw, options_.max_reply_bytes, reply);
    }
  }
  return last;
}

Status EtcdClient::Range(const std::string& key, const std::string& range_end,
                         std::vector<EtcdKv>* out) {
  json body = {{"key", EncodeBase64(key)}};
  if (!range_end.empty()) body["range_end"] = EncodeBase64(range_end);
  json reply;
  EDL_RETURN_IF_ERROR(Post("/v3/kv/range", body, &reply));
  return ParseRangeReply(reply, out);
}

Status EtcdClient::Txn(const std::vector<std::pair<std::string, int64_t>>& create_revision_equals,
                       const std::vector<EtcdOp>& success, const std::vector<EtcdOp>& failure,
                       bool* succeeded, std::vector<std::vector<EtcdKv>>* ranges) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& [key, rev] : create_revision_equals) {
    body["compare"].push_back({{"key", EncodeBase64(key)},
                               {"result", "EQUAL"},
                               {"target", "CREATE"},
                               {"create_revision", std::to_string(rev)}});
  }
  for (const EtcdOp& op : success) body["success"].push_back(OpJson(op));
  for (const EtcdOp& op : failure) body["failure"].push_back(OpJson(op));
  json reply;
  EDL_RETURN_IF_ERROR(Post("/v3/kv/txn", body, &reply));
  return ParseTxnReply(reply, succeeded, ranges);
}

Status EtcdClient::LeaseGrant(int64_t ttl_s, int64_t* id) {
  json reply;
  EDL_RETURN_IF_ERROR(Post("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}, &reply));
  int64_t ttl = 0;
  return ParseLeaseGrantReply(reply, id, &ttl);
}

Status EtcdClient::LeaseKeepAlive(int64_t id, int64_t* ttl) {
  json reply;
  EDL_RETURN_IF_ERROR(Post("/v3/lease/keepalive", {{"ID", std::to_string(id)}}, &reply));
  return ParseKeepAliveReply(reply, ttl);
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  json reply;
  return Post("/v3/lease/revoke", {{"ID", std::to_string(id)}}, &reply);
}

}  // namespace edl::jobserver
