// Type mutations of well-formed messages, for the structure-aware fuzz target
// (server_dispatch_fuzzer.cc) and its deterministic twin (tests/jobserver/server_dispatch_test.cc):
// every field of a valid message replaced by a value of each JSON type, removed, duplicated (the
// text holds the key twice) or made huge, and unknown fields added. What reaches the code under
// test is the text, parsed by the frame layer's DecodePayload as a peer's frame is.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace edl::fuzz {

using nlohmann::json;

// One value of every JSON type and shape a decoder may meet where it expects another: null,
// booleans, integers at and past every bound, floats, strings (empty, a name, a long one, bytes
// that are not UTF-8 once decoded), arrays and objects (empty, small, deep, large).
inline const std::vector<json>& TypeVariants() {
  static const std::vector<json> kVariants = [] {
    std::vector<json> v = {
        json(),
        json(false),
        json(true),
        json(0),
        json(-1),
        json(1),
        json(std::numeric_limits<int64_t>::min()),
        json(std::numeric_limits<int64_t>::max()),
        json(std::numeric_limits<uint64_t>::max()),
        json(0.5),
        json(-1e308),
        json(1e308),
        json(""),
        json("x"),
        json("n1-s0-1"),
        json(std::string(5000, 'a')),
        json(std::string("\x01\x7f\\\"", 4)),
        json::array(),
        json::array({1, "a", nullptr}),
        json::object(),
        json{{"event", "stall"}, {"generation", "1"}},
    };
    json deep = json::array();  // 30 levels: inside the frame layer's depth bound
    for (int i = 0; i < 29; ++i) deep = json::array({deep});
    v.push_back(deep);
    // Past the per-list bounds of a node's or ctl's message up to proto::kMaxSlotsPerNode (4096;
    // the generic kMaxListItems, 100000, is the decoders' own test), and no larger: its parse is
    // most of an input's time when it is picked.
    json wide = json::array();
    for (int i = 0; i < 4100; ++i) wide.push_back(i);
    v.push_back(wide);
    return v;
  }();
  return kVariants;
}

// Every field's location in `j` (object members and array items, recursively, at most `limit`).
inline void Paths(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>* out,
                  size_t limit = 64) {
  if (out->size() >= limit) return;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const json::json_pointer p = at / it.key();
      out->push_back(p);
      Paths(it.value(), p, out, limit);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size() && i < 4; ++i) {
      const json::json_pointer p = at / i;
      out->push_back(p);
      Paths(j[i], p, out, limit);
    }
  }
}
inline std::vector<json::json_pointer> Paths(const json& j) {
  std::vector<json::json_pointer> out;
  Paths(j, json::json_pointer(), &out);
  return out;
}

// `msg` with the value at `p` replaced by `v` (p names an existing location).
inline json Replaced(json msg, const json::json_pointer& p, const json& v) {
  msg[p] = v;
  return msg;
}
// `msg` without the member at `p` (an array item is replaced by null instead: indices shift).
inline json Removed(json msg, const json::json_pointer& p) {
  json& parent = msg[p.parent_pointer()];
  if (parent.is_object()) {
    parent.erase(p.back());
  } else {
    msg[p] = nullptr;
  }
  return msg;
}
// The text of `msg` with top-level member `key` given a second time, as `v`, after the first:
// a JSON parser keeps one of the two (nlohmann: the last).
inline std::string WithDuplicate(const json& msg, const std::string& key, const json& v) {
  std::string text = msg.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() < 2 || text.back() != '}') return text;
  text.pop_back();
  text += (text.size() > 1 ? "," : "") + json(key).dump() + ":" +
          v.dump(-1, ' ', false, json::error_handler_t::replace) + "}";
  return text;
}

// Reads the fuzzer's bytes as choices; past the end every choice is 0.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t Next() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A choice in [0, n) (n >= 1), from one or two bytes.
  size_t Below(size_t n) {
    if (n <= 1) return 0;
    uint32_t x = Next();
    if (n > 256) x = (x << 8) | Next();
    return x % n;
  }
  bool done() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Applies 1..4 mutations chosen by `r` to `msg` and returns the text a peer would send (keeps
// "type" most of the time, so the message reaches its decoder).
inline std::string Mutate(json msg, ByteReader* r) {
  const size_t n = 1 + r->Below(4);
  std::string duplicate_key;
  json duplicate_value;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<json::json_pointer> paths = Paths(msg);
    if (paths.empty()) break;
    const json::json_pointer& p = paths[r->Below(paths.size())];
    const bool is_type = p.to_string() == "/type";
    if (is_type && r->Below(8) != 0) continue;
    const std::vector<json>& variants = TypeVariants();
    switch (r->Below(5)) {
      case 0:
      case 1:
        msg = Replaced(std::move(msg), p, variants[r->Below(variants.size())]);
        break;
      case 2:
        msg = Removed(std::move(msg), p);
        break;
      case 3:  // an unknown member beside a known one
        if (msg.is_object())
          msg["x_unknown_" + std::to_string(r->Below(4))] = variants[r->Below(variants.size())];
        break;
      case 4:  // a top-level member twice
        if (p.parent_pointer().empty()) {
          duplicate_key = p.back();
          duplicate_value = variants[r->Below(variants.size())];
        }
        break;
    }
  }
  if (!duplicate_key.empty() && msg.is_object())
    return WithDuplicate(msg, duplicate_key, duplicate_value);
  return msg.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace edl::fuzz
