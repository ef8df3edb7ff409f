// The node's warm spares (docs/TRAINERS.md "Warm spares", PROTOCOL.md "Spares"): per job, up to
// `spares` trainer processes that prepared what does not depend on their identity (process start,
// libraries, data; with a CPU or undivided device also the model and a warm-up step) and wait on
// the trainers' socket. The next trainer the server starts on this node takes one: the agent
// sends it the env contract of that trainer (spare_assign), and it connects again as that trainer.
// A spare that ends before it is assigned is a failure of its job's spares only: logged with its
// last log line, and the next spare waits out a doubling back-off; the job's trainers are
// untouched.
#include <algorithm>
#include <climits>

#include <glog/logging.h>

#include "jobclient/node_agent.h"

namespace edl::jobclient {

using nlohmann::json;

namespace {
constexpr int64_t kSpareBackoffMinUs = 1000000;   // after the first failure in a row
constexpr int64_t kSpareBackoffMaxUs = 60000000;  // doubling up to this
}  // namespace

void NodeAgent::SpareHealth::Failed(int64_t now_us) {
  ++failures;
  next_start_us =
      now_us + std::min(kSpareBackoffMaxUs, kSpareBackoffMinUs << std::min(failures - 1, 6));
}

void NodeAgent::KeepSpares(int64_t now_us) {
  if (options_.spares <= 0 || options_.restart_mode || shutting_down_) return;
  if (done_) return ReleaseSpares("", "the server said its job is done");
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    const auto run = runs_.find(it->second.job);
    if (!it->second.released && (run == runs_.end() || run->second.latest.members.empty())) {
      ReleaseSpares(it->second.job, "its job has no trainers left");
    }
  }
  for (const auto& [id, t] : trainers_) {
    if (t.joining_generation > 0 || !t.ever_connected) return;  // a trainer prepares: not now
  }
  for (const auto& [job, run] : runs_) {
    if (run.argv.empty() || run.latest.generation == 0 || run.latest.members.empty()) continue;
    // The welcome's job (one-job mode: every node is where it grows), or a cluster job this node
    // runs trainers of: a cluster node is told of every job of its types, and a spare per job on
    // every node would hold memory for jobs that never come here.
    bool runs_here = job == job_id_ && !options_.trainer_argv.empty();
    for (const proto::MemberInfo& m : run.latest.members) runs_here |= m.node == options_.node_name;
    if (!runs_here) continue;
    const SpareHealth& health = spare_health_[job];
    if (health.off || now_us < health.next_start_us) continue;
    int have = 0;
    bool preparing = false;
    for (const auto& [id, sp] : spares_) {
      if (sp.job != job || sp.released) continue;
      ++have;
      preparing |= !sp.channel;
    }
    // One at a time: a spare's preparation competes with the job's own steps.
    if (have < options_.spares && !preparing) StartSpare(job, now_us);
  }
}

void NodeAgent::StartSpare(const std::string& job, int64_t now_us) {
  const JobRun& run = runs_.at(job);
  launcher::EnvContract c;
  c.job_id = job;
  c.trainer_id = options_.node_name + "-spare-" + std::to_string(next_spare_++);
  c.client_socket = options_.socket_path;
  // On GPU slots the device is the slot's, named only by the assignment: a host spare.
  c.spare = options_.gpu_slots ? launcher::SpareKind::kHost : launcher::SpareKind::kFull;
  c.generation = run.latest.generation;
  c.world_size = std::max(1, run.max_world);  // a replacement restores the job's size
  c.rank = 0;
  c.local_rank = 0;
  c.local_world_size = 1;  // as a joiner's (OnPrepare)
  c.master_addr = run.latest.master_addr.empty() ? "127.0.0.1" : run.latest.master_addr;
  c.master_port = run.latest.master_port;
  c.max_restarts = launcher::EnvContract::kUnboundedRestarts;
  AgentAction a;
  a.kind = AgentAction::Kind::kStartSpare;
  a.id = c.trainer_id;
  a.spec.argv = run.argv;
  a.spec.env = launcher::BuildTrainerEnv(c);
  a.spec.log_path = LogPath(c.trainer_id);
  Spare sp;
  sp.id = c.trainer_id;
  sp.job = job;
  sp.log_path = a.spec.log_path;
  sp.world = c.world_size;
  sp.started_us = now_us;
  spares_.emplace(sp.id, std::move(sp));
  Emit(std::move(a));
}

void NodeAgent::SpareStartFailed(const std::string& id, const Status& why, int64_t now_us) {
  auto it = spares_.find(id);
  const std::string job = it->second.job;
  spares_.erase(it);
  SpareHealth& health = spare_health_[job];
  health.Failed(now_us);
  LOG(ERROR) << "cannot start a spare for job " << job << ": " << why.ToString()
             << "; the job keeps its trainers; next try in "
             << (health.next_start_us - now_us) / 1000000 << " s";
}

bool NodeAgent::OnSpareHello(ChannelId ch, const proto::SpareHello& h) {
  auto it = spares_.find(h.spare_id);
  Status s;
  if (it == spares_.end() || it->second.released) {
    s = Status::FailedPrecondition("spare '" + h.spare_id +
                                   "' was not started by the client of node " + options_.node_name +
                                   " (or was released)");
  } else if (it->second.channel) {
    s = Status::AlreadyExists("spare " + h.spare_id + " already waits on a connection");
  }
  if (!s.ok()) {
    LOG(WARNING) << "refusing a spare connection: " << s.ToString();
    SendAndCloseChannel(ch, proto::ErrorMsg::From(s).Encoded(), s);
    return false;
  }
  Spare& sp = it->second;
  sp.channel = ch;
  AgentAction idle;  // it waits as long as no trainer is needed
  idle.kind = AgentAction::Kind::kSetChannelIdle;
  idle.channel = ch;
  idle.idle_ms = 0;
  Emit(std::move(idle));
  proto::Welcome w;
  w.job_id = sp.job;
  SendToChannel(ch, w.Encoded());
  LOG(INFO) << "spare " << sp.id << " of job " << sp.job << " is prepared ("
            << (clock_->NowMicros() - sp.started_us) / 1000 << " ms after its start) and waits";
  return true;
}

void NodeAgent::SpareCannotWait(const std::string& spare_id) {
  auto it = spares_.find(spare_id);
  if (it == spares_.end()) return;
  const std::string job = it->second.job;
  spare_health_[job].off = true;
  LOG(ERROR) << "spare " << spare_id << " of job " << job
             << " connected as a trainer (trainer_hello), not as a spare: the job's command does "
                "not wait for an assignment (it reads its identity at start without "
                "edl::runtime::PlanRunFromProcess); no more spares for job "
             << job << " on this node (start the client with --spares 0 to say so)";
  ReleaseSpares(job, "its command cannot be a spare");
}

bool NodeAgent::AssignSpare(const StartRequest& req, const std::string& log_path, int* pid) {
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    Spare& sp = it->second;
    if (sp.job != req.job || sp.released || !sp.channel) continue;
    proto::SpareAssign assign;
    assign.env = launcher::BuildTrainerEnv(req.env);
    AgentAction a;
    a.kind = AgentAction::Kind::kHandOverSpare;
    a.id = sp.id;
    a.to_id = req.id;
    a.channel = sp.channel;
    a.frame = assign.Encoded();
    a.from_log = sp.log_path;  // the log continues under the trainer's name
    a.to_log = log_path;
    Emit(std::move(a));
    LOG(INFO) << "trainer " << req.id << " of job " << req.job << " is spare " << sp.id << " (pid "
              << sp.pid << ", prepared " << (clock_->NowMicros() - sp.started_us) / 1000
              << " ms ago)";
    spare_health_[req.job].failures = 0;
    *pid = sp.pid;
    spares_.erase(it);  // its channel stays bound to the spare's id until it closes
    return true;
  }
  return false;
}

void NodeAgent::SpareExited(const ProcessExit& e, int64_t now_us) {
  auto it = spares_.find(e.id);
  Spare& sp = it->second;
  if (sp.channel) CloseChannel(sp.channel, Status::Aborted("spare exited"));
  if (sp.released) {
    LOG(INFO) << "spare " << sp.id << " released: " << e.info.ToString();
  } else {
    SpareHealth& health = spare_health_[sp.job];
    health.Failed(now_us);
    LOG(ERROR) << "spare " << sp.id << " of job " << sp.job << " (pid " << sp.pid
               << ") ended before it was assigned: " << e.info.ToString()
               << "; its last log line: \"" << e.last_log_line << "\" (" << sp.log_path
               << "). The job keeps its trainers; " << health.failures
               << " spare failure(s) in a row, next spare in "
               << (health.next_start_us - now_us) / 1000000.0 << " s";
  }
  spares_.erase(it);
}

void NodeAgent::CheckSpareDeadlines(int64_t now_us) {
  for (auto& [id, sp] : spares_) {
    if (!sp.released || now_us < sp.kill_deadline_us) continue;
    LOG(WARNING) << "spare " << id << " ignored SIGTERM for --stop_grace_s; SIGKILL";
    EmitProcess(AgentAction::Kind::kKill, id);
    sp.kill_deadline_us = INT64_MAX;
  }
}

void NodeAgent::ReleaseSpares(const std::string& job, const std::string& why) {
  const int64_t now = clock_->NowMicros();
  for (auto& [id, sp] : spares_) {
    if (sp.released || (!job.empty() && sp.job != job)) continue;
    LOG(INFO) << "releasing spare " << id << " of job " << sp.job << ": " << why;
    sp.released = true;
    sp.kill_deadline_us = now + options_.stop_grace_ms * 1000;
    if (sp.channel) CloseChannel(sp.channel, Status::Aborted("released: " + why));  // it exits
    EmitProcess(AgentAction::Kind::kTerminate, id);
  }
}

}  // namespace edl::jobclient
