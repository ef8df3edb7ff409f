// The cluster server's durable state (`edl server --cluster --state_dir DIR`;
// jobserver/state/STATE.md, "A cluster server"): every submitted job (its spec, its placement, its
// JobMembership's JobState), the cluster's nodes with the job types they offered, and the jobs that
// ended. ClusterState is a plain value; the encoding (JSON with a format version, validated on
// decode as hostile bytes) and the key layout live here, apart from the single-job layout of
// job_state.h, whose value encodings (job meta, generation, node) are reused as they are.
//
// ClusterStateWriter writes a ClusterState through a StateStore as one synced batch holding only
// the keys that changed since its last write (and deletes for the keys that went away).
//
// Thread-safety: none (the server's io_context thread).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "jobserver/policy/job_spec.h"
#include "jobserver/state/job_state.h"

namespace edl::jobserver {

// Jobs take MASTER_PORT ranges base + 1000 * i for i in 0..kJobPortRanges-1, by submission.
constexpr int kJobPortRanges = 20;
// Longest deadline kept (100 years): bounds what a stored value may add to the clock.
constexpr int64_t kMaxDeadlineLeftUs = int64_t{100} * 365 * 24 * 3600 * 1'000'000;

// One live (pending or running) submitted job.
struct ClusterJobState {
  JobSpec spec;      // the one job of a one-job server: its name only (its flags are the server's)
  uint64_t seq = 0;  // submission order (the policy's tie-break)
  int port_index = 0;                             // its MASTER_PORT range: base + 1000 * port_index
  int cap = 0;                                    // the scale request (min..max)
  bool running = false;                           // the policy started it (it holds slots)
  std::map<std::string, std::vector<int>> slots;  // node -> the slots it holds there
  int64_t deadline_left_us = 0;                   // time to its deadline when saved; 0: none
  bool deadline_reported = false;
  JobState sched;  // its membership's job-level state (nodes not used: they are the cluster's)
};

// A node of the cluster: as a single-job server keeps it, plus the job types it offered.
struct ClusterNodeState {
  NodeState node;
  std::vector<JobTypeOffer> types;
};

// A job that ended (what `edl ctl jobs` lists under "ended"); never run again.
struct EndedJob {
  std::string name, type, state;  // state: finished or cancelled
  int64_t generation = 0;         // its last generation (a resubmission numbers above it)
};

// Version of the layout, kept in `cluster/meta`: 1, a cluster server's (before one-job servers
// used this layout too), 2 with `one_job`. An older edl refuses version 2 naming both.
constexpr int kClusterLayoutVersion = 2;

struct ClusterState {
  std::string one_job;       // the one job of a one-job server; empty for a cluster server
  uint64_t trainer_seq = 1;  // trainer ids issued so far use seqs below this
  int submitted = 0;         // jobs ever submitted (the monitor's SUBMITTED-JOBS)
  std::map<std::string, ClusterNodeState> nodes;
  std::map<std::string, ClusterJobState> jobs;
  std::vector<EndedJob> ended;  // oldest first
  ServicesState services;       // the teacher services (`cluster/services`)
};

// Every key and value of `s` (STATE.md "Keys").
std::map<std::string, std::string> EncodeClusterState(const ClusterState& s);
// The inverse, from every key under "cluster/" and "job/". *found: the store holds a server's
// state in this layout. Corruption naming the key and the fix for anything that is not a value of
// its kind, a job missing one of its keys, or keys of the old one-job layout; FailedPrecondition
// for another format version.
Status DecodeClusterState(const std::map<std::string, std::string>& kv, ClusterState* s,
                          bool* found);
// The old one-job layout (`job/<job>/meta|generation|services`, `cluster/nodes/<name>`, no
// `cluster/meta`) as this layout: job `job` with every node's slots, its services as the
// cluster's. *found false when `kv` holds no such job.
Status DecodeOneJobLayout(const std::map<std::string, std::string>& kv, const std::string& job,
                          ClusterState* s, bool* found);

class ClusterStateWriter {
 public:
  explicit ClusterStateWriter(StateStore* store) : store_(store) {}
  // Reads the server's keys (and remembers them as written, so the next Save rewrites what
  // differs). `one_job`: a one-job server's job, read from the old one-job layout when the store
  // holds that (*migrated then true; the next Save writes this layout and deletes the old keys).
  Status Load(const std::string& one_job, ClusterState* s, bool* found, bool* migrated);
  // Writes `s` in one synced batch: the keys whose value changed, deletes for those it lacks.
  Status Save(const ClusterState& s);

 private:
  StateStore* const store_;  // not owned
  std::map<std::string, std::string> written_;
};

}  // namespace edl::jobserver
