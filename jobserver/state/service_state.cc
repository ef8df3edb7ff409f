// The stored value of a server's services (jobserver/state/STATE.md, "Keys": `services`): desired
// and replacement counts, the teacher-name counter and the placed teachers.
#include <set>

#include <nlohmann/json.hpp>

#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "jobserver/services/service_placement.h"
#include "jobserver/state/state_value.h"

namespace edl::jobserver {

using nlohmann::json;
namespace sv = state_value;

std::string EncodeServices(const ServicesState& s) {
  json teachers = json::array();
  for (const ServicesState::Teacher& t : s.teachers) {
    teachers.push_back({{"name", t.name}, {"service", t.service}, {"node", t.node}});
  }
  return json{{"v", kStateFormatVersion},
              {"desired", s.desired},
              {"restarts", s.restarts},
              {"next_seq", s.next_seq},
              {"teachers", teachers}}
      .dump();
}

namespace {

Status BadServices(const std::string& key, const std::string& why) {
  return Status::Corruption("stored services: " + why + sv::Fix(key));
}

// {"<service>": count} with valid names, at most kMaxStoredServices, counts in lo..hi.
Status DecodeCounts(const std::string& key, const json& j, const char* field, int64_t hi,
                    std::map<std::string, int64_t>* out) {
  const auto f = j.find(field);
  if (f == j.end() || !f->is_object() || f->size() > kMaxStoredServices) {
    return BadServices(key, std::string("'") + field + "' is not an object of at most " +
                                std::to_string(kMaxStoredServices) + " services");
  }
  for (auto it = f->begin(); it != f->end(); ++it) {
    const std::string& name = it.key();
    const json& n = it.value();
    if (!proto::IsValidName(name))
      return BadServices(key, std::string("'") + field + "' names an invalid service");
    if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > hi ||
        (n.is_number_unsigned() && n.get<uint64_t>() > static_cast<uint64_t>(hi))) {
      return BadServices(key, std::string("'") + field +
                                  "' holds a count out of range for service '" + name + "'");
    }
    (*out)[name] = n.get<int64_t>();
  }
  return Status::OK();
}

}  // namespace

Status DecodeServices(const std::string& key, const std::string& value, ServicesState* out) {
  json j;
  EDL_RETURN_IF_ERROR(sv::ParseValue(key, value, &j));
  ServicesState s;
  sv::Reader r(j, key);
  r.Int("next_seq", &s.next_seq, 1, sv::kMaxI64);
  EDL_RETURN_IF_ERROR(r.status());
  std::map<std::string, int64_t> desired;
  EDL_RETURN_IF_ERROR(
      DecodeCounts(key, j, "desired", static_cast<int64_t>(proto::kMaxServiceMembers), &desired));
  for (const auto& [name, n] : desired) s.desired[name] = static_cast<int>(n);
  EDL_RETURN_IF_ERROR(DecodeCounts(key, j, "restarts", sv::kMaxI64, &s.restarts));
  const auto t = j.find("teachers");
  if (t == j.end() || !t->is_array() || t->size() > kMaxStoredTeachers) {
    return BadServices(key, "'teachers' is not a list of at most " +
                                std::to_string(kMaxStoredTeachers) + " teachers");
  }
  std::set<std::string> names;
  for (const json& e : *t) {
    if (!e.is_object()) return BadServices(key, "a teacher is not an object");
    ServicesState::Teacher x;
    sv::Reader tr(e, key);
    tr.Str("name", &x.name, proto::kMaxNameBytes)
        .Str("service", &x.service, proto::kMaxNameBytes)
        .Str("node", &x.node, proto::kMaxNameBytes);
    EDL_RETURN_IF_ERROR(tr.status());
    if (!proto::IsValidName(x.name) || !proto::IsValidName(x.service) ||
        !proto::IsValidName(x.node)) {
      return BadServices(key, "a teacher's name, service or node is not a valid name");
    }
    if (!names.insert(x.name).second)
      return BadServices(key, "teacher '" + x.name + "' is listed twice");
    s.teachers.push_back(std::move(x));
  }
  *out = std::move(s);
  return Status::OK();
}

}  // namespace edl::jobserver
