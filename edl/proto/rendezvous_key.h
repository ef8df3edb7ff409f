// The rendezvous key scheme, in one place: the runtime writes a generation's communicator keys
// under RendezvousPrefix(N, backend) ("gen/<N>/<backend>/..."), and the server's KV
// (jobserver/kv_store.h) drops keys whose generation GenerationOfKey finds to be more than two
// generations old. PROTOCOL.md "Trainer <-> client" documents the shape.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace edl::proto {

inline constexpr std::string_view kGenerationKeyRoot = "gen/";

// "gen/<generation>/": every key of that generation starts with this.
inline std::string GenerationKeyPrefix(int64_t generation) {
  return std::string(kGenerationKeyRoot) + std::to_string(generation) + "/";
}

// "gen/<generation>/<backend>": a communicator's CommOptions::key_prefix.
inline std::string RendezvousPrefix(int64_t generation, std::string_view backend) {
  return GenerationKeyPrefix(generation) + std::string(backend);
}

// The generation of `key` (as a trainer wrote it, without the server's "<job>/" scope) when it
// has the form "gen/<digits>/...", else -1.
inline int64_t GenerationOfKey(std::string_view key) {
  if (key.substr(0, kGenerationKeyRoot.size()) != kGenerationKeyRoot) return -1;
  key.remove_prefix(kGenerationKeyRoot.size());
  int64_t g = 0;
  size_t i = 0;
  for (; i < key.size() && i < 18 && key[i] >= '0' && key[i] <= '9'; ++i)
    g = g * 10 + (key[i] - '0');
  if (i == 0 || i >= key.size() || key[i] != '/') return -1;
  return g;
}

}  // namespace edl::proto
