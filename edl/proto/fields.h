// The one reader of hostile JSON objects: the message codecs (messages.cc, service_messages.cc,
// trainer_events.cc), the job server's stored state (jobserver/state/state_value.h) and `edl ctl`'s
// reading of replies (FieldOf, NumOr, BoolOr, StrOr below, for their free-form bodies). A
// Fields reader checks one object's fields in turn (presence, type, range, length, name and host
// characters); the first error sticks and is Corruption naming the subject ("message 'hello'",
// "stored"), the field and the problem, plus a suffix (the stored key and the fix).
//
// Thread-safety: a Fields object is used by one thread; GetInt is pure.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/proto/frame.h"
#include "edl/proto/messages.h"

namespace edl::proto {

using nlohmann::json;

// *out = v when v is an integer in [lo, hi] (unsigned values above INT64_MAX are out of range).
inline bool GetInt(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer()) return false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) return false;
  *out = x;
  return true;
}

class Fields {
 public:
  // Fields of message `what` (its type): errors read "message '<what>' field '<key>' <why>".
  Fields(const json& j, const char* what)
      : Fields(j, "message '" + std::string(what) + "'", std::string()) {}
  // Fields of `subject`: errors read "<subject> field '<key>' <why><suffix>".
  Fields(const json& j, std::string subject, std::string suffix)
      : j_(j), subject_(std::move(subject)), suffix_(std::move(suffix)) {
    if (!j.is_object()) Fail("", "is not a JSON object");
  }

  Fields& Str(const char* key, std::string* out, size_t max_len = kMaxNameBytes,
              bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_string()) return Fail(key, "is not a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max_len)
      return Fail(key, "is longer than " + std::to_string(max_len) + " bytes");
    *out = s;
    return *this;
  }
  Fields& Host(const char* key, std::string* out, bool required = true) {
    std::string s;
    Str(key, &s, kMaxHostBytes, required);
    if (ok() && (required || !s.empty()) && j_.contains(key) && !IsValidHost(s)) {
      return Fail(key, Quote(s) + " is not a host name or IP address");
    }
    if (ok()) *out = s;
    return *this;
  }
  Fields& Name(const char* key, std::string* out, bool required = true) {
    std::string s;
    Str(key, &s, kMaxNameBytes, required);
    if (ok() && (required || !s.empty()) && j_.contains(key) && !IsValidName(s)) {
      return Fail(key, Quote(s) + " is not a valid name (use letters, digits, '.', '_', '-')");
    }
    if (ok()) *out = s;
    return *this;
  }
  template <typename T>
  Fields& Int(const char* key, T* out, int64_t lo, int64_t hi, bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_number_integer()) return Fail(key, "is not an integer");
    int64_t x = 0;
    if (!GetInt(*v, lo, hi, &x)) return Range(key, lo, hi);
    *out = static_cast<T>(x);
    return *this;
  }
  Fields& Bool(const char* key, bool* out, bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_boolean()) return Fail(key, "is not a boolean");
    *out = v->get<bool>();
    return *this;
  }
  Fields& Num(const char* key, double* out, bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_number()) return Fail(key, "is not a number");
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Fail(key, "is not finite");
    *out = d;
    return *this;
  }
  Fields& Obj(const char* key, json* out, bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_object()) return Fail(key, "is not an object");
    *out = *v;
    return *this;
  }
  Fields& Arr(const char* key, const json** out, bool required = true) {
    const json* v = Get(key, required);
    if (v == nullptr) return *this;
    if (!v->is_array()) return Fail(key, "is not an array");
    if (v->size() > kMaxListItems) return Fail(key, "has too many items");
    *out = v;
    return *this;
  }
  Fields& NameList(const char* key, std::vector<std::string>* out, bool required = true) {
    const json* a = nullptr;
    Arr(key, &a, required);
    if (a == nullptr || !ok()) return *this;
    out->clear();
    for (const json& e : *a) {
      if (!e.is_string() || !IsValidName(e.get_ref<const std::string&>())) {
        return Fail(key, "holds an item that is not a valid name");
      }
      out->push_back(e.get<std::string>());
    }
    return *this;
  }
  Fields& Fail(const std::string& key, const std::string& why) {
    if (status_.ok()) {
      status_ = Status::Corruption(subject_ + (key.empty() ? "" : " field '" + key + "'") + " " +
                                   why + suffix_);
    }
    return *this;
  }
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

 private:
  const json* Get(const char* key, bool required) {
    if (!ok()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      if (required) Fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  Fields& Range(const char* key, int64_t lo, int64_t hi) {
    return Fail(key, "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }

  const json& j_;
  const std::string subject_, suffix_;
  Status status_;
};

// ---- reading JSON that no decoder typed: the free-form status body of a server's reply, a
// record this process built. Never throws: a missing key, a value of another type or a `j` that
// is not an object reads as the default.

// The value of `key`, or a null value.
inline const json& FieldOf(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}
// The value of `key` as a T (json, bool, std::string, an integer type in its range, or a
// floating type, finite), or `def`.
template <typename T>
T FieldOr(const json& j, const char* key, T def) {
  const json& v = FieldOf(j, key);
  if constexpr (std::is_same_v<T, json>) {
    return v.is_null() ? def : v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? v.template get<bool>() : def;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string() ? v.template get<std::string>() : def;
  } else if constexpr (std::is_integral_v<T>) {
    int64_t x = 0;
    return GetInt(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), &x)
               ? static_cast<T>(x)
               : def;
  } else {
    static_assert(std::is_floating_point_v<T>, "FieldOr reads json, bool, strings and numbers");
    if (!v.is_number()) return def;
    const T x = v.template get<T>();
    return std::isfinite(x) ? x : def;
  }
}
inline double NumOr(const json& j, const char* key, double def = 0) { return FieldOr(j, key, def); }
inline bool BoolOr(const json& j, const char* key, bool def = false) {
  return FieldOr(j, key, def);
}
inline std::string StrOr(const json& j, const char* key, const std::string& def = "") {
  return FieldOr(j, key, def);
}

namespace internal {  // the codecs' historical spelling
using proto::Fields;
using proto::GetInt;
}  // namespace internal

}  // namespace edl::proto
