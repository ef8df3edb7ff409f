#include "edl/proto/service_messages.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_set>

#include "edl/proto/fields.h"
#include "edl/proto/frame.h"

namespace edl::proto {

using internal::Fields;
using internal::GetInt;
using nlohmann::json;

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// 16 lowercase hex digits -> *out.
bool ParseHex64(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

// ---- service_stats

void ServiceStats::EncodeTo(json* j) const {
  *j = {{"type", msg::kServiceStats},
        {"requests", requests},
        {"samples", samples},
        {"period_s", period_s},
        {"latency_ms", latency_ms}};
}
Status ServiceStats::DecodeFrom(const json& j) {
  ServiceStats s;
  Fields f(j, msg::kServiceStats);
  f.Int("requests", &s.requests, 0, kMaxInt64)
      .Int("samples", &s.samples, 0, kMaxInt64)
      .Num("period_s", &s.period_s)
      .Num("latency_ms", &s.latency_ms);
  if (f.ok() && (s.period_s < 0 || s.latency_ms < 0))
    f.Fail("period_s", "or 'latency_ms' is negative");
  if (!f.ok()) return f.status();
  *this = s;
  return Status::OK();
}

// ---- service_members

void ServiceMembers::EncodeTo(json* j) const {
  json a = json::array();
  for (const ServiceMember& m : members) a.push_back(json::array({m.name, m.host, m.port}));
  *j = {{"type", msg::kServiceMembers},
        {"service", service},
        {"members", std::move(a)},
        {"known", known}};
}
Status ServiceMembers::DecodeFrom(const json& j) {
  ServiceMembers s;
  const json* a = nullptr;
  Fields f(j, msg::kServiceMembers);
  f.Name("service", &s.service).Arr("members", &a).NameList("known", &s.known);
  if (f.ok() && (a->size() > kMaxServiceMembers || s.known.size() > kMaxServiceMembers)) {
    f.Fail("members", "or 'known' has more than " + std::to_string(kMaxServiceMembers) + " items");
  }
  if (!f.ok()) return f.status();
  std::unordered_set<std::string> seen;
  for (const json& e : *a) {
    int64_t port = 0;
    if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_string() ||
        !IsValidName(e[0].get_ref<const std::string&>()) ||
        !IsValidHost(e[1].get_ref<const std::string&>()) || !GetInt(e[2], 1, 65535, &port) ||
        !seen.insert(e[0].get<std::string>()).second) {
      return Status::Corruption("message 'service_members' holds a member " + QuoteJson(e) +
                                " that is not a distinct [name, host, port]");
    }
    s.members.push_back({e[0].get<std::string>(), e[1].get<std::string>(), static_cast<int>(port)});
  }
  *this = std::move(s);
  return Status::OK();
}

// ---- teacher_request

void TeacherRequest::EncodeTo(json* j) const {
  *j = {{"type", msg::kTeacherRequest},
        {"req_id", req_id},
        {"indices", indices},
        {"aug_seed", Hex64(aug_seed)},
        {"random_crop", random_crop},
        {"pad", pad},
        {"flip", flip},
        {"top_k", top_k}};
}
Status TeacherRequest::DecodeFrom(const json& j) {
  TeacherRequest r;
  const json* a = nullptr;
  std::string seed;
  Fields f(j, msg::kTeacherRequest);
  f.Int("req_id", &r.req_id, 0, kMaxInt64)
      .Arr("indices", &a)
      .Str("aug_seed", &seed, 16)
      .Bool("random_crop", &r.random_crop)
      .Int("pad", &r.pad, 0, 64)
      .Bool("flip", &r.flip)
      .Int("top_k", &r.top_k, 0, kMaxTeacherClasses);
  if (f.ok() && !ParseHex64(seed, &r.aug_seed))
    f.Fail("aug_seed", "is not 16 lowercase hex digits");
  if (f.ok() && (a->empty() || a->size() > kMaxTeacherBatch)) {
    f.Fail("indices", "must hold 1 .. " + std::to_string(kMaxTeacherBatch) + " items");
  }
  if (!f.ok()) return f.status();
  r.indices.reserve(a->size());
  for (const json& e : *a) {
    int64_t i = 0;
    if (!GetInt(e, 0, kMaxInt64, &i)) {
      return Status::Corruption("message 'teacher_request' field 'indices' holds " + QuoteJson(e) +
                                ", not a sample index");
    }
    r.indices.push_back(i);
  }
  *this = std::move(r);
  return Status::OK();
}

// ---- teacher_reply

void TeacherReply::EncodeTo(json* j) const {
  *j = {{"type", msg::kTeacherReply},
        {"req_id", req_id},
        {"code", Status::CodeName(status.code())},
        {"message", status.message()},
        {"classes", classes},
        {"rows", rows},
        {"k", k},
        {"values", values}};
  if (!classes_of.empty()) (*j)["classes_of"] = classes_of;
}
Status TeacherReply::DecodeFrom(const json& j) {
  TeacherReply r;
  std::string code, message;
  const json* v = nullptr;
  Fields f(j, msg::kTeacherReply);
  f.Int("req_id", &r.req_id, 0, kMaxInt64)
      .Str("code", &code, 32)
      .Str("message", &message, 4096)
      .Int("classes", &r.classes, 0, kMaxTeacherClasses)
      .Int("rows", &r.rows, 0, static_cast<int64_t>(kMaxTeacherBatch))
      .Int("k", &r.k, 0, kMaxTeacherClasses)
      .Arr("values", &v);
  if (!f.ok()) return f.status();
  r.status = StatusFromWire(code, message);  // the peer's text: escape before logging it
  const size_t n = static_cast<size_t>(r.rows) * static_cast<size_t>(r.k);
  if (n > kMaxTeacherValues || v->size() != n) {
    return Status::Corruption(
        "message 'teacher_reply' field 'values' holds " + std::to_string(v->size()) +
        " values, not rows x k = " + std::to_string(r.rows) + " x " + std::to_string(r.k) +
        " (at most " + std::to_string(kMaxTeacherValues) + ")");
  }
  if (r.k > r.classes) {
    return Status::Corruption("message 'teacher_reply' has k = " + std::to_string(r.k) +
                              " values per row but only " + std::to_string(r.classes) + " classes");
  }
  r.values.reserve(n);
  for (const json& e : *v) {
    // Range-checked as a double first: converting an out-of-range double to float is undefined.
    const double d = e.is_number() ? e.get<double>() : std::numeric_limits<double>::infinity();
    const float x = std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max()
                        ? static_cast<float>(d)
                        : std::numeric_limits<float>::infinity();
    if (!std::isfinite(x)) {
      return Status::Corruption("message 'teacher_reply' field 'values' holds " + QuoteJson(e) +
                                ", not a finite fp32 number");
    }
    r.values.push_back(x);
  }
  const auto c = j.find("classes_of");
  if (c != j.end()) {
    if (!c->is_array() || c->size() != n) {
      return Status::Corruption(
          "message 'teacher_reply' field 'classes_of' is not a list of rows x k classes");
    }
    r.classes_of.reserve(n);
    for (const json& e : *c) {
      int64_t k = 0;
      if (!GetInt(e, 0, r.classes - 1, &k)) {
        return Status::Corruption("message 'teacher_reply' field 'classes_of' holds " +
                                  QuoteJson(e) + ", not a class in [0, " +
                                  std::to_string(r.classes) + ")");
      }
      r.classes_of.push_back(static_cast<int32_t>(k));
    }
  }
  *this = std::move(r);
  return Status::OK();
}

// ---- teacher_cancel

void TeacherCancel::EncodeTo(json* j) const {
  *j = {{"type", msg::kTeacherCancel}, {"req_id", req_id}};
}
Status TeacherCancel::DecodeFrom(const json& j) {
  TeacherCancel c;
  Fields f(j, msg::kTeacherCancel);
  int64_t id = 0;
  f.Int("req_id", &id, 0, kMaxInt64);
  if (!f.ok()) return f.status();
  c.req_id = static_cast<uint64_t>(id);
  *this = c;
  return Status::OK();
}

// ---- service_watch

void ServiceWatch::EncodeTo(json* j) const {
  *j = {{"type", msg::kServiceWatch}, {"service", service}};
}
Status ServiceWatch::DecodeFrom(const json& j) {
  ServiceWatch w;
  Fields f(j, msg::kServiceWatch);
  f.Name("service", &w.service);
  if (!f.ok()) return f.status();
  *this = std::move(w);
  return Status::OK();
}

// ---- teacher_start / teacher_stop / teacher_exit

void TeacherOrder::EncodeTo(json* j) const {
  *j = {{"type", NameOf(type)}, {"service", service}, {"name", name}};
  if (type == TeacherOrderType::kExit) (*j)["why"] = why;
}
Status TeacherOrder::DecodeFrom(const json& j) {
  TeacherOrder o;
  const auto t = j.find("type");
  if (t == j.end() || !t->is_string()) return Status::Corruption("teacher order: no 'type'");
  if (!kTeacherOrderNames.Parse(t->get_ref<const std::string&>(), &o.type)) {
    return Status::Corruption("teacher order: type " + Quote(t->get<std::string>()) + " is not " +
                              kTeacherOrderNames.List(""));
  }
  Fields f(j, NameOf(o.type));
  f.Name("service", &o.service).Name("name", &o.name);
  if (o.type == TeacherOrderType::kExit) f.Str("why", &o.why, kMaxTeacherWhyBytes);
  if (f.ok()) {
    for (char c : o.why) {
      if (c < 0x20 || c > 0x7e) {
        f.Fail("why", "holds a byte that is not printable ASCII");
        break;
      }
    }
  }
  if (!f.ok()) return f.status();
  *this = std::move(o);
  return Status::OK();
}

}  // namespace edl::proto
