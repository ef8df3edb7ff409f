// Layout and encoding: jobserver/state/STATE.md, "A cluster server".
#include "jobserver/state/cluster_state.h"

#include <set>

#include <nlohmann/json.hpp>

#include "jobserver/state/state_value.h"

namespace edl::jobserver {

using nlohmann::json;
using state_value::Fix;
using state_value::kMaxI64;
using state_value::ParseValue;
using state_value::Reader;

namespace {

constexpr char kClusterMetaKey[] = "cluster/meta";
constexpr char kNodeTypesPrefix[] = "cluster/node_types/";
constexpr char kServicesKey[] = "cluster/services";
constexpr size_t kMaxEndedKept = 10000;
constexpr size_t kMaxSlotsValue = 1'000'000;

Status Bad(const std::string& key, const std::string& why) {
  return Status::Corruption("stored " + why + Fix(key));
}

// A list of distinct slot numbers, at most kMaxSlotsPerNode of them.
Status DecodeSlots(const std::string& key, const json& j, std::vector<int>* out) {
  if (!j.is_array() || j.empty() || j.size() > proto::kMaxSlotsPerNode)
    return Bad(key, "slots are not a list of slots");
  std::set<int> seen;
  for (const json& x : j) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        x.get<int64_t>() > static_cast<int64_t>(kMaxSlotsValue) ||
        !seen.insert(x.get<int>()).second) {
      return Bad(key, "slots hold an invalid or repeated slot");
    }
    out->push_back(x.get<int>());
  }
  return Status::OK();
}

std::string EncodeMeta(const ClusterState& s) {
  json ended = json::array();
  for (const EndedJob& e : s.ended) {
    ended.push_back(
        {{"name", e.name}, {"type", e.type}, {"state", e.state}, {"generation", e.generation}});
  }
  return json{{"v", kClusterLayoutVersion},
              {"one_job", s.one_job},
              {"trainer_seq", s.trainer_seq},
              {"submitted_jobs", s.submitted},
              {"ended", ended}}
      .dump();
}

Status DecodeMeta(const std::string& key, const std::string& value, ClusterState* s) {
  json j;
  int version = 0;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j, kClusterLayoutVersion, &version));
  Reader r(j, key);
  r.Int("trainer_seq", &s->trainer_seq, 1, kMaxI64)
      .Int("submitted_jobs", &s->submitted, 0, INT32_MAX);
  if (version >= 2)
    r.Str("one_job", &s->one_job, kMaxJobNameBytes);  // version 1: a cluster server's
  if (r.ok() && !s->one_job.empty() &&
      !proto::CheckName("job", s->one_job, kMaxJobNameBytes).ok()) {
    r.Fail("one_job", "is not a valid job name");
  }
  EDL_RETURN_IF_ERROR(r.status());
  const auto ended = j.find("ended");
  if (ended == j.end() || !ended->is_array() || ended->size() > kMaxEndedKept) {
    return Bad(key, "'ended' is not a list of ended jobs");
  }
  for (const json& e : *ended) {
    if (!e.is_object()) return Bad(key, "'ended' holds a value that is not an object");
    EndedJob x;
    Reader er(e, key);
    er.Str("name", &x.name, kMaxJobNameBytes)
        .Str("type", &x.type, kMaxPolicyNameBytes)
        .Str("state", &x.state, 16)
        .Int("generation", &x.generation, 0, kMaxI64);
    if (er.ok() && x.state != "finished" && x.state != "cancelled")
      er.Fail("state", "is not finished or cancelled");
    if (er.ok() && !proto::IsValidName(x.name)) er.Fail("name", "is not a valid job name");
    EDL_RETURN_IF_ERROR(er.status());
    s->ended.push_back(std::move(x));
  }
  return Status::OK();
}

std::string EncodeTypes(const ClusterNodeState& n) {
  json types = json::array();
  for (const JobTypeOffer& t : n.types)
    types.push_back({{"name", t.name}, {"settable", t.settable}});
  return json{{"v", kStateFormatVersion}, {"name", n.node.name}, {"types", types}}.dump();
}

Status DecodeTypes(const std::string& key, const std::string& value, ClusterNodeState* n) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  std::string name;
  EDL_RETURN_IF_ERROR(Reader(j, key).Str("name", &name, proto::kMaxNameBytes).status());
  if (key != kNodeTypesPrefix + name) return Bad(key, "node name does not match its key");
  const auto types = j.find("types");
  if (types == j.end() || !types->is_array() || types->empty() ||
      types->size() > kMaxPolicyTypesPerNode) {
    return Bad(key, "'types' is not a list of job types");
  }
  for (const json& t : *types) {
    JobTypeOffer o;
    if (!t.is_object()) return Bad(key, "job type that is not an object");
    EDL_RETURN_IF_ERROR(Reader(t, key).Str("name", &o.name, kMaxPolicyNameBytes).status());
    if (!proto::IsValidName(o.name)) return Bad(key, "job type name is not a valid name");
    const auto settable = t.find("settable");
    if (settable == t.end() || !settable->is_array() || settable->size() > 64) {
      return Bad(key, "job type's 'settable' is not a list of flags");
    }
    for (const json& f : *settable) {
      if (!f.is_string() || !FlagNameProblem(f.get<std::string>()).empty())
        return Bad(key, "settable flag name");
      o.settable.insert(f.get<std::string>());
    }
    n->types.push_back(std::move(o));
  }
  return Status::OK();
}

std::string EncodeSpec(const ClusterJobState& j) {
  return json{{"v", kStateFormatVersion},
              {"spec", EncodeJobSpec(j.spec)},
              {"seq", j.seq},
              {"port_index", j.port_index}}
      .dump();
}

Status DecodeSpec(const std::string& key, const std::string& value, ClusterJobState* out) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  EDL_RETURN_IF_ERROR(Reader(j, key)
                          .Int("seq", &out->seq, 1, kMaxI64)
                          .Int("port_index", &out->port_index, 0, kJobPortRanges - 1)
                          .status());
  const auto spec = j.find("spec");
  if (spec == j.end()) return Bad(key, "job has no 'spec'");
  Status st = DecodeJobSpec(*spec, &out->spec);
  if (!st.ok()) return Bad(key, "job spec: " + st.message());
  return Status::OK();
}

std::string EncodePlacement(const ClusterJobState& j) {
  return json{{"v", kStateFormatVersion},
              {"running", j.running},
              {"cap", j.cap},
              {"slots", j.slots},
              {"deadline_left_us", j.deadline_left_us},
              {"deadline_reported", j.deadline_reported}}
      .dump();
}

Status DecodePlacement(const std::string& key, const std::string& value, ClusterJobState* out) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  EDL_RETURN_IF_ERROR(Reader(j, key)
                          .Bool("running", &out->running)
                          .Int("cap", &out->cap, 0, kMaxJobTrainers)
                          .Int("deadline_left_us", &out->deadline_left_us, 0, kMaxDeadlineLeftUs)
                          .Bool("deadline_reported", &out->deadline_reported)
                          .status());
  const auto slots = j.find("slots");
  if (slots == j.end() || !slots->is_object() || slots->size() > kMaxPolicyNodes) {
    return Bad(key, "'slots' is not an object of node -> slots");
  }
  for (const auto& [node, list] : slots->items()) {
    if (!proto::IsValidName(node)) return Bad(key, "'slots' names an invalid node");
    EDL_RETURN_IF_ERROR(DecodeSlots(key, list, &out->slots[node]));
  }
  if (out->running == out->slots.empty())
    return Bad(key, "placement: a running job holds slots, a pending one none");
  return Status::OK();
}

}  // namespace

std::map<std::string, std::string> EncodeClusterState(const ClusterState& s) {
  std::map<std::string, std::string> kv;
  kv[kClusterMetaKey] = EncodeMeta(s);
  kv[kServicesKey] = EncodeServices(s.services);
  for (const auto& [name, n] : s.nodes) {
    kv[kNodeKeyPrefix + name] = EncodeNode(n.node);
    if (!n.types.empty())
      kv[kNodeTypesPrefix + name] = EncodeTypes(n);  // a one-job server's nodes offer none
  }
  for (const auto& [name, j] : s.jobs) {
    const std::string prefix = JobKeyPrefix(name);
    if (name != s.one_job)
      kv[prefix + "spec"] = EncodeSpec(j);  // the one job's flags are the server's
    kv[prefix + "placement"] = EncodePlacement(j);
    kv[prefix + "meta"] = EncodeJobMeta(j.sched);
    kv[prefix + "generation"] = EncodeGeneration(j.sched);
  }
  return kv;
}

Status DecodeClusterState(const std::map<std::string, std::string>& kv, ClusterState* out,
                          bool* found) {
  ClusterState s;
  *found = false;
  auto meta = kv.find(kClusterMetaKey);
  if (meta == kv.end()) {
    for (const auto& [key, value] : kv) {
      if (key.rfind("job/", 0) == 0) {
        return Status::Corruption(
            "the state store holds a single-job server's job (key '" + key +
            "', the old one-job layout) and no cluster: give the cluster server its own "
            "--state_dir");
      }
    }
    *out = std::move(s);
    return Status::OK();
  }
  EDL_RETURN_IF_ERROR(DecodeMeta(meta->first, meta->second, &s));
  std::map<std::string, std::map<std::string, const std::string*>>
      job_keys;  // job -> part -> value
  for (const auto& [key, value] : kv) {
    if (key == kClusterMetaKey) continue;
    if (key == kServicesKey) {
      EDL_RETURN_IF_ERROR(DecodeServices(key, value, &s.services));
      continue;
    }
    if (key.rfind(kNodeKeyPrefix, 0) == 0) {
      NodeState n;
      EDL_RETURN_IF_ERROR(DecodeNode(key, value, &n));
      s.nodes[n.name].node = std::move(n);
    } else if (key.rfind(kNodeTypesPrefix, 0) == 0) {
      ClusterNodeState& n = s.nodes[key.substr(sizeof(kNodeTypesPrefix) - 1)];
      EDL_RETURN_IF_ERROR(DecodeTypes(key, value, &n));
    } else if (key.rfind("job/", 0) == 0 && key.find('/', 4) != std::string::npos) {
      const size_t slash = key.find('/', 4);
      job_keys[key.substr(4, slash - 4)][key.substr(slash + 1)] = &value;
    } else {
      return Bad(key, "key is not part of a cluster's state");
    }
  }
  for (const auto& [name, n] : s.nodes) {
    if (n.node.name != name || (n.types.empty() && s.one_job.empty())) {
      return Bad(kNodeKeyPrefix + name, "node lacks its value or its job types");
    }
  }
  if (!s.one_job.empty() && !job_keys.count(s.one_job))
    return Bad(kClusterMetaKey, "server's one job has no keys");
  for (const auto& [name, parts] : job_keys) {
    const std::string prefix = JobKeyPrefix(name);
    const bool own = name == s.one_job;  // no spec: its flags are the server's
    for (const char* part : {"spec", "placement", "meta", "generation"}) {
      if (!parts.count(part) && !(own && std::string(part) == "spec")) {
        return Bad(prefix + part, "job '" + name + "' lacks this key");
      }
    }
    if (parts.size() != (own ? 3u : 4u))
      return Bad(prefix, "job '" + name + "' has a key that is not part of a job");
    ClusterJobState& j = s.jobs[name];
    if (own) {
      j.spec.job.name = name;
    } else {
      EDL_RETURN_IF_ERROR(DecodeSpec(prefix + "spec", *parts.at("spec"), &j));
    }
    EDL_RETURN_IF_ERROR(DecodePlacement(prefix + "placement", *parts.at("placement"), &j));
    EDL_RETURN_IF_ERROR(DecodeJobMeta(prefix + "meta", *parts.at("meta"), &j.sched));
    EDL_RETURN_IF_ERROR(DecodeGeneration(prefix + "generation", *parts.at("generation"), &j.sched));
    if (j.spec.job.name != name || j.sched.job_id != name || j.sched.current.job_id != name) {
      return Bad(prefix + "spec", "job name differs from its key");
    }
    if (j.sched.current.generation > j.sched.max_generation) {
      return Bad(prefix + "generation", "generation is above the issued maximum");
    }
    for (const auto& [node, slots] : j.slots) {
      if (!s.nodes.count(node))
        return Bad(prefix + "placement", "placement names a node the cluster does not hold");
    }
  }
  *out = std::move(s);
  *found = true;
  return Status::OK();
}

Status DecodeOneJobLayout(const std::map<std::string, std::string>& kv, const std::string& job,
                          ClusterState* out, bool* found) {
  *found = false;
  const std::string prefix = JobKeyPrefix(job);
  auto value = [&](const std::string& part) -> const std::string* {
    auto it = kv.find(prefix + part);
    return it == kv.end() ? nullptr : &it->second;
  };
  if (value("meta") == nullptr) return Status::OK();
  ClusterState s;
  s.one_job = job;
  ClusterJobState& j = s.jobs[job];
  j.spec.job.name = job;
  JobState& st = j.sched;
  EDL_RETURN_IF_ERROR(DecodeJobMeta(prefix + "meta", *value("meta"), &st));
  if (st.job_id != job) return Bad(prefix + "meta", "job id differs from its key");
  if (value("generation") == nullptr)
    return Bad(prefix + "generation", "job '" + job + "' has metadata but no generation");
  EDL_RETURN_IF_ERROR(DecodeGeneration(prefix + "generation", *value("generation"), &st));
  if (st.current.generation > st.max_generation || st.current.job_id != job) {
    return Bad(prefix + "generation", "generation is above the issued maximum or of another job");
  }
  if (const std::string* services = value("services")) {
    EDL_RETURN_IF_ERROR(DecodeServices(prefix + "services", *services, &s.services));
  }
  s.trainer_seq = st.next_trainer_seq;
  for (const auto& [key, v] : kv) {
    if (key.rfind(kNodeKeyPrefix, 0) != 0) continue;
    NodeState n;
    EDL_RETURN_IF_ERROR(DecodeNode(key, v, &n));
    j.slots[n.name] = n.slots;  // the one job holds every slot of every node
    s.nodes[n.name].node = std::move(n);
  }
  j.running = !j.slots.empty();
  *out = std::move(s);
  *found = true;
  return Status::OK();
}

Status ClusterStateWriter::Load(const std::string& one_job, ClusterState* s, bool* found,
                                bool* migrated) {
  std::map<std::string, std::string> kv;
  EDL_RETURN_IF_ERROR(store_->Scan("cluster/", &kv));
  EDL_RETURN_IF_ERROR(store_->Scan("job/", &kv));
  *migrated = false;
  if (!one_job.empty() && kv.count(kClusterMetaKey) == 0) {
    EDL_RETURN_IF_ERROR(DecodeOneJobLayout(kv, one_job, s, found));
    for (const auto& [key, value] : kv) {
      if (!*found && key.rfind("job/", 0) == 0) {
        const size_t slash = key.find('/', 4);
        const std::string other =
            key.substr(4, slash == std::string::npos ? std::string::npos : slash - 4);
        return Status::FailedPrecondition("the state store holds job " + other +
                                          " of another server; start this "
                                          "one with --job_id " +
                                          other + " to resume it, or give job " + one_job +
                                          " its own --state_dir");
      }
    }
    *migrated = *found;
  } else {
    EDL_RETURN_IF_ERROR(DecodeClusterState(kv, s, found));
  }
  written_ = std::move(kv);
  return Status::OK();
}

Status ClusterStateWriter::Save(const ClusterState& s) {
  std::map<std::string, std::string> now = EncodeClusterState(s);
  std::map<std::string, std::string> puts;
  std::vector<std::string> deletes;
  for (const auto& [key, value] : written_) {
    if (!now.count(key)) deletes.push_back(key);
  }
  for (const auto& [key, value] : now) {
    auto old = written_.find(key);
    if (old == written_.end() || old->second != value) puts[key] = value;
  }
  if (puts.empty() && deletes.empty()) return Status::OK();
  EDL_RETURN_IF_ERROR(store_->Write(puts, deletes));
  written_ = std::move(now);
  return Status::OK();
}

}  // namespace edl::jobserver
