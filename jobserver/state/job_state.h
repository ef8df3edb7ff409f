// The job server's durable state (jobserver/state/STATE.md): what `edl server` keeps under
// --state_dir so that a restarted server resumes the running jobs instead of starting anew.
// JobState (one job's membership) and NodeState (one node) are plain values with an encoding (JSON
// with a format version, validated on decode as hostile bytes); the layout of a whole server's
// state is cluster_state.h's. StateStore keeps the keys in a StateBackend, each save one atomic,
// durable write: an embedded RocksDB under --state_dir (the default) or etcd (--state_store
// etcd://..., jobserver/state/etcd_state.h; STATE.md "Backends").
//
// Thread-safety: StateStore is not thread-safe (the server uses it from its io_context thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "jobserver/services/service_placement.h"

namespace edl::jobserver {

// Version of every value's encoding (the "v" field); see STATE.md "Versions".
constexpr int kStateFormatVersion = 1;
// Most leaving trainers a stored job may list (JobMembership keeps at most as many).
constexpr size_t kMaxLeavingKept = 65536;
// Largest stored value accepted on load (a generation of 100k members is ~10 MB).
constexpr size_t kMaxStateValueBytes = size_t{64} << 20;

// A node the scheduler knows (connected or not when saved).
struct NodeState {
  std::string name, host;
  bool restart_mode = false;
  std::vector<int> slots;
  int order = 0;        // registration order (placement fills nodes in this order)
  std::string session;  // the node's session token (64 hex), proves a re-attach
};

struct JobState {
  std::string job_id;
  // Highest generation number ever issued (committed or prepared): the next one is above it.
  int64_t max_generation = 0;
  // The committed generation (generation 0: none yet).
  proto::GenerationInfo current;
  std::vector<std::string> finished;  // members of `current` that exited 0
  bool done = false;
  uint64_t next_trainer_seq = 1;  // trainer ids "<node>-s<slot>-<seq>" use seqs below this
  int desired = 0;
  std::string desired_reason = "start";
  bool need_grow_back = false;
  // Scaling sources (scaling.h): the script's position and the policy's, and their clock.
  bool clock_started = false;    // the first generation was committed
  int64_t scale_elapsed_us = 0;  // script/policy time when saved
  uint64_t script_next = 0;
  int64_t script_offset_us = 0;
  int demo_size = 0;
  int64_t demo_steps = 0;
  // Trainers removed from the job whose exit their node has not reported yet: id -> node.
  std::map<std::string, std::string> leaving;
  // The configuration fingerprint the job's members share (their "config" events); "": unknown.
  std::string config;
  std::map<std::string, NodeState> nodes;  // by name; the old single-job layout only (migration)
  ServicesState services;  // the teacher services (`job/<job_id>/services`; absent: none)
};

// Encoding of one value (STATE.md "Values"). Decode: Corruption for bytes that are not a value
// of this kind (truncated, not JSON, a bad field), FailedPrecondition for another format version;
// both name the key and the fix.
std::string EncodeJobMeta(const JobState& s);
std::string EncodeGeneration(const JobState& s);
std::string EncodeNode(const NodeState& n);
Status DecodeJobMeta(const std::string& key, const std::string& value, JobState* s);
Status DecodeGeneration(const std::string& key, const std::string& value, JobState* s);
Status DecodeNode(const std::string& key, const std::string& value, NodeState* n);

// Keys (STATE.md "Keys").
std::string JobKeyPrefix(const std::string& job_id);  // "job/<job_id>/"
inline constexpr char kNodeKeyPrefix[] = "cluster/nodes/";

// Where StateStore keeps its keys. Implementations: RocksDB (job_state.cc), etcd (etcd_state.h).
class StateBackend {
 public:
  virtual ~StateBackend() = default;
  // *found false (and OK) when the key is absent.
  virtual Status Get(const std::string& key, std::string* value, bool* found) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual Status Scan(const std::string& prefix,
                      std::vector<std::pair<std::string, std::string>>* out) = 0;
  // Applies every put and delete together and durably, or none of them.
  virtual Status Write(const std::map<std::string, std::string>& puts,
                       const std::vector<std::string>& deletes) = 0;
  // Names the store in messages: "--state_dir DIR", "--state_store etcd://...".
  virtual std::string Describe() const = 0;
};

// The RocksDB backend in `dir` (created when missing or empty). *created: there was no state yet.
// Corruption / FailedPrecondition naming the directory and the fix when it holds something that
// is not a readable state database.
Status OpenRocksDbStateBackend(const std::string& dir, std::unique_ptr<StateBackend>* out,
                               bool* created);

// The pid of the process that holds the RocksDB state database in `dir` open (its lock on
// `dir`/LOCK, as the kernel reports it: 0 when that process runs on another host of a shared
// filesystem), or -1 when nobody holds it (also when `dir` holds no database yet). Reads the lock
// without taking it. A `--standby` server polls this (STATE.md "Standby servers").
int64_t StateDirHolder(const std::string& dir);

class StateStore {
 public:
  StateStore();
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Opens (creating when missing or empty) the database in `dir`. *created: there was no state
  // yet. Corruption / FailedPrecondition naming the directory and the fix when it holds something
  // that is not a readable state database.
  Status Open(const std::string& dir, bool* created);
  // Uses `backend` (another engine than the local RocksDB).
  void Open(std::unique_ptr<StateBackend> backend);
  // Every key starting with `prefix` and its value (the layout: cluster_state.h).
  Status Scan(const std::string& prefix, std::map<std::string, std::string>* out);
  // Puts and deletes in one synced write.
  Status Write(const std::map<std::string, std::string>& puts,
               const std::vector<std::string>& deletes);
  // "--state_dir DIR" or "--state_store etcd://...", for messages.
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::unique_ptr<StateBackend> backend_;
};

}  // namespace edl::jobserver
