// Layout and encoding: jobserver/state/STATE.md.
#include "jobserver/state/job_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <unordered_set>

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <nlohmann/json.hpp>

#include "jobserver/state/state_value.h"

namespace edl::jobserver {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using state_value::Fix;
using state_value::kMaxI64;
using state_value::ParseValue;
using state_value::Reader;

std::string NodeKey(const std::string& name) { return kNodeKeyPrefix + name; }

}  // namespace

std::string JobKeyPrefix(const std::string& job_id) { return "job/" + job_id + "/"; }

// ---- values

std::string EncodeJobMeta(const JobState& s) {
  json j = {{"v", kStateFormatVersion},
            {"job_id", s.job_id},
            {"max_generation", s.max_generation},
            {"next_trainer_seq", s.next_trainer_seq},
            {"desired", s.desired},
            {"desired_reason", s.desired_reason},
            {"need_grow_back", s.need_grow_back},
            {"done", s.done},
            {"clock_started", s.clock_started},
            {"scale_elapsed_us", s.scale_elapsed_us},
            {"script_next", s.script_next},
            {"script_offset_us", s.script_offset_us},
            {"demo_size", s.demo_size},
            {"demo_steps", s.demo_steps}};
  if (!s.leaving.empty()) j["leaving"] = s.leaving;
  if (!s.config.empty()) j["config"] = s.config;
  return j.dump();
}

Status DecodeJobMeta(const std::string& key, const std::string& value, JobState* s) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  JobState t = *s;
  Reader r(j, key);
  r.Str("job_id", &t.job_id, proto::kMaxNameBytes)
      .Int("max_generation", &t.max_generation, 0, kMaxI64)
      .Int("next_trainer_seq", &t.next_trainer_seq, 1, kMaxI64)
      .Int("desired", &t.desired, 0, INT32_MAX)
      .Str("desired_reason", &t.desired_reason, 64)
      .Bool("need_grow_back", &t.need_grow_back)
      .Bool("done", &t.done)
      .Bool("clock_started", &t.clock_started)
      .Int("scale_elapsed_us", &t.scale_elapsed_us, 0, kMaxI64)
      .Int("script_next", &t.script_next, 0, INT32_MAX)
      .Int("script_offset_us", &t.script_offset_us, 0, kMaxI64)
      .Int("demo_size", &t.demo_size, 0, INT32_MAX)
      .Int("demo_steps", &t.demo_steps, 0, kMaxI64);
  if (r.ok() && !proto::IsValidName(t.job_id)) r.Fail("job_id", "is not a valid job name");
  EDL_RETURN_IF_ERROR(r.status());
  t.leaving.clear();
  t.config.clear();
  EDL_RETURN_IF_ERROR(Reader(j, key).Str("config", &t.config, 2048, /*required=*/false).status());
  if (const auto lv = j.find("leaving");
      lv != j.end()) {  // absent in values written before it was kept
    if (!lv->is_object() || lv->size() > kMaxLeavingKept) {
      return Status::Corruption("stored field 'leaving' is not an object of at most " +
                                std::to_string(kMaxLeavingKept) + " trainers" + Fix(key));
    }
    for (const auto& [id, node] : lv->items()) {
      if (!proto::IsValidName(id) || !node.is_string() ||
          !proto::IsValidName(node.get<std::string>())) {
        return Status::Corruption("stored field 'leaving' holds an invalid trainer or node" +
                                  Fix(key));
      }
      t.leaving[id] = node.get<std::string>();
    }
  }
  *s = std::move(t);
  return Status::OK();
}

std::string EncodeGeneration(const JobState& s) {
  json j;
  s.current.EncodeTo(&j);
  j.erase("type");
  j["v"] = kStateFormatVersion;
  j["finished"] = s.finished;
  return j.dump();
}

Status DecodeGeneration(const std::string& key, const std::string& value, JobState* s) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  proto::GenerationInfo g;
  Status st = g.DecodeFrom(j);
  if (!st.ok()) return Status::Corruption("stored generation: " + st.message() + Fix(key));
  const auto f = j.find("finished");
  if (f == j.end() || !f->is_array() || f->size() > g.members.size()) {
    return Status::Corruption("stored generation's 'finished' is not a list of its members" +
                              Fix(key));
  }
  std::vector<std::string> finished;
  for (const json& id : *f) {
    if (!id.is_string() || g.Find(id.get<std::string>()) == nullptr) {
      return Status::Corruption("stored generation's 'finished' names a non-member" + Fix(key));
    }
    finished.push_back(id.get<std::string>());
  }
  // Ranks are positions; ids unique (the scheduler relies on both).
  std::unordered_set<std::string> ids;
  for (size_t i = 0; i < g.members.size(); ++i) {
    if (g.members[i].rank != static_cast<int>(i) || !ids.insert(g.members[i].trainer_id).second) {
      return Status::Corruption(
          "stored generation's members are not ranked 0..n-1 with unique ids" + Fix(key));
    }
  }
  s->current = std::move(g);
  s->finished = std::move(finished);
  return Status::OK();
}

std::string EncodeNode(const NodeState& n) {
  json j = {{"v", kStateFormatVersion}, {"name", n.name},
            {"host", n.host},           {"mode", proto::NameOf(proto::NodeModeOf(n.restart_mode))},
            {"slots", n.slots},         {"order", n.order},
            {"session", n.session}};
  return j.dump();
}

Status DecodeNode(const std::string& key, const std::string& value, NodeState* n) {
  json j;
  EDL_RETURN_IF_ERROR(ParseValue(key, value, &j));
  NodeState t;
  std::string mode;
  Reader r(j, key);
  r.Str("name", &t.name, proto::kMaxNameBytes)
      .Str("host", &t.host, proto::kMaxHostBytes)
      .Str("mode", &mode, 16)
      .Int("order", &t.order, 0, INT32_MAX)
      .Str("session", &t.session, proto::kSessionTokenBytes);
  if (r.ok() && (!proto::IsValidName(t.name) || key != NodeKey(t.name)))
    r.Fail("name", "does not match its key");
  if (r.ok() && !proto::IsValidHost(t.host)) r.Fail("host", "is not a host name or address");
  proto::NodeMode parsed = proto::NodeMode::kInplace;
  if (r.ok() && !proto::kNodeModeNames.Parse(mode, &parsed))
    r.Fail("mode", "is not " + proto::kNodeModeNames.List("'"));
  const auto sl = j.find("slots");
  if (r.ok() &&
      (sl == j.end() || !sl->is_array() || sl->empty() || sl->size() > proto::kMaxSlotsPerNode)) {
    r.Fail("slots", "is not a non-empty list of slots");
  }
  EDL_RETURN_IF_ERROR(r.status());
  std::unordered_set<int> seen;
  for (const json& x : *sl) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > 1'000'000 ||
        !seen.insert(x.get<int>()).second) {
      return Status::Corruption("stored field 'slots' holds an invalid or repeated slot" +
                                Fix(key));
    }
    t.slots.push_back(x.get<int>());
  }
  t.restart_mode = parsed == proto::NodeMode::kRestart;
  *n = std::move(t);
  return Status::OK();
}

// ---- the RocksDB backend

namespace {

class RocksDbBackend : public StateBackend {
 public:
  RocksDbBackend(std::string dir, rocksdb::DB* db) : dir_(std::move(dir)), db_(db) {}

  Status Get(const std::string& key, std::string* value, bool* found) override {
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    const rocksdb::Status rs = db_->Get(ro, key, value);
    *found = rs.ok();
    if (rs.ok() || rs.IsNotFound()) return Status::OK();
    return Status::Corruption("reading " + key + " in " + Describe() + ": " + rs.ToString() +
                              Fix(key));
  }

  Status Scan(const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>* out) override {
    out->clear();
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      out->emplace_back(it->key().ToString(), it->value().ToString());
    }
    if (!it->status().ok()) {
      return Status::Corruption("scanning " + prefix + " in " + Describe() + ": " +
                                it->status().ToString() + Fix(prefix));
    }
    return Status::OK();
  }

  Status Write(const std::map<std::string, std::string>& puts,
               const std::vector<std::string>& deletes) override {
    rocksdb::WriteBatch batch;
    for (const std::string& key : deletes) batch.Delete(key);
    for (const auto& [key, value] : puts) batch.Put(key, value);
    rocksdb::WriteOptions wo;
    wo.sync = true;
    const rocksdb::Status rs = db_->Write(wo, &batch);
    if (!rs.ok())
      return Status::IOError("writing the job state to " + Describe() + ": " + rs.ToString());
    return Status::OK();
  }

  std::string Describe() const override { return "--state_dir " + dir_; }

 private:
  const std::string dir_;
  const std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

Status OpenRocksDbStateBackend(const std::string& dir, std::unique_ptr<StateBackend>* out,
                               bool* created) {
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  if (existed && !fs::is_directory(dir, ec)) {
    return Status::FailedPrecondition("--state_dir " + dir +
                                      " is not a directory; give a directory "
                                      "(it is created when missing)");
  }
  const bool empty = !existed || fs::is_empty(dir, ec);
  if (!existed && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError("--state_dir " + dir, errno);
  }
  if (!empty && !fs::exists(fs::path(dir) / "CURRENT", ec)) {
    return Status::Corruption(
        "--state_dir " + dir +
        " is not empty but holds no state database (no CURRENT file): it is "
        "damaged or another program's directory: move it aside (the server then starts a new job) "
        "or restore it from a backup");
  }
  rocksdb::Options o;
  o.create_if_missing = empty;
  o.error_if_exists = false;
  o.paranoid_checks = true;
  o.max_open_files = 64;
  o.keep_log_file_num = 2;
  o.max_manifest_file_size = 4 << 20;
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(o, dir, &db);
  if (!s.ok()) {
    const std::string what = "state database in --state_dir " + dir + ": " + s.ToString();
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return Status::FailedPrecondition(what +
                                        ". Another edl server uses this state directory; "
                                        "stop it first or give this one its own --state_dir");
    }
    return Status::Corruption(what +
                              ". The state directory is damaged: move it aside (the server "
                              "then starts a new job) or restore it from a backup");
  }
  *out = std::make_unique<RocksDbBackend>(dir, db);
  ::chmod(dir.c_str(), 0700);  // it holds the nodes' session tokens
  *created = empty;
  return Status::OK();
}

int64_t StateDirHolder(const std::string& dir) {
  const std::string lock = (fs::path(dir) / "LOCK").string();
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  // F_GETLK only asks. Closing the descriptor drops every POSIX lock this process holds on the
  // file, so this is never called on a directory this process has open.
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  const int rc = ::fcntl(fd, F_GETLK, &fl);
  ::close(fd);
  if (rc != 0 || fl.l_type == F_UNLCK) return -1;
  return fl.l_pid;
}

// ---- the store

StateStore::StateStore() = default;
StateStore::~StateStore() = default;

Status StateStore::Open(const std::string& dir, bool* created) {
  std::unique_ptr<StateBackend> b;
  EDL_RETURN_IF_ERROR(OpenRocksDbStateBackend(dir, &b, created));
  Open(std::move(b));
  return Status::OK();
}

void StateStore::Open(std::unique_ptr<StateBackend> backend) {
  backend_ = std::move(backend);
  dir_ = backend_->Describe();
}

Status StateStore::Scan(const std::string& prefix, std::map<std::string, std::string>* out) {
  std::vector<std::pair<std::string, std::string>> kvs;
  EDL_RETURN_IF_ERROR(backend_->Scan(prefix, &kvs));
  for (auto& [key, value] : kvs) (*out)[key] = std::move(value);
  return Status::OK();
}

Status StateStore::Write(const std::map<std::string, std::string>& puts,
                         const std::vector<std::string>& deletes) {
  return backend_->Write(puts, deletes);
}

}  // namespace edl::jobserver
