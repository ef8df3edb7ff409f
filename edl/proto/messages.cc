#include "edl/proto/messages.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "edl/proto/fields.h"
#include "edl/proto/frame.h"

namespace edl::proto {

using nlohmann::json;

namespace {

using internal::Fields;
using internal::GetInt;

constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();

// Members travel as compact arrays [trainer_id, node, slot, host]; the rank is the position.
json MemberToJson(const MemberInfo& m) {
  return json::array({m.trainer_id, m.node, m.slot, m.host});
}

Status MembersFromJson(const json& a, const char* what, std::vector<MemberInfo>* out) {
  out->clear();
  out->reserve(a.size());
  std::unordered_set<std::string> seen;
  for (const json& e : a) {
    if (!e.is_array() || e.size() != 4 || !e[0].is_string() || !e[1].is_string() ||
        !e[2].is_number_integer() || !e[3].is_string()) {
      return Status::Corruption(std::string("message '") + what +
                                "' holds a member that is not [trainer_id, node, slot, host]");
    }
    MemberInfo m;
    m.trainer_id = e[0].get<std::string>();
    m.node = e[1].get<std::string>();
    int64_t slot = -1;
    m.host = e[3].get<std::string>();
    if (!IsValidName(m.trainer_id) || !IsValidName(m.node) || !GetInt(e[2], 0, kMaxSlot, &slot) ||
        !IsValidHost(m.host)) {
      return Status::Corruption(std::string("message '") + what + "' holds an invalid member " +
                                QuoteJson(e));
    }
    if (!seen.insert(m.trainer_id).second) {
      return Status::Corruption(std::string("message '") + what + "' lists trainer " +
                                m.trainer_id + " twice");
    }
    m.slot = static_cast<int>(slot);
    m.rank = static_cast<int>(out->size());
    out->push_back(std::move(m));
  }
  return Status::OK();
}

// ---- id runs: the compact form of consecutive scheduler-made members (PROTOCOL.md,
// "Generations"). A run "node host first_slot count first_seq" stands for `count` members on `node`
// whose slots and sequence numbers both count up by one, with ids "<node>-s<slot>-<seq>"; a
// removed-id run "node first_slot count first_seq" names the same ids without the host.
// Consecutive runs share one JSON string, separated by ';': a step that touches 500 nodes is one
// string for the JSON parser, not 3000 values (each a heap node) in every client.

std::string RunId(const std::string& node, int64_t slot, int64_t seq) {
  return TrainerId{node, static_cast<int>(slot), seq}.ToString();
}

// Appends `members` to `out` as packed run strings and single items. `with_host`: member runs
// (added; every member of run form travels in a run, even alone); otherwise id runs (removed),
// where a lone id travels as the plain id (shorter than its run).
void EncodeRuns(const std::vector<MemberInfo>& members, bool with_host, json* out) {
  std::string packed;
  auto flush = [&] {
    if (!packed.empty()) out->push_back(std::move(packed));
    packed.clear();
  };
  size_t i = 0;
  while (i < members.size()) {
    const MemberInfo& m = members[i];
    const int64_t seq = m.node.empty() ? -1 : TrainerId::SeqOf(m.trainer_id, m.node, m.slot);
    size_t n = 1;
    while (seq >= 0 && i + n < members.size()) {
      const MemberInfo& x = members[i + n];
      if (x.node != m.node || (with_host && x.host != m.host) ||
          x.slot != m.slot + static_cast<int>(n) ||
          TrainerId::SeqOf(x.trainer_id, x.node, x.slot) != seq + static_cast<int64_t>(n)) {
        break;
      }
      ++n;
    }
    if (seq < 0 || (n == 1 && !with_host)) {
      flush();
      out->push_back(with_host ? MemberToJson(m) : json(m.trainer_id));
    } else {
      if (!packed.empty()) packed.push_back(';');
      packed.append(m.node).push_back(' ');
      if (with_host) packed.append(m.host).push_back(' ');
      packed.append(std::to_string(m.slot)).append(" ").append(std::to_string(n)).append(" ");
      packed.append(std::to_string(seq));
    }
    i += n;
  }
  flush();
}

// A decimal field of a packed run: digits only, no sign, no leading zero, at most 16 digits (so
// it fits an int64_t before any range check).
bool ParseRunField(std::string_view f, int64_t* out) {
  if (f.empty() || f.size() > 16 || (f[0] == '0' && f.size() > 1)) return false;
  int64_t v = 0;
  for (char c : f) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// Expands one run after validating every field; `budget` caps the total expansion (a few bytes on
// the wire must not become millions of members).
Status ExpandRun(std::string_view run, bool with_host, const char* what, size_t* budget,
                 std::vector<MemberInfo>* out) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption(std::string("message '") + what + "' holds a bad run " + Quote(run) +
                              ": " + why);
  };
  const size_t want = with_host ? 5 : 4;
  std::string_view f[6];  // one more than the most a run has, to see an extra field
  size_t n = 0, pos = 0;
  bool more = true;
  while (more && n <= want) {
    const size_t sp = run.find(' ', pos);
    f[n++] = run.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos);
    more = sp != std::string_view::npos;
    pos = sp + 1;
  }
  if (more || n != want) {
    return bad(with_host ? "not \"node host first_slot count first_seq\""
                         : "not \"node first_slot count first_seq\"");
  }
  MemberInfo m;
  m.node.assign(f[0]);
  if (with_host) m.host.assign(f[1]);
  if (!IsValidName(m.node) || (with_host && !IsValidHost(m.host))) {
    return bad("invalid node or host");
  }
  // Each field is range-checked on its own before any arithmetic, so nothing can overflow.
  const size_t c = with_host ? 2 : 1;
  int64_t slot = 0, count = 0, seq = 0;
  if (!ParseRunField(f[c + 1], &count) || count < 1 || count > static_cast<int64_t>(*budget)) {
    return bad("count out of range");
  }
  if (!ParseRunField(f[c], &slot) || !ParseRunField(f[c + 2], &seq) || slot > kMaxSlot ||
      seq > (int64_t{1} << 53) || slot + count - 1 > kMaxSlot) {
    return bad("slot or sequence out of range");
  }
  if (RunId(m.node, slot + count - 1, seq + count - 1).size() > kMaxNameBytes)
    return bad("ids too long");
  *budget -= static_cast<size_t>(count);
  for (int64_t k = 0; k < count; ++k) {
    m.slot = static_cast<int>(slot + k);
    m.trainer_id = RunId(m.node, slot + k, seq + k);
    out->push_back(m);
  }
  return Status::OK();
}

// Expands a packed string of runs separated by ';' (none empty).
Status ExpandRuns(const std::string& packed, bool with_host, const char* what, size_t* budget,
                  std::vector<MemberInfo>* out) {
  const std::string_view s(packed);
  size_t pos = 0;
  while (true) {
    const size_t end = std::min(s.find(';', pos), s.size());
    EDL_RETURN_IF_ERROR(ExpandRun(s.substr(pos, end - pos), with_host, what, budget, out));
    if (end == s.size()) return Status::OK();
    pos = end + 1;
  }
}

void Renumber(std::vector<MemberInfo>* members) {
  for (size_t i = 0; i < members->size(); ++i) (*members)[i].rank = static_cast<int>(i);
}

}  // namespace

bool IsLoopbackIp(const std::string& host) {
  unsigned char a[16];
  if (inet_pton(AF_INET, host.c_str(), a) == 1) return a[0] == 127;
  if (inet_pton(AF_INET6, host.c_str(), a) != 1) return false;
  static const unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(a, kLoopback6, 16) == 0 || (std::memcmp(a, kMapped, 12) == 0 && a[12] == 127);
}

const char kOneClientPerMachineFix[] =
    "two edl clients on one machine double-book its GPUs or cores. Stop this client "
    "(scripts/ssh_cluster.sh runs one per host of its hosts file), or give the two disjoint slots "
    "(--gpus 0,1 and --gpus 2,3)";

bool IsLoopbackHost(const std::string& host) {
  return IsLoopbackIp(host) || host == "localhost" || host.rfind("localhost.", 0) == 0;
}

bool IsValidHost(const std::string& s) {
  if (s.empty() || s.size() > kMaxHostBytes) return false;
  unsigned char buf[16];
  if (s.find(':') != std::string::npos) return inet_pton(AF_INET6, s.c_str(), buf) == 1;
  size_t label = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.') {
      if (label == 0 || s[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    const bool good = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || (c == '-' && label > 0);
    if (!good || ++label > 63) return false;
  }
  return label > 0 && s.back() != '-';
}

Status StatusFromWire(const std::string& code, const std::string& message) {
  using C = Status::Code;
  for (C c : {C::kOk, C::kInvalidArgument, C::kNotFound, C::kCorruption, C::kIOError, C::kTimeout,
              C::kAborted, C::kUnauthenticated, C::kAlreadyExists, C::kFailedPrecondition,
              C::kUnavailable, C::kInternal}) {
    if (code == Status::CodeName(c)) return c == C::kOk ? Status::OK() : Status(c, message);
  }
  return Status::Internal("unknown status code " + Quote(code) + ": " + message);
}

// ---- GenerationInfo

int GenerationInfo::RankOf(const std::string& trainer_id) const {
  const MemberInfo* m = Find(trainer_id);
  return m == nullptr ? -1 : m->rank;
}

const MemberInfo* GenerationInfo::Find(const std::string& trainer_id) const {
  for (const MemberInfo& m : members) {
    if (m.trainer_id == trainer_id) return &m;
  }
  return nullptr;
}

namespace {
void EncodeHeader(const GenerationInfo& g, json* j) {
  (*j)["generation"] = g.generation;
  (*j)["job_id"] = g.job_id;
  (*j)["reason"] = g.reason;
  (*j)["failure"] = g.failure;
  (*j)["master_addr"] = g.master_addr;
  (*j)["master_port"] = g.master_port;
}
Status DecodeHeader(const json& j, const char* what, GenerationInfo* g) {
  return Fields(j, what)
      .Int("generation", &g->generation, 0, kMaxI64)
      .Name("job_id", &g->job_id)
      .Str("reason", &g->reason, 64)
      .Bool("failure", &g->failure)
      .Host("master_addr", &g->master_addr, /*required=*/false)
      .Int("master_port", &g->master_port, 0, 65535)
      .status();
}
}  // namespace

void GenerationInfo::EncodeTo(json* j) const {
  *j = json::object();
  (*j)["type"] = msg::kGeneration;
  EncodeHeader(*this, j);
  json a = json::array();
  for (const MemberInfo& m : members) a.push_back(MemberToJson(m));
  (*j)["members"] = std::move(a);
}

Status GenerationInfo::DecodeFrom(const json& j) {
  GenerationInfo g;
  EDL_RETURN_IF_ERROR(DecodeHeader(j, "generation", &g));
  const json* a = nullptr;
  EDL_RETURN_IF_ERROR(Fields(j, "generation").Arr("members", &a).status());
  EDL_RETURN_IF_ERROR(MembersFromJson(*a, "generation", &g.members));
  *this = std::move(g);
  return Status::OK();
}

// ---- GenerationUpdate

GenerationUpdate GenerationUpdate::Full(const GenerationInfo& g) {
  GenerationUpdate u;
  u.header = g;
  u.header.members.clear();
  u.added = g.members;
  return u;
}

GenerationUpdate GenerationUpdate::Between(const GenerationInfo& prev, const GenerationInfo& next) {
  std::unordered_set<std::string> in_next;
  for (const MemberInfo& m : next.members) in_next.insert(m.trainer_id);
  GenerationUpdate u;
  size_t kept = 0;
  for (const MemberInfo& m : prev.members) {
    if (in_next.count(m.trainer_id) == 0) {
      u.removed.push_back(m.trainer_id);
      continue;
    }
    if (kept >= next.members.size() || next.members[kept].trainer_id != m.trainer_id ||
        next.members[kept].node != m.node || next.members[kept].slot != m.slot ||
        next.members[kept].host != m.host) {
      return Full(next);  // survivors reordered: not a delta
    }
    ++kept;
  }
  u.base_generation = prev.generation;
  u.header = next;
  u.header.members.clear();
  u.added.assign(next.members.begin() + kept, next.members.end());
  return u;
}

Status GenerationUpdate::ApplyTo(GenerationInfo* current) const {
  std::vector<MemberInfo> members;
  if (base_generation != 0) {
    if (current->generation != base_generation) {
      return Status::FailedPrecondition("generation update " + std::to_string(header.generation) +
                                        " is a delta against " + std::to_string(base_generation) +
                                        " but the receiver holds " +
                                        std::to_string(current->generation));
    }
    std::unordered_set<std::string_view> gone(removed.begin(), removed.end());
    members.reserve(current->members.size() + added.size());
    for (const MemberInfo& m : current->members) {
      if (gone.erase(m.trainer_id) == 0) members.push_back(m);
    }
    if (!gone.empty()) {
      return Status::FailedPrecondition("generation update " + std::to_string(header.generation) +
                                        " removes trainer " + std::string(*gone.begin()) +
                                        ", not a member of the receiver's generation");
    }
  }
  // Ids are checked before `members` grows: the views point into its strings.
  std::unordered_set<std::string_view> have;
  have.reserve(members.size() + added.size());
  for (const MemberInfo& m : members) have.insert(m.trainer_id);
  for (const MemberInfo& m : added) {
    if (!have.insert(m.trainer_id).second) {
      return Status::FailedPrecondition("generation update adds trainer " + m.trainer_id +
                                        " twice");
    }
  }
  members.insert(members.end(), added.begin(), added.end());
  GenerationInfo next = header;
  next.members = std::move(members);
  Renumber(&next.members);
  *current = std::move(next);
  return Status::OK();
}

void GenerationUpdate::EncodeTo(json* j) const {
  *j = json::object();
  (*j)["type"] = msg::kGeneration;
  EncodeHeader(header, j);
  (*j)["base"] = base_generation;
  // Removed ids are re-split into runs: pretend each id belongs to the member it would name.
  std::vector<MemberInfo> gone;
  gone.reserve(removed.size());
  for (const std::string& id : removed) {
    MemberInfo m;
    m.trainer_id = id;
    TrainerId t;
    if (TrainerId::Parse(id, &t)) {
      m.node = std::move(t.node);
      m.slot = t.slot;
    }
    gone.push_back(std::move(m));
  }
  json r = json::array();
  EncodeRuns(gone, /*with_host=*/false, &r);
  (*j)["removed"] = std::move(r);
  json a = json::array();
  EncodeRuns(added, /*with_host=*/true, &a);
  (*j)["added"] = std::move(a);
}

Status GenerationUpdate::DecodeFrom(const json& j) {
  GenerationUpdate u;
  EDL_RETURN_IF_ERROR(DecodeHeader(j, "generation", &u.header));
  const json* a = nullptr;
  const json* r = nullptr;
  EDL_RETURN_IF_ERROR(Fields(j, "generation")
                          .Int("base", &u.base_generation, 0, kMaxI64)
                          .Arr("removed", &r)
                          .Arr("added", &a)
                          .status());
  if (u.base_generation != 0 && u.base_generation >= u.header.generation) {
    return Status::Corruption("message 'generation' field 'base' is not older than 'generation'");
  }
  size_t budget = kMaxListItems;
  std::vector<MemberInfo> gone;
  for (const json& e : *r) {
    const std::string* str = e.is_string() ? &e.get_ref<const std::string&>() : nullptr;
    if (str != nullptr && str->find(' ') != std::string::npos) {
      gone.clear();
      EDL_RETURN_IF_ERROR(ExpandRuns(*str, /*with_host=*/false, "generation", &budget, &gone));
      for (MemberInfo& m : gone) u.removed.push_back(std::move(m.trainer_id));
    } else if (str != nullptr && IsValidName(*str) && budget > 0) {
      --budget;
      u.removed.push_back(*str);
    } else {
      return Status::Corruption(
          "message 'generation' field 'removed' holds an item that is neither a "
          "trainer id nor runs \"node first_slot count first_seq[;...]\"");
    }
  }
  budget = kMaxListItems;
  for (const json& e : *a) {
    if (e.is_string()) {
      EDL_RETURN_IF_ERROR(ExpandRuns(e.get_ref<const std::string&>(), /*with_host=*/true,
                                     "generation", &budget, &u.added));
    } else {
      if (budget == 0)
        return Status::Corruption("message 'generation' field 'added' has too many members");
      --budget;
      std::vector<MemberInfo> one;
      EDL_RETURN_IF_ERROR(MembersFromJson(json::array({e}), "generation", &one));
      u.added.push_back(std::move(one[0]));
    }
  }
  std::unordered_set<std::string_view> seen;
  seen.reserve(u.added.size());
  for (size_t i = 0; i < u.added.size(); ++i) {
    u.added[i].rank = static_cast<int>(i);
    if (!seen.insert(u.added[i].trainer_id).second) {
      return Status::Corruption("message 'generation' lists trainer " + u.added[i].trainer_id +
                                " twice");
    }
  }
  *this = std::move(u);
  return Status::OK();
}

// ---- handshake

void Challenge::EncodeTo(json* j) const { *j = {{"type", msg::kChallenge}, {"nonce", nonce}}; }
Status Challenge::DecodeFrom(const json& j) {
  Fields f(j, msg::kChallenge);
  f.Str("nonce", &nonce, 64);
  if (f.ok() && nonce.size() != 64) f.Fail("nonce", "is not 64 hex characters");
  return f.status();
}

namespace {
// The client hello's services, teacher_slots and teachers (see Hello): all or nothing.
void DecodeHelloServices(const json& j, Fields* f, Hello* h) {
  if (!f->ok() || !j.contains("services")) return;
  constexpr int kMaxSlots = 64;  // service_messages.h: kMaxTeacherSlots
  const json* teachers = nullptr;
  f->NameList("services", &h->services).Int("teacher_slots", &h->teacher_slots, 1, kMaxSlots);
  f->Arr("teachers", &teachers);
  if (f->ok() && (h->services.empty() || h->services.size() > kMaxJobTypesPerNode)) {
    f->Fail("services", "holds 0 or more than " + std::to_string(kMaxJobTypesPerNode) + " names");
  }
  if (f->ok() && teachers->size() > static_cast<size_t>(h->teacher_slots)) {
    f->Fail("teachers", "lists more teachers than teacher_slots");
  }
  for (size_t i = 0; f->ok() && teachers != nullptr && i < teachers->size(); ++i) {
    const json& t = (*teachers)[i];
    if (!t.is_array() || t.size() != 2 || !t[0].is_string() || !t[1].is_string() ||
        !IsValidName(t[0].get_ref<const std::string&>()) ||
        !IsValidName(t[1].get_ref<const std::string&>())) {
      f->Fail("teachers", "item " + std::to_string(i) + " is not a [service, name] pair of names");
      break;
    }
    h->teachers.emplace_back(t[0].get<std::string>(), t[1].get<std::string>());
  }
}
}  // namespace

void Hello::EncodeTo(json* j) const {
  *j = {{"type", msg::kHello}, {"role", NameOf(role)}, {"mac", mac}, {"nonce", nonce}};
  if (role == Role::kClient) {
    (*j)["node"] = node;
    (*j)["host"] = host;
    (*j)["mode"] = NameOf(mode);
    (*j)["slots"] = slots;
    (*j)["trainers"] = trainers;
    if (!trainer_generations.empty()) (*j)["trainer_generations"] = trainer_generations;
    if (!node_token.empty()) (*j)["node_token"] = node_token;
    if (!job_types.empty()) {
      json a = json::array();
      for (const JobTypeDecl& t : job_types)
        a.push_back({{"name", t.name}, {"settable", t.settable}});
      (*j)["job_types"] = std::move(a);
    }
    if (!services.empty()) {
      (*j)["services"] = services;
      (*j)["teacher_slots"] = teacher_slots;
      json a = json::array();
      for (const auto& [service, name] : teachers) a.push_back(json::array({service, name}));
      (*j)["teachers"] = std::move(a);
    }
  } else if (role == Role::kTeacher) {
    (*j)["node"] = node;
    (*j)["host"] = host;
    (*j)["service"] = service;
    (*j)["port"] = port;
  } else if (role == Role::kStudent) {
    (*j)["service"] = service;
  }
}
Status Hello::DecodeFrom(const json& j) {
  Hello h;
  Fields f(j, msg::kHello);
  std::string role, mode;
  f.Str("role", &role, 16).Str("mac", &h.mac, 64).Str("nonce", &h.nonce, 64);
  if (f.ok() && !kRoleNames.Parse(role, &h.role)) f.Fail("role", "is not " + kRoleNames.List("'"));
  if (f.ok() && h.nonce.size() != 64) f.Fail("nonce", "is not 64 hex characters");
  if (f.ok() && (h.role == Role::kTeacher || h.role == Role::kStudent))
    f.Name("service", &h.service);
  if (f.ok() && h.role == Role::kTeacher) {
    f.Name("node", &h.node).Host("host", &h.host).Int("port", &h.port, 1, 65535);
  }
  if (f.ok() && h.role == Role::kClient) {
    const json* slots = nullptr;
    f.Name("node", &h.node).Host("host", &h.host).Str("mode", &mode, 16).Arr("slots", &slots);
    f.NameList("trainers", &h.trainers);
    f.Str("node_token", &h.node_token, kSessionTokenBytes, /*required=*/false);
    const auto gens = j.find("trainer_generations");
    if (f.ok() && gens != j.end()) {
      if (!gens->is_array() || gens->size() != h.trainers.size()) {
        f.Fail("trainer_generations", "is not a list as long as 'trainers'");
      } else {
        for (const json& g : *gens) {
          int64_t x = 0;
          if (!GetInt(g, 0, kMaxI64, &x)) {
            f.Fail("trainer_generations", "holds " + QuoteJson(g) + ", not a generation number");
            break;
          }
          h.trainer_generations.push_back(x);
        }
      }
    }
    if (f.ok() && !kNodeModeNames.Parse(mode, &h.mode))
      f.Fail("mode", "is not " + kNodeModeNames.List("'"));
    const json* types = nullptr;
    f.Arr("job_types", &types, /*required=*/false);
    if (f.ok() && types != nullptr && types->size() > kMaxJobTypesPerNode) {
      f.Fail("job_types", "has more than " + std::to_string(kMaxJobTypesPerNode) + " items");
    }
    for (size_t i = 0; f.ok() && types != nullptr && i < types->size(); ++i) {
      JobTypeDecl t;
      Fields tf((*types)[i], msg::kHello);
      const json* settable = nullptr;
      tf.Name("name", &t.name).Arr("settable", &settable);
      if (tf.ok() && settable->size() > kMaxSettableFlags) {
        tf.Fail("settable", "has more than " + std::to_string(kMaxSettableFlags) + " items");
      }
      for (size_t k = 0; tf.ok() && k < settable->size(); ++k) {
        const json& e = (*settable)[k];
        if (!e.is_string() || !IsValidFlagName(e.get_ref<const std::string&>())) {
          tf.Fail("settable", "holds " + QuoteJson(e) + ", not a flag name (a-z, 0-9, '_')");
        } else {
          t.settable.push_back(e.get<std::string>());
        }
      }
      if (!tf.ok()) f.Fail("job_types", "item " + std::to_string(i) + ": " + tf.status().message());
      h.job_types.push_back(std::move(t));
    }
    DecodeHelloServices(j, &f, &h);
    if (f.ok() && slots->size() > kMaxSlotsPerNode) {
      f.Fail("slots", "has more than " + std::to_string(kMaxSlotsPerNode) + " items");
    }
    if (f.ok()) {
      std::unordered_set<int64_t> seen;
      for (const json& s : *slots) {
        int64_t slot = -1;
        if (!GetInt(s, 0, kMaxSlot, &slot) || !seen.insert(slot).second) {
          f.Fail("slots", "holds an invalid or repeated slot " + QuoteJson(s));
          break;
        }
        h.slots.push_back(static_cast<int>(slot));
      }
    }
  }
  if (!f.ok()) return f.status();
  *this = std::move(h);
  return Status::OK();
}

void Welcome::EncodeTo(json* j) const {
  *j = {{"type", msg::kWelcome}, {"mac", mac}, {"job_id", job_id}, {"heartbeat_ms", heartbeat_ms}};
  if (!node_token.empty()) (*j)["node_token"] = node_token;
  if (dropped) (*j)["dropped"] = true;
}
Status Welcome::DecodeFrom(const json& j) {
  return Fields(j, msg::kWelcome)
      .Str("mac", &mac, 64)
      .Name("job_id", &job_id)
      .Int("heartbeat_ms", &heartbeat_ms, 10, 3600 * 1000)
      .Str("node_token", &node_token, kSessionTokenBytes, /*required=*/false)
      .Bool("dropped", &dropped, /*required=*/false)
      .status();
}

ErrorMsg ErrorMsg::From(const Status& s) {
  ErrorMsg e;
  e.code = Status::CodeName(s.code());
  e.message = s.message();
  return e;
}
Status ErrorMsg::ToStatus() const {
  // The text is the peer's: printable and bounded before it reaches a log or a terminal.
  Status s = StatusFromWire(code, Escape(message, 1024));
  return s.ok() ? Status::Internal("peer sent an error with code OK") : s;
}
void ErrorMsg::EncodeTo(json* j) const {
  *j = {{"type", msg::kError}, {"code", code}, {"message", message}};
  if (!mac.empty()) (*j)["mac"] = mac;
}
Status ErrorMsg::DecodeFrom(const json& j) {
  ErrorMsg e;
  EDL_RETURN_IF_ERROR(Fields(j, msg::kError)
                          .Str("code", &e.code, 32)
                          .Str("message", &e.message, 4096)
                          .Str("mac", &e.mac, 64, /*required=*/false)
                          .status());
  *this = std::move(e);
  return Status::OK();
}

void TrainerHello::EncodeTo(json* j) const {
  *j = {{"type", msg::kTrainerHello}, {"trainer_id", trainer_id}};
}
Status TrainerHello::DecodeFrom(const json& j) {
  return Fields(j, msg::kTrainerHello).Name("trainer_id", &trainer_id).status();
}

void SpareHello::EncodeTo(json* j) const {
  *j = {{"type", msg::kSpareHello}, {"spare_id", spare_id}};
}
Status SpareHello::DecodeFrom(const json& j) {
  return Fields(j, msg::kSpareHello).Name("spare_id", &spare_id).status();
}

void SpareAssign::EncodeTo(json* j) const { *j = {{"type", msg::kSpareAssign}, {"env", env}}; }
Status SpareAssign::DecodeFrom(const json& j) {
  SpareAssign a;
  json vars;
  Fields f(j, msg::kSpareAssign);
  f.Obj("env", &vars);
  if (f.ok() && vars.size() > kMaxSpareEnvVars) {
    f.Fail("env", "has more than " + std::to_string(kMaxSpareEnvVars) + " variables");
  }
  for (auto it = vars.begin(); f.ok() && it != vars.end(); ++it) {
    const std::string& name = it.key();
    const bool name_ok = !name.empty() && name.size() <= kMaxNameBytes &&
                         std::all_of(name.begin(), name.end(), [](char c) {
                           return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
                         });
    if (!name_ok || !it->is_string() ||
        it->get_ref<const std::string&>().size() > kMaxSpareEnvValueBytes ||
        it->get_ref<const std::string&>().find('\0') != std::string::npos) {
      f.Fail("env", "holds an invalid variable name or value");
    } else {
      a.env[name] = it->get<std::string>();
    }
  }
  if (!f.ok()) return f.status();
  *this = std::move(a);
  return Status::OK();
}

void Heartbeat::EncodeTo(json* j) const { *j = {{"type", msg::kHeartbeat}}; }
Status Heartbeat::DecodeFrom(const json& j) { return Fields(j, msg::kHeartbeat).status(); }
void Stop::EncodeTo(json* j) const { *j = {{"type", msg::kStop}}; }
Status Stop::DecodeFrom(const json& j) { return Fields(j, msg::kStop).status(); }
void Done::EncodeTo(json* j) const { *j = {{"type", msg::kDone}}; }
Status Done::DecodeFrom(const json& j) { return Fields(j, msg::kDone).status(); }

// ---- scaling

bool IsValidFlagName(const std::string& s) {
  if (s.empty() || s.size() > kMaxFlagNameBytes || s[0] < 'a' || s[0] > 'z') return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

bool IsValidFlagValue(const std::string& s) {
  if (s.size() > kMaxFlagValueBytes) return false;
  for (char c : s) {
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

std::string CheckpointDirProblem(const std::string& path, const std::string& root) {
  if (root.empty()) {
    return "checkpoint_dir is set but no checkpoint root is configured (the server's "
           "--job_checkpoint_root, the client's checkpoint_root): configure one, or leave "
           "checkpoint_dir to the job type's own command";
  }
  if (path.empty() || path[0] != '/')
    return "checkpoint_dir " + Quote(path) + " is not an absolute path";
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part == "." || part == "..") {
      return "checkpoint_dir " + Quote(path) +
             " has a '.' or '..' component; give a plain absolute path";
    }
  }
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  const bool under = path.size() > r.size() && path.compare(0, r.size(), r) == 0 &&
                     (r == "/" || path[r.size()] == '/');
  if (!under) {
    return "checkpoint_dir " + Quote(path) + " is outside the checkpoint root " + Quote(r) +
           "; give a directory under it, e.g. " + r + "/<job>";
  }
  return "";
}

std::vector<std::string> JobInfo::Argv(const std::vector<std::string>& command) const {
  std::vector<std::string> argv = command;
  for (const auto& [k, v] : flags) argv.push_back("--" + k + "=" + v);
  return argv;
}

void NodeStats::EncodeTo(json* j) const {
  *j = {{"type", msg::kNodeStats},
        {"cpu_busy", cpu_busy},
        {"cpu_cores", cpu_cores},
        {"gpu_util", gpu_util}};
}
Status NodeStats::DecodeFrom(const json& j) {
  NodeStats r;
  Fields f(j, msg::kNodeStats);
  f.Num("cpu_busy", &r.cpu_busy)
      .Int("cpu_cores", &r.cpu_cores, 1, static_cast<int64_t>(kMaxSlotsPerNode) * 16)
      .Num("gpu_util", &r.gpu_util);
  if (f.ok() && (r.cpu_busy < 0 || r.cpu_busy > r.cpu_cores))
    f.Fail("cpu_busy", "is not in 0..cpu_cores");
  if (f.ok() && r.gpu_util != -1 && (r.gpu_util < 0 || r.gpu_util > 100))
    f.Fail("gpu_util", "is not -1 or 0..100");
  if (!f.ok()) return f.status();
  *this = r;
  return Status::OK();
}

void JobInfo::EncodeTo(json* j) const {
  *j = {{"type", msg::kJobInfo}, {"job_id", job_id}, {"job_type", job_type}, {"flags", flags}};
}
Status JobInfo::DecodeFrom(const json& j) {
  JobInfo r;
  json flags;
  Fields f(j, msg::kJobInfo);
  f.Name("job_id", &r.job_id).Name("job_type", &r.job_type).Obj("flags", &flags);
  if (f.ok() && flags.size() > kMaxSettableFlags) {
    f.Fail("flags", "has more than " + std::to_string(kMaxSettableFlags) + " items");
  }
  for (auto it = flags.begin(); f.ok() && it != flags.end(); ++it) {
    if (!IsValidFlagName(it.key()) || !it->is_string() ||
        !IsValidFlagValue(it->get_ref<const std::string&>())) {
      f.Fail("flags", "holds an invalid flag name or value");
    } else {
      r.flags[it.key()] = it->get<std::string>();
    }
  }
  if (!f.ok()) return f.status();
  *this = std::move(r);
  return Status::OK();
}

void Prepare::EncodeTo(json* j) const {
  *j = {{"type", msg::kPrepare},    {"generation", generation},   {"job_id", job_id},
        {"world_size", world_size}, {"master_addr", master_addr}, {"master_port", master_port}};
  json a = json::array();
  for (const MemberInfo& m : joiners)
    a.push_back(json::array({m.trainer_id, m.node, m.slot, m.host, m.rank}));
  (*j)["joiners"] = std::move(a);
}
Status Prepare::DecodeFrom(const json& j) {
  Prepare p;
  const json* a = nullptr;
  Fields f(j, msg::kPrepare);
  f.Int("generation", &p.generation, 1, kMaxI64)
      .Name("job_id", &p.job_id)
      .Int("world_size", &p.world_size, 1, kMaxListItems)
      .Host("master_addr", &p.master_addr, /*required=*/false)
      .Int("master_port", &p.master_port, 0, 65535)
      .Arr("joiners", &a);
  if (!f.ok()) return f.status();
  for (const json& e : *a) {
    int64_t rank = -1;
    if (!e.is_array() || e.size() != 5 || !GetInt(e[4], 0, p.world_size - 1, &rank)) {
      return Status::Corruption(
          "message 'prepare' holds a joiner that is not "
          "[trainer_id, node, slot, host, rank < world_size]");
    }
    std::vector<MemberInfo> one;
    EDL_RETURN_IF_ERROR(
        MembersFromJson(json::array({json::array({e[0], e[1], e[2], e[3]})}), msg::kPrepare, &one));
    one[0].rank = static_cast<int>(rank);
    p.joiners.push_back(one[0]);
  }
  *this = std::move(p);
  return Status::OK();
}

void Kill::EncodeTo(json* j) const { *j = {{"type", msg::kKill}, {"trainer_ids", trainer_ids}}; }
Status Kill::DecodeFrom(const json& j) {
  return Fields(j, msg::kKill).NameList("trainer_ids", &trainer_ids).status();
}

void TrainerExit::EncodeTo(json* j) const {
  *j = {{"type", msg::kTrainerExit},
        {"trainer_id", trainer_id},
        {"exited", exited},
        {"code", code},
        {"signal", signal}};
  if (!error.empty()) (*j)["error"] = error;
}
Status TrainerExit::DecodeFrom(const json& j) {
  error.clear();
  return Fields(j, msg::kTrainerExit)
      .Name("trainer_id", &trainer_id)
      .Bool("exited", &exited)
      .Int("code", &code, -255, 255)
      .Int("signal", &signal, 0, 128)
      .Str("error", &error, kMaxErrorLineBytes, /*required=*/false)
      .status();
}

void Ready::EncodeTo(json* j) const {
  *j = {{"type", msg::kReady}, {"trainer_id", trainer_id}, {"generation", generation}};
}
Status Ready::DecodeFrom(const json& j) {
  return Fields(j, msg::kReady)
      .Name("trainer_id", &trainer_id, /*required=*/false)
      .Int("generation", &generation, 1, kMaxI64)
      .status();
}

void Progress::EncodeTo(json* j) const {
  *j = {{"type", msg::kProgress},
        {"trainer_id", trainer_id},
        {"generation", report.generation},
        {"step", report.step},
        {"epoch", report.epoch},
        {"loss", report.loss},
        {"images_per_sec", report.images_per_sec},
        {"world_size", report.world_size},
        {"accuracy", report.accuracy}};
  if (report.samples >= 0) (*j)["samples"] = report.samples;
  if (report.noise_steps > 0) {
    (*j)["noise_steps"] = report.noise_steps;
    (*j)["grad_sqr"] = report.grad_sqr;
    (*j)["grad_var"] = report.grad_var;
    (*j)["noise_scale"] = report.noise_scale;
  }
  if (report.compute_s_per_sample >= 0) (*j)["compute_s_per_sample"] = report.compute_s_per_sample;
  if (report.sync_s >= 0) (*j)["sync_s"] = report.sync_s;
  if (report.batch > 0) {
    (*j)["batch"] = report.batch;
    (*j)["batch_policy"] = kBatchPolicyNames.Name(report.batch_policy);
  }
}
Status Progress::DecodeFrom(const json& j) {
  Progress p;
  Fields f(j, msg::kProgress);
  f.Name("trainer_id", &p.trainer_id, /*required=*/false)
      .Int("generation", &p.report.generation, 0, kMaxI64)
      .Int("step", &p.report.step, 0, kMaxI64)
      .Int("epoch", &p.report.epoch, 0, kMaxI64)
      .Num("loss", &p.report.loss)
      .Num("images_per_sec", &p.report.images_per_sec)
      .Int("world_size", &p.report.world_size, 0, kMaxListItems)
      .Num("accuracy", &p.report.accuracy, /*required=*/false)
      .Int("samples", &p.report.samples, 0, kMaxI64, /*required=*/false)
      .Int("noise_steps", &p.report.noise_steps, 0, kMaxI64, /*required=*/false);
  if (p.report.noise_steps > 0) {
    f.Num("grad_sqr", &p.report.grad_sqr)
        .Num("grad_var", &p.report.grad_var)
        .Num("noise_scale", &p.report.noise_scale);
  }
  f.Num("compute_s_per_sample", &p.report.compute_s_per_sample, /*required=*/false)
      .Num("sync_s", &p.report.sync_s, /*required=*/false)
      .Int("batch", &p.report.batch, 1, kMaxReportedBatch, /*required=*/false);
  if (p.report.batch > 0) {
    std::string policy;
    f.Str("batch_policy", &policy);
    if (f.ok() && !kBatchPolicyNames.Parse(policy, &p.report.batch_policy))
      f.Fail("batch_policy", "is not " + kBatchPolicyNames.List("'"));
  }
  if (!f.ok()) return f.status();
  // Each is -1 (not measured, not meaningful yet) or a value >= 0.
  for (const auto& [key, v] : {std::pair<const char*, double>{"noise_scale", p.report.noise_scale},
                               {"compute_s_per_sample", p.report.compute_s_per_sample},
                               {"sync_s", p.report.sync_s}}) {
    if (v < 0 && v != -1) {
      return Status::Corruption(std::string("message '") + msg::kProgress + "' field '" + key +
                                "' is below 0 and not -1");
    }
  }
  *this = std::move(p);
  return Status::OK();
}

void Event::EncodeTo(json* j) const {
  *j = {{"type", msg::kEvent}, {"trainer_id", trainer_id}, {"event", event}};
}
Status Event::DecodeFrom(const json& j) {
  EDL_RETURN_IF_ERROR(Fields(j, msg::kEvent)
                          .Name("trainer_id", &trainer_id, /*required=*/false)
                          .Obj("event", &event)
                          .status());
  body = DecodeTrainerEvent(event);
  return Status::OK();
}

// ---- KV

void KvRequest::EncodeTo(json* j) const {
  *j = {{"type", msg::kKv}, {"req_id", req_id}, {"op", NameOf(op)}, {"key", key}};
  if (op == KvOp::kSet) (*j)["value"] = value;
  if (op == KvOp::kWait) (*j)["timeout_ms"] = timeout_ms;
  if (!job.empty()) (*j)["job"] = job;
}
Status KvRequest::DecodeFrom(const json& j) {
  KvRequest r;
  Fields f(j, msg::kKv);
  std::string op;
  f.Int("req_id", &r.req_id, 0, kMaxI64).Str("op", &op, 8).Str("key", &r.key, kMaxKeyBytes);
  f.Name("job", &r.job, /*required=*/false);
  if (f.ok() && r.key.empty()) f.Fail("key", "is empty");
  const bool known = kKvOpNames.Parse(op, &r.op);
  if (f.ok() && known && r.op == KvOp::kSet)
    f.Str("value", &r.value, kMaxValueBytes);
  else if (f.ok() && known && r.op == KvOp::kWait)
    f.Int("timeout_ms", &r.timeout_ms, 0, 3600 * 1000);
  else if (f.ok() && !known)
    f.Fail("op", "is not " + kKvOpNames.List("'"));
  if (!f.ok()) return f.status();
  *this = std::move(r);
  return Status::OK();
}

void KvReply::EncodeTo(json* j) const {
  *j = {{"type", msg::kKvReply},
        {"req_id", req_id},
        {"code", Status::CodeName(status.code())},
        {"message", status.message()},
        {"value", value}};
}
Status KvReply::DecodeFrom(const json& j) {
  KvReply r;
  std::string code, message;
  Fields f(j, msg::kKvReply);
  f.Int("req_id", &r.req_id, 0, kMaxI64)
      .Str("code", &code, 32)
      .Str("message", &message, 4096)
      .Str("value", &r.value, kMaxValueBytes);
  if (!f.ok()) return f.status();
  r.status = StatusFromWire(code, message);
  *this = std::move(r);
  return Status::OK();
}

// ---- ctl

void CtlRequest::EncodeTo(json* j) const {
  *j = {{"type", msg::kCtl}, {"command", NameOf(command)}, {"n", n}};
  if (!job.empty()) (*j)["job"] = job;
  if (!service.empty()) (*j)["service"] = service;
  if (spec.is_object()) (*j)["spec"] = spec;
}
Status CtlRequest::DecodeFrom(const json& j) {
  CtlRequest r;
  Fields f(j, msg::kCtl);
  std::string command;
  f.Str("command", &command, 16).Int("n", &r.n, 0, kMaxListItems, /*required=*/false);
  const bool known = kCtlCommandNames.Parse(command, &r.command);
  f.Name("job", &r.job, /*required=*/false)
      .Name("service", &r.service, /*required=*/false)
      .Obj("spec", &r.spec, /*required=*/known && r.command == CtlCommand::kSubmit);
  if (f.ok() && !known) f.Fail("command", Quote(command) + " is not " + kCtlCommandNames.List(""));
  if (f.ok() && r.command == CtlCommand::kCancel && r.job.empty())
    f.Fail("job", "is missing (cancel names a job)");
  if (f.ok() && !r.service.empty() && (!r.job.empty() || r.command != CtlCommand::kScale)) {
    f.Fail("service", "names what `scale` scales, alone (not with a job)");
  }
  if (!f.ok()) return f.status();
  *this = std::move(r);
  return Status::OK();
}

void CtlReply::EncodeTo(json* j) const {
  *j = {{"type", msg::kCtlReply},
        {"code", Status::CodeName(status.code())},
        {"message", status.message()},
        {"body", body}};
}
Status CtlReply::DecodeFrom(const json& j) {
  std::string code, message;
  json b;
  EDL_RETURN_IF_ERROR(Fields(j, msg::kCtlReply)
                          .Str("code", &code, 32)
                          .Str("message", &message, 4096)
                          .Obj("body", &b)
                          .status());
  status = StatusFromWire(code, message);
  body = std::move(b);
  return Status::OK();
}

}  // namespace edl::proto
