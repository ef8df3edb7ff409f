#include "jobserver/http/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "edl/proto/fields.h"
#include "jobserver/events/events.h"

namespace edl::jobserver {

using nlohmann::json;

namespace {

enum StallKind { kFailure, kGrow, kShrink, kReform };
constexpr const char* kStallKinds[] = {"failure", "grow", "shrink", "reform"};
// The phases of a stall (proto::ev::StallPhases), as the phase label names them.
constexpr const char* kStallPhases[] = {"lost", "wait_generation", "agree", "reform", "sync",
                                        "eval", "first_step"};
double PhaseOf(const proto::ev::StallPhases& p, size_t i) {
  const double v[] = {p.lost, p.wait_generation, p.agree, p.reform, p.sync, p.eval, p.first_step};
  return v[i];
}

// The status body is ours, but read as if it were not: a field of another type reads as its
// default.
using proto::BoolOr;
using proto::FieldOf;
using proto::NumOr;
using proto::StrOr;

void AppendNumber(double v, std::string* out) {
  if (std::isnan(v)) {
    *out += "NaN";
  } else if (std::isinf(v)) {
    *out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    if (v == std::floor(v) && std::fabs(v) < 9e15) {
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
    } else {
      std::snprintf(buf, sizeof(buf), "%.10g", v);
    }
    *out += buf;
  }
}

// `key="value"` with the exposition format's escapes.
std::string Label(const char* key, const std::string& value) {
  std::string s = key;
  s += "=\"";
  for (char c : value) {
    if (c == '\\') {
      s += "\\\\";
    } else if (c == '"') {
      s += "\\\"";
    } else if (c == '\n') {
      s += "\\n";
    } else {
      s += c;
    }
  }
  s += '"';
  return s;
}

void Family(const char* name, const char* type, const char* help, std::string* out) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void Sample(const std::string& name, const std::string& labels, double v, std::string* out) {
  *out += name;
  if (!labels.empty()) {
    *out += '{';
    *out += labels;
    *out += '}';
  }
  *out += ' ';
  AppendNumber(v, out);
  *out += '\n';
}

// A generation reason as a label value: the job membership's own words ([a-z0-9_]), anything else
// "other".
std::string ReasonLabel(const std::string& reason) {
  if (reason.empty() || reason.size() > 32) return "other";
  for (char c : reason) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return "other";
  }
  return reason;
}

// One job as both status bodies describe it (a single-job server's, or one entry of a cluster's
// "jobs").
struct JobView {
  std::string name, state;
  double desired = 0, trainers = 0, generation = 0;
  bool reports = false;  // trainers report progress: images/s, step, epoch and loss mean something
  double ips = 0, step = 0, epoch = 0, loss = 0;
  double accuracy = -1;  // rank 0's last test accuracy (0..1); -1: none evaluated yet
  double samples = -1;   // the job's samples committed; -1: not reported
  bool rescale_pending = false;
  // What the job measures of itself (Cluster::MeasuredJson); -1: not measured.
  double noise_scale = -1, compute_s_per_sample = -1, sync_s = -1;
};

// The progress fields, named alike in both bodies (a single job's "progress", a cluster's job).
void ReadProgress(const json& p, JobView* v) {
  v->ips = NumOr(p, "images_per_sec");
  v->step = NumOr(p, "step");
  v->epoch = NumOr(p, "epoch");
  v->loss = NumOr(p, "loss");
  v->accuracy = NumOr(p, "accuracy", -1);
  v->samples = NumOr(p, "samples", -1);
  if (const json& m = FieldOf(p, "measured"); m.is_object()) {
    v->noise_scale = NumOr(m, "noise_scale", -1);
    v->compute_s_per_sample = NumOr(m, "compute_s_per_sample", -1);
    v->sync_s = NumOr(m, "sync_s", -1);
  }
}

std::vector<JobView> JobsOf(const json& status) {
  std::vector<JobView> out;
  if (!status.is_object()) return out;
  if (status.contains("job_id")) {  // a single-job server
    JobView v;
    v.name = StrOr(status, "job_id");
    v.desired = NumOr(status, "desired");
    v.trainers =
        BoolOr(status, "done") ? 0 : NumOr(status, "world_size");  // a finished job runs none
    v.generation = NumOr(status, "generation");
    v.state = BoolOr(status, "done") ? "done" : v.trainers > 0 ? "running" : "pending";
    v.rescale_pending = BoolOr(status, "pending");
    const json& p = FieldOf(status, "progress");
    v.reports = NumOr(p, "reporting") > 0;
    ReadProgress(p, &v);
    out.push_back(v);
    return out;
  }
  const auto jobs = status.find("jobs");
  if (jobs == status.end() || !jobs->is_array()) return out;
  for (const json& j : *jobs) {
    JobView v;
    v.name = StrOr(j, "name");
    v.desired = NumOr(j, "target");
    v.trainers = NumOr(j, "trainers");
    v.generation = NumOr(j, "generation");
    v.state = StrOr(j, "state") == "running" ? "running" : "pending";
    v.reports = v.state == "running" && v.trainers > 0;
    ReadProgress(j, &v);
    out.push_back(v);
  }
  return out;
}

}  // namespace

const char* FrameRefusalName(FrameRefusal r) {
  switch (r) {
    case FrameRefusal::kUnauthenticated:
      return "unauthenticated";
    case FrameRefusal::kInvalid:
      return "invalid";
    case FrameRefusal::kNotPlaced:
      return "not_placed";
    case FrameRefusal::kEventLimit:
      return "event_limit";
    case FrameRefusal::kEvicted:
      return "evicted";
    case FrameRefusal::kMalformedEvent:
      return "malformed_event";
    case FrameRefusal::kHandlerError:
      return "handler_error";
    case FrameRefusal::kCount:
      break;
  }
  return "unknown";
}

void Histogram::Observe(double v) {
  if (!std::isfinite(v) || v < 0) return;
  size_t i = 0;
  while (i < kBounds.size() && v > kBounds[i]) ++i;
  if (i < kBounds.size()) ++buckets_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string sep = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  char le[32];
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i];
    std::snprintf(le, sizeof(le), "%g", kBounds[i]);
    Sample(name + "_bucket", sep + Label("le", le), static_cast<double>(cumulative), out);
  }
  Sample(name + "_bucket", sep + Label("le", "+Inf"), static_cast<double>(count_), out);
  Sample(name + "_sum", labels, sum_, out);
  Sample(name + "_count", labels, static_cast<double>(count_), out);
}

ServerMetrics::ServerMetrics(Clock* clock)
    : clock_(clock), start_wall_us_(clock->WallMicros()), start_us_(clock->NowMicros()) {}

ServerMetrics::Job* ServerMetrics::JobFor(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    if (jobs_.size() >= kMaxJobs) {
      auto oldest = std::min_element(jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
        return a.second.last_write < b.second.last_write;
      });
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(name, Job()).first;
  }
  it->second.last_write = seq_;
  return &it->second;
}

void ServerMetrics::Keep(Job* job, json entry) {
  entry["seq"] = seq_;
  job->ring.push_back({seq_, entry.dump(-1, ' ', false, json::error_handler_t::replace)});
  if (job->ring.size() > kRingPerJob) job->ring.pop_front();
}

void ServerMetrics::OnRecord(const json& record) {
  ++seq_;
  using T = events::Type;
  const std::string type = StrOr(record, "type");
  T t{};
  if (!events::TypeOf(record, &t)) return;  // not a record of ours
  const std::string job = StrOr(record, "job");
  const double time = NumOr(record, "time");
  if (t == T::kNodeDisconnected || t == T::kNodeLost) nodes_.erase(StrOr(record, "node"));
  if (t == T::kGeneration) {
    Job* j = JobFor(job);
    std::string reason = ReasonLabel(StrOr(record, "reason"));
    if (!j->generations.count(reason) && j->generations.size() >= kMaxReasonsPerJob)
      reason = "other";
    ++j->generations[reason];
    Keep(j, {{"type", type},
             {"time", time},
             {"generation", NumOr(record, "generation")},
             {"reason", StrOr(record, "reason")},
             {"failure", BoolOr(record, "failure")},
             {"world_size_before", NumOr(record, "world_size_before")},
             {"world_size_after", NumOr(record, "world_size_after")}});
  } else if (t == T::kProgress) {
    Keep(JobFor(job), {{"type", type},
                       {"time", time},
                       {"generation", NumOr(record, "generation")},
                       {"world_size", NumOr(record, "world_size")},
                       {"images_per_sec", NumOr(record, "images_per_sec")},
                       {"loss", NumOr(record, "loss")},
                       {"step", NumOr(record, "step")},
                       {"epoch", NumOr(record, "epoch")}});
  } else if ((t == T::kTrainerExit && !BoolOr(record, "success")) || t == T::kJoinerExit) {
    Job* j = JobFor(job);
    ++j->trainer_failures;
    Keep(j, {{"type", type},
             {"time", time},
             {"trainer_id", StrOr(record, "trainer_id")},
             {"how", StrOr(record, "how")}});
  } else if (t == T::kNodeLost) {
    Keep(JobFor(job), {{"type", type}, {"time", time}, {"node", StrOr(record, "node")}});
  }
}

void ServerMetrics::TrainerEvent(const std::string& job, const proto::TrainerEventBody& event) {
  namespace ev = proto::ev;
  auto saved = [&](bool ok, int64_t saves, double seconds) {
    Job* j = JobFor(job);
    if (!ok) {
      ++j->checkpoint_failures;
      return;
    }
    j->checkpoint_saves += static_cast<uint64_t>(std::clamp<int64_t>(saves, 1, 1000));
    if (seconds >= 0) j->checkpoint_seconds.Observe(seconds);
  };
  if (const auto* e = std::get_if<ev::Stall>(&event)) {
    const StallKind kind = e->failure                         ? kFailure
                           : e->world_after > e->world_before ? kGrow
                           : e->world_after < e->world_before ? kShrink
                                                              : kReform;
    Job* j = JobFor(job);
    j->stalls[kind].Observe(e->cost_s());
    for (size_t i = 0; i < std::size(kStallPhases); ++i)
      j->stall_phases[i].Observe(PhaseOf(e->phases, i));
    // The timeline's record of it: the dashboard marks a re-form with what it cost.
    ++seq_;
    json rec = {{"type", "stall"},
                {"time", MicrosToSeconds(clock_->WallMicros())},
                {"generation", e->generation},
                {"kind", kStallKinds[kind]},
                {"world_before", e->world_before},
                {"world_after", e->world_after},
                {"stall_s", e->stall_s},
                {"cost_s", e->cost_s()}};
    for (size_t i = 0; i < std::size(kStallPhases); ++i) {
      const double v = PhaseOf(e->phases, i);
      if (v >= 0) rec[std::string(kStallPhases[i]) + "_s"] = v;
    }
    Keep(j, std::move(rec));
  } else if (const auto* e = std::get_if<ev::CheckpointSaved>(&event)) {
    saved(e->ok, e->saves, e->seconds);
  } else if (const auto* e = std::get_if<ev::StopCheckpoint>(&event)) {
    saved(e->ok, 1, -1);
  }
}

void ServerMetrics::ConnectionOpened() {
  ++connections_;
  ++connections_total_;
}
void ServerMetrics::ConnectionClosed() { --connections_; }
void ServerMetrics::FrameRefused(FrameRefusal why) {
  if (why != FrameRefusal::kCount) ++refused_[static_cast<size_t>(why)];
}
void ServerMetrics::NodeHeard(const std::string& node) {
  nodes_[node].heard_us = clock_->NowMicros();
}
void ServerMetrics::NodeStatsReported(const std::string& node, const proto::NodeStats& stats) {
  Node& n = nodes_[node];
  n.has_stats = true;
  n.stats = stats;
}
void ServerMetrics::HttpAnswered(int status_code) { ++http_answers_[status_code]; }
void ServerMetrics::HttpConnectionOpened() { ++http_connections_; }
void ServerMetrics::HttpConnectionClosed() { --http_connections_; }

std::string ServerMetrics::Recent(const std::string& job, uint64_t since) const {
  if (since > seq_) since = 0;  // numbers of an earlier server
  std::string out = "{\"job\":" + json(job).dump() + ",\"records\":[";
  uint64_t next = since;
  auto it = jobs_.find(job);
  if (it != jobs_.end()) {
    const auto& ring = it->second.ring;
    auto first = std::upper_bound(ring.begin(), ring.end(), since,
                                  [](uint64_t s, const Job::Entry& e) { return s < e.seq; });
    size_t n = 0;
    for (auto e = first; e != ring.end() && n < kMaxRecentPerReply; ++e, ++n) {
      if (n > 0) out += ',';
      out += e->json;
      next = e->seq;
    }
  }
  out += "],\"next\":" + std::to_string(next) + "}";
  return out;
}

json ServerMetrics::NodesJson() const {
  const int64_t now = clock_->NowMicros();
  json nodes = json::object();
  for (const auto& [name, n] : nodes_) {
    json& j = nodes[name];
    j = json::object();
    if (n.heard_us > 0) j["heartbeat_age_s"] = (now - n.heard_us) * 1e-6;
    if (n.has_stats && n.stats.cpu_cores > 0)
      j["cpu_utilization"] = n.stats.cpu_busy / n.stats.cpu_cores;
    if (n.has_stats && n.stats.gpu_util >= 0) j["gpu_utilization"] = n.stats.gpu_util / 100;
  }
  return {{"nodes", std::move(nodes)}};
}

std::string ServerMetrics::Render(const json& status) const {
  std::string out;
  out.reserve(4096 + nodes_.size() * 400);
  RenderJobs(status, &out);
  RenderNodes(status, &out);
  RenderServices(status, &out);
  RenderServer(status, &out);
  return out;
}

void ServerMetrics::RenderJobs(const json& status, std::string* out) const {
  const std::vector<JobView> jobs = JobsOf(status);
  // Every per-job series but the state, in one table: its family, and which jobs have a sample.
  enum class Shown {
    kAlways,
    kWithReports,   // its trainers report progress: images/s, step, epoch and loss mean something
    kWithSamples,   // they report committed samples (the counters for rate())
    kWhenMeasured,  // the value is >= 0 (-1: not measured or evaluated yet)
  };
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    double JobView::*field;
    Shown shown;
  };
  static const Series kSeries[] = {
      {"edl_job_desired_trainers", "gauge",
       "Trainers the job is asked to run (ctl, script, policy).", &JobView::desired,
       Shown::kAlways},
      {"edl_job_trainers", "gauge", "Trainers in the job's current generation (its world size).",
       &JobView::trainers, Shown::kAlways},
      {"edl_job_generation", "gauge", "The job's current generation number.", &JobView::generation,
       Shown::kAlways},
      {"edl_job_images_per_second", "gauge", "Sum of the trainers' reported images per second.",
       &JobView::ips, Shown::kWithReports},
      {"edl_job_step", "gauge", "Highest step the job's trainers reported.", &JobView::step,
       Shown::kWithReports},
      {"edl_job_epoch", "gauge", "Highest epoch the job's trainers reported.", &JobView::epoch,
       Shown::kWithReports},
      {"edl_job_loss", "gauge", "Training loss rank 0 reported last.", &JobView::loss,
       Shown::kWithReports},
      // Counters for rate(): the job's committed steps and samples, each counted once whatever
      // re-forms happened (a job resumed from an older checkpoint counts from there: a reset).
      {"edl_job_steps_total", "counter", "Optimizer steps the job committed.", &JobView::step,
       Shown::kWithSamples},
      {"edl_job_samples_total", "counter",
       "Training samples the job committed (epochs times the data set, plus the epoch's cursor).",
       &JobView::samples, Shown::kWithSamples},
      {"edl_job_test_accuracy", "gauge", "Test accuracy (0..1) of rank 0's last evaluation.",
       &JobView::accuracy, Shown::kWhenMeasured},
      // What each job measures of itself (docs/WATCHING.md).
      {"edl_job_gradient_noise_scale", "gauge",
       "The job's gradient noise scale in samples (smoothed tr(Sigma) / |G|^2 of its gradients): "
       "batches much larger than it buy little progress per sample.",
       &JobView::noise_scale, Shown::kWhenMeasured},
      {"edl_job_compute_seconds_per_sample", "gauge",
       "The members' mean forward/backward seconds per sample (smoothed).",
       &JobView::compute_s_per_sample, Shown::kWhenMeasured},
      {"edl_job_allreduce_seconds", "gauge",
       "The members' mean gradient all-reduce seconds per step at the current world size.",
       &JobView::sync_s, Shown::kWhenMeasured},
  };
  for (const Series& s : kSeries) {
    Family(s.name, s.type, s.help, out);
    for (const JobView& j : jobs) {
      const double v = j.*(s.field);
      const bool shown = s.shown == Shown::kAlways ||
                         (s.shown == Shown::kWithReports && j.reports) ||
                         (s.shown == Shown::kWithSamples && j.samples >= 0) ||
                         (s.shown == Shown::kWhenMeasured && v >= 0);
      if (shown) Sample(s.name, Label("job_name", j.name), v, out);
    }
  }
  Family("edl_job_state", "gauge",
         "1 for the job's state: pending (no trainers yet), running or done.", out);
  for (const JobView& j : jobs) {
    for (const char* s : {"pending", "running", "done"}) {
      Sample("edl_job_state", Label("job_name", j.name) + "," + Label("state", s),
             j.state == s ? 1 : 0, out);
    }
  }
  Family("edl_job_rescale_pending", "gauge",
         "1 while a grow is being prepared (hot joiners starting; single-job server).", out);
  for (const JobView& j : jobs) {
    if (status.contains("job_id"))
      Sample("edl_job_rescale_pending", Label("job_name", j.name), j.rescale_pending, out);
  }
  // Counters of the records seen since this server started.
  Family("edl_job_generations_total", "counter", "Generations committed, by reason.", out);
  for (const auto& [name, j] : jobs_) {
    for (const auto& [reason, n] : j.generations) {
      Sample("edl_job_generations_total", Label("job_name", name) + "," + Label("reason", reason),
             static_cast<double>(n), out);
    }
  }
  Family(
      "edl_job_stall_seconds", "histogram",
      "Training time a re-form cost a surviving trainer (its stall less the evaluation work inside "
      "it), one observation per survivor, by kind (failure, grow, shrink, reform).",
      out);
  for (const auto& [name, j] : jobs_) {
    for (int k = 0; k < 4; ++k) {
      if (j.stalls[k].count() > 0) {
        j.stalls[k].Render("edl_job_stall_seconds",
                           Label("job_name", name) + "," + Label("kind", kStallKinds[k]), out);
      }
    }
  }
  Family(
      "edl_job_stall_phase_seconds", "histogram",
      "The phases of the survivors' stalls (lost step, waiting for the generation, agreeing on the "
      "switch step, re-forming, syncing the state, evaluation, first step), one observation per "
      "survivor and phase.",
      out);
  for (const auto& [name, j] : jobs_) {
    for (size_t i = 0; i < std::size(kStallPhases); ++i) {
      if (j.stall_phases[i].count() > 0) {
        j.stall_phases[i].Render("edl_job_stall_phase_seconds",
                                 Label("job_name", name) + "," + Label("phase", kStallPhases[i]),
                                 out);
      }
    }
  }
  Family("edl_job_trainer_failures_total", "counter",
         "Trainers that exited with a failure (members and hot joiners).", out);
  for (const auto& [name, j] : jobs_) {
    Sample("edl_job_trainer_failures_total", Label("job_name", name),
           static_cast<double>(j.trainer_failures), out);
  }
  Family("edl_job_checkpoint_saves_total", "counter", "Checkpoints rank 0 reported saved.", out);
  for (const auto& [name, j] : jobs_) {
    Sample("edl_job_checkpoint_saves_total", Label("job_name", name),
           static_cast<double>(j.checkpoint_saves), out);
  }
  Family("edl_job_checkpoint_save_failures_total", "counter",
         "Checkpoint saves rank 0 reported failed.", out);
  for (const auto& [name, j] : jobs_) {
    Sample("edl_job_checkpoint_save_failures_total", Label("job_name", name),
           static_cast<double>(j.checkpoint_failures), out);
  }
  Family("edl_job_checkpoint_save_seconds", "histogram",
         "Time of a checkpoint save (snapshot and write).", out);
  for (const auto& [name, j] : jobs_) {
    if (j.checkpoint_seconds.count() > 0) {
      j.checkpoint_seconds.Render("edl_job_checkpoint_save_seconds", Label("job_name", name), out);
    }
  }
}

void ServerMetrics::RenderNodes(const json& status, std::string* out) const {
  const auto listed = status.find("nodes");
  const bool have_list = listed != status.end() && listed->is_array();
  const json empty = json::array();
  const json& nodes = have_list ? *listed : empty;
  Family("edl_node_slots", "gauge", "Trainer slots the node offers.", out);
  for (const json& n : nodes)
    Sample("edl_node_slots", Label("node", StrOr(n, "name")), NumOr(n, "slots"), out);
  Family("edl_node_trainers", "gauge", "Trainers of the current generation on the node.", out);
  for (const json& n : nodes)
    Sample("edl_node_trainers", Label("node", StrOr(n, "name")), NumOr(n, "used"), out);
  Family("edl_node_connected", "gauge", "1 while the node's client is connected.", out);
  for (const json& n : nodes) {
    Sample("edl_node_connected", Label("node", StrOr(n, "name")), BoolOr(n, "connected"), out);
  }
  const int64_t now = clock_->NowMicros();
  Family("edl_node_heartbeat_age_seconds", "gauge",
         "Time since the node's client last sent a frame.", out);
  for (const auto& [name, n] : nodes_) {
    if (n.heard_us > 0)
      Sample("edl_node_heartbeat_age_seconds", Label("node", name), (now - n.heard_us) * 1e-6, out);
  }
  Family("edl_node_cpu_utilization_ratio", "gauge",
         "Busy CPUs over the node's cores, 0..1 (cluster nodes).", out);
  for (const auto& [name, n] : nodes_) {
    if (n.has_stats && n.stats.cpu_cores > 0) {
      Sample("edl_node_cpu_utilization_ratio", Label("node", name),
             n.stats.cpu_busy / n.stats.cpu_cores, out);
    }
  }
  Family("edl_node_gpu_utilization_ratio", "gauge",
         "Mean GPU utilisation of the node, 0..1 (where measured).", out);
  for (const auto& [name, n] : nodes_) {
    if (n.has_stats && n.stats.gpu_util >= 0) {
      Sample("edl_node_gpu_utilization_ratio", Label("node", name), n.stats.gpu_util / 100, out);
    }
  }
}

void ServerMetrics::RenderServices(const json& status, std::string* out) const {
  const json& services = FieldOf(status, "services");
  if (!services.is_object()) return;
  struct Row {
    std::string name;
    bool has_desired;
    double desired, placed, teachers, students, requests, samples, latency, restarts;
  };
  std::vector<Row> rows;
  for (const auto& [name, s] : services.items()) {
    if (!s.is_object()) continue;
    Row r{name, false, 0, 0, 0, 0, 0, 0, -1, 0};
    r.has_desired = FieldOf(s, "desired").is_number();
    r.desired = NumOr(s, "desired");
    const json& placed = FieldOf(s, "placed");
    if (placed.is_array()) {
      for (const json& p : placed) r.placed += !BoolOr(p, "stopping");
    }
    const json& teachers =
        FieldOf(s, "teachers").is_array() ? FieldOf(s, "teachers") : json::array();
    r.teachers = static_cast<double>(teachers.size());
    double weighted = 0;
    for (const json& t : teachers) {
      const double rps = NumOr(t, "requests_per_sec");
      r.requests += rps;
      r.samples += NumOr(t, "samples_per_sec");
      weighted += rps * NumOr(t, "latency_ms") / 1000;
    }
    if (r.requests > 0) r.latency = weighted / r.requests;
    r.students = NumOr(s, "students");
    r.restarts = NumOr(s, "restarts");
    rows.push_back(r);
  }
  auto family = [&](const char* name, const char* type, const char* help, auto value,
                    auto present) {
    Family(name, type, help, out);
    for (const Row& r : rows) {
      if (present(r)) Sample(name, Label("service", r.name), value(r), out);
    }
  };
  auto always = [](const Row&) { return true; };
  family(
      "edl_service_desired_teachers", "gauge",
      "Teachers asked for (edl ctl scale --service SERVICE N).",
      [](const Row& r) { return r.desired; }, [](const Row& r) { return r.has_desired; });
  family(
      "edl_service_placed_teachers", "gauge", "Teachers the server placed on nodes (not stopping).",
      [](const Row& r) { return r.placed; }, always);
  family(
      "edl_service_teachers", "gauge", "Teachers registered and serving.",
      [](const Row& r) { return r.teachers; }, always);
  family(
      "edl_service_students", "gauge", "Students watching the service.",
      [](const Row& r) { return r.students; }, always);
  family(
      "edl_service_requests_per_second", "gauge",
      "Requests per second the teachers reported, summed.", [](const Row& r) { return r.requests; },
      always);
  family(
      "edl_service_samples_per_second", "gauge",
      "Samples per second the teachers reported, summed.", [](const Row& r) { return r.samples; },
      always);
  family(
      "edl_service_latency_seconds", "gauge",
      "Teachers' mean request latency, weighted by requests.",
      [](const Row& r) { return r.latency; }, [](const Row& r) { return r.latency >= 0; });
  family(
      "edl_service_teacher_restarts_total", "counter",
      "Teachers the server replaced after they exited.", [](const Row& r) { return r.restarts; },
      always);
}

void ServerMetrics::RenderServer(const json& status, std::string* out) const {
  const bool cluster = status.is_object() && BoolOr(status, "cluster");
  Family("edl_server_info", "gauge", "1; the mode label says single-job or cluster server.", out);
  Sample("edl_server_info", Label("mode", cluster ? "cluster" : "single"), 1, out);
  Family("edl_server_leader", "gauge",
         "1: this server leads its job (a standby waits without serving anything, so it is down "
         "here).",
         out);
  Sample("edl_server_leader", "", 1, out);
  Family("edl_server_start_time_seconds", "gauge", "When the server started, Unix time.", out);
  Sample("edl_server_start_time_seconds", "", start_wall_us_ * 1e-6, out);
  Family("edl_server_uptime_seconds", "gauge", "Time since the server started.", out);
  Sample("edl_server_uptime_seconds", "", (clock_->NowMicros() - start_us_) * 1e-6, out);
  Family("edl_cluster_slots", "gauge", "Trainer slots of the connected nodes.", out);
  Sample("edl_cluster_slots", "", NumOr(status, "total_slots"), out);
  Family("edl_cluster_used_slots", "gauge", "Slots holding a trainer.", out);
  Sample("edl_cluster_used_slots", "", NumOr(status, "used_slots"), out);
  Family("edl_server_connections", "gauge",
         "Open control-plane connections (clients, ctl, services, unauthenticated).", out);
  Sample("edl_server_connections", "", static_cast<double>(connections_), out);
  Family("edl_server_connections_accepted_total", "counter", "Control-plane connections accepted.",
         out);
  Sample("edl_server_connections_accepted_total", "", static_cast<double>(connections_total_), out);
  Family("edl_server_frames_refused_total", "counter",
         "Frames and connections the server refused, by reason.", out);
  for (size_t i = 0; i < refused_.size(); ++i) {
    Sample("edl_server_frames_refused_total",
           Label("reason", FrameRefusalName(static_cast<FrameRefusal>(i))),
           static_cast<double>(refused_[i]), out);
  }
  Family("edl_http_responses_total", "counter", "Answers of this HTTP endpoint, by status code.",
         out);
  for (const auto& [code, n] : http_answers_) {
    Sample("edl_http_responses_total", Label("code", std::to_string(code)), static_cast<double>(n),
           out);
  }
  Family("edl_http_connections", "gauge", "Open connections to this HTTP endpoint.", out);
  Sample("edl_http_connections", "", static_cast<double>(http_connections_), out);
}

}  // namespace edl::jobserver
