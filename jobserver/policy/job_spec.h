// JobSpec: one submitted job (`edl ctl submit JOB.ini`), and the checks that decide whether the
// cluster takes it (docs/CLUSTER.md, "Jobs").
//
// A job names a job *type*; the command that runs it never travels: each node's client holds
// `job_type = NAME = COMMAND...` in its own configuration, with the flags of that type a submission
// may set (`job_flags = NAME = epochs,batch,lr,checkpoint_dir`). A submission sets only those;
// its values reach the trainer as `--flag=value` arguments after the type's command (one argv
// element each: no shell ever sees them). `checkpoint_dir`, when set, must be an absolute path
// under the cluster's checkpoint root.
//
// Every field may come from a peer: DecodeFrom bounds every size before use, and every refusal
// names the field, the problem and the fix.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobserver/policy/cluster_policy.h"

namespace edl::jobserver {

constexpr size_t kMaxJobNameBytes = 48;  // leaves room for "<job>/" scopes and file names

struct JobSpec {
  JobSubmission job;                         // name, type, min/max, priority, mode, deadline
  int64_t deadline_s = 0;                    // as submitted: seconds after submission; 0: none
  std::map<std::string, std::string> flags;  // settable flags of the type, by name
};

// A job type as a node offers it: the name and the flags a submission may set. (The command
// stays on the node.)
struct JobTypeOffer {
  std::string name;
  std::set<std::string> settable;
};

// Parses a JOB.ini: top-level keys `name`, `type`, `min`, `max`, `priority` (default 1),
// `deadline_s` (optional), `mode` (`elastic`, the default, or `restart`), and a `[flags]` section
// of flag = value. Unknown keys are refused (a typo must not be dropped silently).
Status ParseJobIni(const std::string& text, JobSpec* out);

// The wire form inside a ctl `submit` frame, and its strict decoding (bounded sizes, names and
// values checked, unknown fields refused).
nlohmann::json EncodeJobSpec(const JobSpec& spec);
Status DecodeJobSpec(const nlohmann::json& j, JobSpec* out);

// Whether `spec` may run on the cluster whose nodes offer `offers` (merged by type name: a flag is
// settable when every node offering the type declares it so): the type must be offered (or in
// `configured_types`, the server's list of types it expects nodes to bring), min <= max, every
// flag settable, checkpoint_dir under `checkpoint_root` (refused when the root is empty). A
// duplicate name is the policy's to refuse (ClusterPolicy::Submit).
Status CheckJobSpec(const JobSpec& spec, const std::map<std::string, JobTypeOffer>& offers,
                    const std::set<std::string>& configured_types,
                    const std::string& checkpoint_root);

// Checks one flag name / value (what a submission sets); empty when fine.
std::string FlagNameProblem(const std::string& name);
std::string FlagValueProblem(const std::string& name, const std::string& value);

}  // namespace edl::jobserver
