#include "jobserver/policy/job_spec.h"

#include <cstdint>
#include <sstream>

#include <boost/property_tree/ini_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include "edl/proto/frame.h"

namespace edl::jobserver {

using nlohmann::json;

namespace {

using proto::Quote;

Status JobNameProblem(const std::string& what, const std::string& s) {
  return proto::CheckName(what, s, kMaxJobNameBytes);
}

Status ParseInt(const std::string& key, const std::string& v, int64_t lo, int64_t hi,
                int64_t* out) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || x < lo || x > hi) {
    return Status::InvalidArgument("JOB.ini key '" + key + "' = " + Quote(v) +
                                   ": need an integer in " + std::to_string(lo) + ".." +
                                   std::to_string(hi));
  }
  *out = x;
  return Status::OK();
}

}  // namespace

std::string FlagNameProblem(const std::string& name) {
  if (proto::IsValidFlagName(name)) return "";
  return "flag name " + Quote(name) + ": use 1.." + std::to_string(proto::kMaxFlagNameBytes) +
         " of a-z, 0-9 and '_', starting with a letter";
}

std::string FlagValueProblem(const std::string& name, const std::string& value) {
  if (proto::IsValidFlagValue(value)) return "";
  return "flag '" + name + "' value is over " + std::to_string(proto::kMaxFlagValueBytes) +
         " bytes or holds a control or non-ASCII byte";
}

Status ParseJobIni(const std::string& text, JobSpec* out) {
  namespace pt = boost::property_tree;
  pt::ptree tree;
  try {
    std::istringstream in(text);
    pt::read_ini(in, tree);
  } catch (const pt::ini_parser_error& e) {
    return Status::InvalidArgument("JOB.ini: " + std::string(e.what()));
  }
  JobSpec s;
  s.job.min_trainers = s.job.max_trainers = 0;
  bool has_min = false, has_max = false;
  for (const auto& [key, node] : tree) {
    if (key == "flags") {
      for (const auto& [flag, v] : node) {
        if (s.flags.size() >= proto::kMaxSettableFlags) {
          return Status::InvalidArgument("JOB.ini [flags]: more than " +
                                         std::to_string(proto::kMaxSettableFlags) + " flags");
        }
        s.flags[flag] = v.get_value<std::string>();
      }
      continue;
    }
    if (!node.empty())
      return Status::InvalidArgument("JOB.ini: unknown section [" + key + "]; only [flags]");
    const std::string v = node.get_value<std::string>();
    int64_t x = 0;
    if (key == "name") {
      s.job.name = v;
    } else if (key == "type") {
      s.job.type = v;
    } else if (key == "min") {
      EDL_RETURN_IF_ERROR(ParseInt(key, v, 1, kMaxJobTrainers, &x));
      s.job.min_trainers = static_cast<int>(x);
      has_min = true;
    } else if (key == "max") {
      EDL_RETURN_IF_ERROR(ParseInt(key, v, 1, kMaxJobTrainers, &x));
      s.job.max_trainers = static_cast<int>(x);
      has_max = true;
    } else if (key == "priority") {
      EDL_RETURN_IF_ERROR(ParseInt(key, v, 1, kMaxJobPriority, &x));
      s.job.priority = static_cast<int>(x);
    } else if (key == "deadline_s") {
      EDL_RETURN_IF_ERROR(ParseInt(key, v, 0, int64_t{10} * 365 * 86400, &s.deadline_s));
    } else if (key == "mode") {
      if (v != "elastic" && v != "restart") {
        return Status::InvalidArgument("JOB.ini key 'mode' = " + Quote(v) +
                                       ": use elastic or restart");
      }
      s.job.elastic = v == "elastic";
    } else {
      return Status::InvalidArgument(
          "JOB.ini: unknown key " + Quote(key) +
          "; the keys are name, type, min, max, priority, deadline_s, mode "
          "and a [flags] section");
    }
  }
  if (!has_min || !has_max)
    return Status::InvalidArgument("JOB.ini: give both min and max trainers");
  *out = std::move(s);
  return Status::OK();
}

json EncodeJobSpec(const JobSpec& s) {
  return {{"name", s.job.name},         {"type", s.job.type},
          {"min", s.job.min_trainers},  {"max", s.job.max_trainers},
          {"priority", s.job.priority}, {"mode", s.job.elastic ? "elastic" : "restart"},
          {"deadline_s", s.deadline_s}, {"flags", s.flags}};
}

Status DecodeJobSpec(const json& j, JobSpec* out) {
  auto bad = [](const std::string& why) {
    return Status::InvalidArgument("submitted job: " + why);
  };
  if (!j.is_object()) return bad("is not a JSON object");
  static const std::set<std::string> kKeys = {"name",     "type", "min",        "max",
                                              "priority", "mode", "deadline_s", "flags"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kKeys.count(it.key())) return bad("unknown field " + Quote(it.key()));
  }
  auto str = [&](const char* k, std::string* v) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string())
      return bad(std::string("field '") + k + "' is missing or not a string");
    *v = it->get<std::string>();
    return Status::OK();
  };
  auto num = [&](const char* k, int64_t lo, int64_t hi, int64_t* v) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number_integer())
      return bad(std::string("field '") + k + "' is missing or not an integer");
    const int64_t x =
        it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
            ? hi + 1
            : it->get<int64_t>();
    if (x < lo || x > hi) {
      return bad(std::string("field '") + k + "' is out of range " + std::to_string(lo) + ".." +
                 std::to_string(hi));
    }
    *v = x;
    return Status::OK();
  };
  JobSpec s;
  std::string mode;
  int64_t mn = 0, mx = 0, prio = 0;
  EDL_RETURN_IF_ERROR(str("name", &s.job.name));
  EDL_RETURN_IF_ERROR(JobNameProblem("job name", s.job.name));
  EDL_RETURN_IF_ERROR(str("type", &s.job.type));
  EDL_RETURN_IF_ERROR(JobNameProblem("job type", s.job.type));
  EDL_RETURN_IF_ERROR(num("min", 1, kMaxJobTrainers, &mn));
  EDL_RETURN_IF_ERROR(num("max", 1, kMaxJobTrainers, &mx));
  EDL_RETURN_IF_ERROR(num("priority", 1, kMaxJobPriority, &prio));
  EDL_RETURN_IF_ERROR(num("deadline_s", 0, int64_t{10} * 365 * 86400, &s.deadline_s));
  EDL_RETURN_IF_ERROR(str("mode", &mode));
  if (mode != "elastic" && mode != "restart") return bad("field 'mode' is not elastic or restart");
  s.job.min_trainers = static_cast<int>(mn);
  s.job.max_trainers = static_cast<int>(mx);
  s.job.priority = static_cast<int>(prio);
  s.job.elastic = mode == "elastic";
  auto f = j.find("flags");
  if (f == j.end() || !f->is_object()) return bad("field 'flags' is missing or not an object");
  if (f->size() > proto::kMaxSettableFlags) {
    return bad("sets " + std::to_string(f->size()) + " flags; the limit is " +
               std::to_string(proto::kMaxSettableFlags));
  }
  for (auto it = f->begin(); it != f->end(); ++it) {
    std::string why = FlagNameProblem(it.key());
    if (why.empty() && !it->is_string()) why = "flag '" + it.key() + "' value is not a string";
    if (why.empty()) why = FlagValueProblem(it.key(), it->get<std::string>());
    if (!why.empty()) return bad(why);
    s.flags[it.key()] = it->get<std::string>();
  }
  *out = std::move(s);
  return Status::OK();
}

Status CheckJobSpec(const JobSpec& spec, const std::map<std::string, JobTypeOffer>& offers,
                    const std::set<std::string>& configured_types,
                    const std::string& checkpoint_root) {
  const JobSubmission& j = spec.job;
  EDL_RETURN_IF_ERROR(JobNameProblem("job name", j.name));
  if (j.min_trainers > j.max_trainers) {
    return Status::InvalidArgument("job " + j.name + ": min " + std::to_string(j.min_trainers) +
                                   " > max " + std::to_string(j.max_trainers) +
                                   "; give min <= max");
  }
  if (!j.elastic && j.min_trainers != j.max_trainers) {
    return Status::InvalidArgument("job " + j.name +
                                   ": a restart-mode job runs at a fixed size; give min = max");
  }
  auto it = offers.find(j.type);
  if (it == offers.end() && !configured_types.count(j.type)) {
    std::string known;
    for (const auto& [name, o] : offers) known += (known.empty() ? "" : ", ") + name;
    return Status::NotFound("job " + j.name + ": no node offers job type " + Quote(j.type) +
                            " (offered: " + (known.empty() ? "none" : known) +
                            "); add `job_type = " + j.type +
                            " = COMMAND...` to the nodes' client "
                            "configuration, or pick an offered type");
  }
  for (const auto& [flag, value] : spec.flags) {
    std::string why = FlagNameProblem(flag);
    if (why.empty()) why = FlagValueProblem(flag, value);
    if (why.empty() && (it == offers.end() || !it->second.settable.count(flag))) {
      std::string settable;
      if (it != offers.end()) {
        for (const auto& s : it->second.settable) settable += (settable.empty() ? "" : ", ") + s;
      }
      why = "job type " + j.type + " does not declare flag '" + flag +
            "' settable (settable: " + (settable.empty() ? "none" : settable) +
            "); drop it, or add it to `job_flags = " + j.type +
            " = ...` in the nodes' client configuration";
    }
    if (why.empty() && flag == proto::kCheckpointDirFlag)
      why = proto::CheckpointDirProblem(value, checkpoint_root);
    if (!why.empty()) return Status::InvalidArgument("job " + j.name + ": " + why);
  }
  return Status::OK();
}

}  // namespace edl::jobserver
