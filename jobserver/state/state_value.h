// Reading one stored state value (jobserver/state/STATE.md "Values"): the bytes are hostile, so a
// value is parsed with a size bound and a format-version check, and every field is read through the
// typed, range-checked reader of edl/proto/fields.h, failing with Corruption naming the key, the
// field and the fix. Shared by the value encodings (job_state.cc, service_state.cc) and the
// layout (cluster_state.cc).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/proto/fields.h"
#include "jobserver/state/job_state.h"

namespace edl::jobserver::state_value {

using nlohmann::json;

constexpr int64_t kMaxI64 = INT64_MAX;

inline std::string Fix(const std::string& key) {
  return " (state key '" + key +
         "'). The stored state is damaged or was written by another "
         "program: move it aside (the --state_dir directory, or the job's keys in etcd) and the "
         "server "
         "starts a new job, or restore it from a backup";
}

// Parses `value` as a JSON object of format version 1..`newest` (*version: the one it has).
inline Status ParseValue(const std::string& key, const std::string& value, json* out,
                         int newest = kStateFormatVersion, int* version = nullptr) {
  if (value.size() > kMaxStateValueBytes) {
    return Status::Corruption("stored value is " + std::to_string(value.size()) +
                              " bytes, over the " + std::to_string(kMaxStateValueBytes) + " limit" +
                              Fix(key));
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
    return Status::FailedPrecondition("state key '" + key + "' has format version " + v->dump() +
                                      "; this edl server reads version" +
                                      (newest > 1 ? "s 1.." : " ") + std::to_string(newest) +
                                      ". Run the edl version that wrote it, or move "
                                      "the state aside to start anew");
  }
  if (version != nullptr) *version = static_cast<int>(v->get<int64_t>());
  return Status::OK();
}

// The fields of the value stored under `key` (edl/proto/fields.h, the one reader of hostile JSON):
// a refusal is Corruption "stored field '<field>' <why>" naming the key and the fix.
class Reader : public proto::Fields {
 public:
  Reader(const json& j, const std::string& key) : proto::Fields(j, "stored", Fix(key)) {}
};

}  // namespace edl::jobserver::state_value
