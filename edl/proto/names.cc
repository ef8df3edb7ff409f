#include "edl/proto/names.h"

namespace edl::proto {

namespace {

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// A decimal field without sign or leading zero, at most `max_digits` digits; -1 otherwise.
int64_t Decimal(std::string_view f, size_t max_digits) {
  if (f.empty() || f.size() > max_digits || (f[0] == '0' && f.size() > 1)) return -1;
  int64_t v = 0;
  for (char c : f) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

bool IsValidName(const std::string& s) {
  if (s.empty() || s.size() > kMaxNameBytes || s == "." || s == "..") return false;
  for (char c : s) {
    if (!NameChar(c)) return false;
  }
  return true;
}

Status CheckName(const std::string& what, const std::string& s, size_t max_bytes) {
  if (s.empty()) {
    return Status::InvalidArgument(what +
                                   " is empty: give it a name of letters, digits, '.', '_' or '-'");
  }
  if (s.size() > max_bytes) {
    return Status::InvalidArgument(what + " '" + s.substr(0, 32) + "...' is " +
                                   std::to_string(s.size()) + " bytes: at most " +
                                   std::to_string(max_bytes) + " are allowed");
  }
  for (char c : s) {
    if (!NameChar(c)) {
      return Status::InvalidArgument(
          what + " '" + s + "' has a character other than letters, digits, '.', '_' or '-'");
    }
  }
  if (s[0] == '.' || s[0] == '-') {
    return Status::InvalidArgument(what + " '" + s + "' must start with a letter, digit or '_'");
  }
  return Status::OK();
}

Status CheckNodeName(const std::string& name) {
  Status s = CheckName("node name", name, kMaxNodeNameBytes);
  if (s.ok()) return s;
  if (name.size() > kMaxNodeNameBytes) {
    return Status::InvalidArgument(
        s.message() + ", so that its trainer ids '<node>-s<slot>-<seq>' fit " +
        std::to_string(kMaxNameBytes) + " bytes; give the client a shorter --node_name");
  }
  return Status::InvalidArgument(s.message() + "; give the client another --node_name");
}

std::string TrainerId::ToString() const {
  return node + "-s" + std::to_string(slot) + "-" + std::to_string(seq);
}

bool TrainerId::Parse(std::string_view id, TrainerId* out) {
  const size_t dash = id.rfind('-');
  if (dash == std::string_view::npos || dash < 3) return false;
  const size_t s = id.rfind("-s", dash - 1);
  if (s == std::string_view::npos || s == 0) return false;
  const int64_t slot = Decimal(id.substr(s + 2, dash - s - 2), 5);
  const int64_t seq = Decimal(id.substr(dash + 1), 16);
  if (slot < 0 || slot > kMaxSlot || seq < 0 || seq >= (int64_t{1} << 53)) return false;
  const std::string node(id.substr(0, s));
  if (!IsValidName(node)) return false;
  out->node = node;
  out->slot = static_cast<int>(slot);
  out->seq = seq;
  return true;
}

int64_t TrainerId::SeqOf(std::string_view id, const std::string& node, int slot) {
  const std::string prefix = node + "-s" + std::to_string(slot) + "-";
  if (id.size() <= prefix.size() || id.compare(0, prefix.size(), prefix) != 0) return -1;
  return Decimal(id.substr(prefix.size()), 16);
}

}  // namespace edl::proto
