// Names on the wire and the one rule for each: the characters a name may hold (IsValidName, what a
// decoder accepts from a peer), the rule for a name somebody picks (CheckName: a node, a job, a job
// type, a service), and the trainer id the server issues ("<node>-s<slot>-<seq>", TrainerId), which
// every part that builds or reads one uses (the scheduler, the generation encoding, the tests).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "edl/base/status.h"

namespace edl::proto {

// Largest id / name accepted on the wire.
constexpr size_t kMaxNameBytes = 128;
// Most slots one node may offer (a client's --slots, a hello's slots, the scheduler's nodes).
constexpr size_t kMaxSlotsPerNode = 4096;
// Highest slot number (a GPU index or a CPU slot) a member may have.
constexpr int kMaxSlot = 1 << 16;

// Names end up in file names and argv: letters, digits, '.', '_', '-' only, not "." or "..",
// 1..kMaxNameBytes bytes. What a decoder accepts.
bool IsValidName(const std::string& s);

// The rule for a name somebody picks (--node_name, a job name, --job_id, a job type, a service):
// 1..max_bytes of letters, digits, '.', '_' and '-', not starting with '.' or '-' (it would read as
// a hidden file or a flag). OK, or InvalidArgument naming `what`, the name, the problem and the
// fix.
Status CheckName(const std::string& what, const std::string& name,
                 size_t max_bytes = kMaxNameBytes);

// A trainer id "<node>-s<slot>-<seq>": unique in a server (one counter for every job), stable for
// the trainer process's life.
struct TrainerId {
  std::string node;
  int slot = 0;
  int64_t seq = 0;

  // The id's text. REQUIRES: node valid (CheckNodeName), 0 <= slot <= kMaxSlot, 0 <= seq < 2^53.
  std::string ToString() const;
  // Parses the canonical form only (decimal fields without sign or leading zero); false for
  // anything else. A node name may itself hold "-s": the last "-s<digits>-<digits>" ends the id.
  static bool Parse(std::string_view id, TrainerId* out);
  // The seq of `id` when it is exactly TrainerId{node, slot, seq}'s text, else -1.
  static int64_t SeqOf(std::string_view id, const std::string& node, int slot);
};

// Longest node name: a trainer id of the longest node name, the highest slot and the highest seq
// (< 2^53) fits kMaxNameBytes.
constexpr size_t kMaxNodeNameBytes = kMaxNameBytes - (sizeof("-s65536-9007199254740992") - 1);

// The node name rule, the same for a one-job server and a cluster server: CheckName with
// kMaxNodeNameBytes, whose message says why the bound is shorter than other names'.
Status CheckNodeName(const std::string& name);

}  // namespace edl::proto
