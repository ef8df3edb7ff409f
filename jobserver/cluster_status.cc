// What the Cluster shows: `edl ctl jobs`, `edl ctl status` (docs/WATCHING.md "edl ctl") and the
// progress the events logs record. A one-job server's status is its job's summary
// (JobMembership::Summary) with its progress; a cluster server's lists its jobs and sums the nodes'
// utilisation.
#include <algorithm>

#include "jobserver/cluster.h"

namespace edl::jobserver {

using nlohmann::json;

events::Progress Cluster::ProgressOf(const std::string& job) const {
  events::Progress p;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return p;
  const proto::GenerationInfo& g = it->second.membership->current();
  const std::map<std::string, proto::ProgressReport>& reports = it->second.progress;
  p.generation = g.generation;
  p.world_size = g.world_size();
  for (const proto::MemberInfo& m : g.members) {
    auto r = reports.find(m.trainer_id);
    if (r == reports.end()) continue;
    ++p.reporting;
    p.step = std::max(p.step, r->second.step);
    p.epoch = std::max(p.epoch, r->second.epoch);
    p.images_per_sec += r->second.images_per_sec;
    p.samples = std::max(p.samples, r->second.samples);
    if (m.rank == 0) {
      p.loss = r->second.loss;
      p.accuracy = r->second.accuracy;
    }
  }
  // A finished job trains no more: no world, no images/s; its step, samples and accuracy stand.
  if (it->second.membership->done()) {
    p.world_size = 0;
    p.images_per_sec = 0;
  }
  return p;
}

json Cluster::ProgressSummary(const std::string& job) const {
  if (jobs_.count(job) == 0) return json::object();
  const events::Progress p = ProgressOf(job);
  json s = {{"reporting", p.reporting},
            {"step", p.step},
            {"epoch", p.epoch},
            {"loss", p.loss},
            {"images_per_sec", p.images_per_sec},
            {"accuracy", p.accuracy},
            {"samples", p.samples}};
  if (json m = MeasuredJson(job); !m.empty()) s["measured"] = std::move(m);
  return s;
}

Cluster::Measured Cluster::MeasureOf(const Job& job) const {
  Measured out;
  const proto::GenerationInfo& g = job.membership->current();
  double compute = 0, sync = 0;
  int computes = 0, syncs = 0;
  std::set<std::string> nodes;
  for (const proto::MemberInfo& m : g.members) {
    nodes.insert(m.node);
    auto r = job.progress.find(m.trainer_id);
    if (r == job.progress.end()) continue;
    const proto::ProgressReport& p = r->second;
    if (m.rank == 0) out.rank0 = &p;
    // A report of an older generation (the member has not stepped in this one yet) measured
    // another world's all-reduce.
    if (p.generation != g.generation) continue;
    if (p.compute_s_per_sample >= 0) compute += p.compute_s_per_sample, ++computes;
    if (p.sync_s >= 0) sync += p.sync_s, ++syncs;
  }
  if (computes > 0) out.compute_s_per_sample = compute / computes;
  if (syncs > 0) out.sync_s = sync / syncs;
  out.world = g.world_size();
  out.nodes = static_cast<int>(nodes.size());
  return out;
}

json Cluster::MeasuredJson(const std::string& job) const {
  json out = json::object();
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.membership->done()) return out;
  const Measured m = MeasureOf(it->second);
  if (m.rank0 != nullptr && m.rank0->noise_steps > 0) {
    out["noise_steps"] = m.rank0->noise_steps;
    out["grad_sqr"] = m.rank0->grad_sqr;
    out["grad_var"] = m.rank0->grad_var;
    out["noise_scale"] = m.rank0->noise_scale;
  }
  if (m.compute_s_per_sample >= 0) out["compute_s_per_sample"] = m.compute_s_per_sample;
  if (m.sync_s >= 0) {
    out["sync_s"] = m.sync_s;
    out["sync_world"] = m.world;
    out["sync_nodes"] = m.nodes;
  }
  return out;
}

json Cluster::LiveJobsJson() const {
  json live = json::array();
  for (const std::string& name : JobNames()) {
    const Job& job = jobs_.at(name);
    const PolicyJob* pj = policy_.Find(name);
    const JobSubmission& s = job.spec.job;
    const JobMembership& m = *job.membership;
    const bool running =
        pj != nullptr ? pj->state == JobPhase::kRunning : m.current().world_size() > 0;
    json j = {{"name", name},
              {"type", s.type},
              {"min", s.min_trainers},
              {"max", s.max_trainers},
              {"priority", s.priority},
              {"mode", s.elastic ? "elastic" : "restart"},
              {"state", running ? "running" : "pending"},
              {"trainers", m.current().world_size()},
              {"target", pj != nullptr ? pj->size : m.target()},
              {"generation", m.current().generation},
              {"flags", job.spec.flags}};
    if (pj != nullptr && !pj->pending_reason.empty()) j["pending_reason"] = pj->pending_reason;
    if (pj != nullptr) {
      if (std::string note = policy_.GoodputNote(*pj); !note.empty()) {
        GoodputModel unused;
        std::string missing;
        if (!job.goodput_refused.empty()) {
          note += " (its latest model was refused: " + job.goodput_refused + ")";
        } else if (!pj->has_goodput &&
                   !job.goodput.Model(pj->spec.max_trainers, &unused, &missing)) {
          note += " (" + missing + ")";
        }
        j["goodput"] = note;
      }
    }
    live.push_back(std::move(j));
  }
  return live;
}

json Cluster::EndedJobsJson() const {
  json ended = json::array();
  for (const EndedJob& e : finished_) {
    ended.push_back(
        {{"name", e.name}, {"type", e.type}, {"state", e.state}, {"generation", e.generation}});
  }
  return ended;
}

json Cluster::JobsJson() const { return {{"jobs", LiveJobsJson()}, {"ended", EndedJobsJson()}}; }

void Cluster::AddHealth(const Job& job, json* out) const {
  const int64_t now = clock_->NowMicros();
  if (job.last_progress_us >= 0)
    (*out)["last_progress_s"] = MicrosToSeconds(now - job.last_progress_us);
  if (job.failures_alike >= kFailingAfter) {
    (*out)["failing"] = {{"exits", job.failures_alike},
                         {"how", job.failure_how},
                         {"last_error", job.failure_error},
                         {"since_s", MicrosToSeconds(now - job.failing_since_us)}};
  }
  if (job.checkpoint_failures > 0 || (job.final_checkpoint_reported && !job.final_checkpoint_ok)) {
    json c = {{"failed", job.checkpoint_failures},
              {"refused", job.checkpoint_refusals},
              {"last_step", job.checkpoint_failed_step},
              {"last_error", job.checkpoint_error}};
    if (job.final_checkpoint_reported) {
      c["final_ok"] = job.final_checkpoint_ok;
      c["final_error"] = job.final_checkpoint_error;
    }
    (*out)["checkpoint_failures"] = std::move(c);
  }
}

json Cluster::StatusJson() const {
  if (const auto own = jobs_.find(own_job_); !own_job_.empty() && own != jobs_.end()) {
    json s = own->second.membership
                 ->Summary();  // the job's own, as `edl ctl status` of one job prints it
    s["progress"] = ProgressSummary(own_job_);
    AddHealth(own->second, &s);
    return s;
  }
  json jobs = LiveJobsJson();
  std::string running;
  double total_ips = 0;
  const std::vector<std::string> names = JobNames();  // LiveJobsJson's order
  for (size_t i = 0; i < names.size() && i < jobs.size(); ++i) {
    const std::string& name = names[i];
    const Job& job = jobs_.at(name);
    const events::Progress p = ProgressOf(name);
    json& j = jobs[i];
    j["images_per_sec"] = p.images_per_sec;
    j["step"] = p.step;
    j["epoch"] = p.epoch;
    j["loss"] = p.loss;
    j["accuracy"] = p.accuracy;
    j["samples"] = p.samples;
    if (json m = MeasuredJson(name); !m.empty()) j["measured"] = std::move(m);
    AddHealth(job, &j);
    if (job.failures_alike >= kFailingAfter) j["state"] = "failing";  // AddHealth's "failing"
    total_ips += p.images_per_sec;
    running += (running.empty() ? "" : "|") + name + ":" +
               std::to_string(job.membership->current().world_size());
  }
  double busy = 0, gpu = 0;
  int cores = 0, gpus = 0, connected = 0;
  for (const auto& [name, n] : registry_.nodes()) {
    connected += n.connected ? 1 : 0;
    if (!n.stats) continue;
    busy += n.stats->cpu_busy;
    cores += n.stats->cpu_cores;
    if (n.stats->gpu_util >= 0) {
      gpu += n.stats->gpu_util;
      ++gpus;
    }
  }
  json s = {{"jobs", std::move(jobs)}, {"ended", EndedJobsJson()}};
  s["cpu_utils"] = cores > 0 ? json(100.0 * busy / cores) : json("n/a");
  s["gpu_utils"] = gpus > 0 ? json(gpu / gpus) : json("n/a");
  s["cluster"] = true;
  s["submitted_jobs"] = submitted_;
  s["pending_jobs"] = policy_.pending_jobs();
  s["running_trainers"] = running;
  s["total_slots"] = policy_.total_slots();
  s["used_slots"] = policy_.used_slots();
  s["nodes"] = connected;
  s["images_per_sec"] = total_ips;
  return s;
}

}  // namespace edl::jobserver
