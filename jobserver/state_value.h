// Reading one stored state value (jobserver/STATE.md "Values"): the bytes are hostile, so a value
// is parsed with a size bound and a format-version check, and every field is read through typed,
// range-checked readers that fail with Corruption naming the key, the field and the fix. Shared by
// the single-job layout (job_state.cc) and the cluster layout (cluster_state.cc).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "jobserver/job_state.h"

namespace edl::jobserver::state_value {

using nlohmann::json;

constexpr int64_t kMaxI64 = INT64_MAX;

inline std::string Fix(const std::string& key) {
  return " (state key '" + key + "'). The stored state is damaged or was written by another "
         "program: move it aside (the --state_dir directory, or the job's keys in etcd) and the server "
         "starts a new job, or restore it from a backup";
}

// Parses `value` as a JSON object of format version 1..`newest` (*version: the one it has).
inline Status ParseValue(const std::string& key, const std::string& value, json* out,
                         int newest = kStateFormatVersion, int* version = nullptr) {
  if (value.size() > kMaxStateValueBytes) {
    return Status::Corruption("stored value is " + std::to_string(value.size()) + " bytes, over the " +
                              std::to_string(kMaxStateValueBytes) + " limit" + Fix(key));
  }
  *out = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    return Status::Corruption("stored value is not a JSON object (truncated?)" + Fix(key));
  }
  const auto v = out->find("v");
  if (v == out->end() || !v->is_number_integer()) {
    return Status::Corruption("stored value has no format version 'v'" + Fix(key));
  }
  if (v->get<int64_t>() < 1 || v->get<int64_t>() > newest) {
    return Status::FailedPrecondition(
        "state key '" + key + "' has format version " + v->dump() + "; this edl server reads version" +
        (newest > 1 ? "s 1.." : " ") + std::to_string(newest) + ". Run the edl version that wrote it, or move "
        "the state aside to start anew");
  }
  if (version != nullptr) *version = static_cast<int>(v->get<int64_t>());
  return Status::OK();
}

// Typed field readers that fail with Corruption naming the key and field.
class Reader {
 public:
  Reader(const json& j, const std::string& key) : j_(j), key_(key) {}
  template <typename T>
  Reader& Int(const char* f, T* out, int64_t lo, int64_t hi) {
    const auto it = j_.find(f);
    if (!ok()) return *this;
    if (it == j_.end() || !it->is_number_integer()) return Fail(f, "is missing or not an integer");
    const int64_t x = it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxI64)
                          ? -1
                          : it->get<int64_t>();
    if (x < lo || x > hi) return Fail(f, "is out of range");
    *out = static_cast<T>(x);
    return *this;
  }
  Reader& Bool(const char* f, bool* out) {
    const auto it = j_.find(f);
    if (!ok()) return *this;
    if (it == j_.end() || !it->is_boolean()) return Fail(f, "is missing or not a boolean");
    *out = it->get<bool>();
    return *this;
  }
  Reader& Str(const char* f, std::string* out, size_t max) {
    const auto it = j_.find(f);
    if (!ok()) return *this;
    if (it == j_.end() || !it->is_string()) return Fail(f, "is missing or not a string");
    if (it->get_ref<const std::string&>().size() > max) return Fail(f, "is too long");
    *out = it->get<std::string>();
    return *this;
  }
  Reader& Fail(const char* f, const std::string& why) {
    if (ok()) status_ = Status::Corruption(std::string("stored field '") + f + "' " + why + Fix(key_));
    return *this;
  }
  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

 private:
  const json& j_;
  const std::string& key_;
  Status status_;
};

}  // namespace edl::jobserver::state_value
