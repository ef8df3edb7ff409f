#include "jobclient/node_agent.h"

#include <algorithm>
#include <climits>

#include <glog/logging.h>

#include "edl/base/enum_names.h"
#include "edl/net/admission.h"
#include "edl/proto/frame.h"
#include "edl/proto/frames.h"

namespace edl::jobclient {

using nlohmann::json;

namespace {
constexpr size_t kMaxWatchedServices = 64;  // per node, whatever its trainers ask
}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

std::vector<AgentAction> NodeAgent::TakeActions() {
  std::vector<AgentAction> out;
  out.swap(actions_);
  return out;
}

// ---- output

void NodeAgent::EmitProcess(AgentAction::Kind kind, const std::string& id) {
  AgentAction a;
  a.kind = kind;
  a.id = id;
  Emit(std::move(a));
}

void NodeAgent::SendToServer(const json& msg, bool queue_if_offline) {
  if (connected_) {
    AgentAction a;
    a.kind = AgentAction::Kind::kSendServer;
    a.frame = msg;
    return Emit(std::move(a));
  }
  if (!queue_if_offline) return;
  if (outbox_.size() < options_.max_outbox) return outbox_.push_back(msg);
  if (net::LogThis(++outbox_dropped_)) {
    LOG(WARNING) << "edl client " << options_.node_name << ": the server is away and "
                 << outbox_.size() << " frames wait for it; dropped a '" << proto::TypeOf(msg)
                 << "' (" << outbox_dropped_ << " dropped so far)";
  }
}

void NodeAgent::SendToChannel(ChannelId ch, const json& msg) {
  AgentAction a;
  a.kind = AgentAction::Kind::kSendChannel;
  a.channel = ch;
  a.frame = msg;
  Emit(std::move(a));
}

void NodeAgent::CloseChannel(ChannelId ch, const Status& why) {
  AgentAction a;
  a.kind = AgentAction::Kind::kCloseChannel;
  a.channel = ch;
  a.status = why;
  Emit(std::move(a));
  DetachChannel(ch);
}

void NodeAgent::SendAndCloseChannel(ChannelId ch, const json& msg, const Status& why) {
  AgentAction a;
  a.kind = AgentAction::Kind::kSendAndCloseChannel;
  a.channel = ch;
  a.frame = msg;
  a.status = why;
  Emit(std::move(a));
  DetachChannel(ch);
}

void NodeAgent::DetachChannel(ChannelId ch) {
  auto bound = channels_.find(ch);
  if (bound == channels_.end()) return;
  auto t = trainers_.find(bound->second);
  if (t != trainers_.end() && t->second.channel == ch) t->second.channel = 0;
  auto sp = spares_.find(bound->second);
  if (sp != spares_.end() && sp->second.channel == ch) sp->second.channel = 0;
}

// ---- the server connection

void NodeAgent::OnServerUp(const proto::Welcome& w) {
  connected_ = true;
  job_id_ = w.job_id;
  for (auto& [name, run] : runs_) {  // the server sends the newest generations in full next
    run.latest = run.prev = proto::GenerationInfo();
  }
  if (!options_.trainer_argv.empty()) runs_[job_id_].argv = options_.trainer_argv;
  LOG(INFO) << "edl client " << options_.node_name << ": registered with job " << job_id_;
  if (w.dropped) DropStaleTrainers();
  while (!outbox_.empty()) {
    SendToServer(outbox_.front(), /*queue_if_offline=*/false);
    outbox_.pop_front();
  }
  ResendServiceWatches();
}

void NodeAgent::OnServerDown(const Status& why) {
  if (!connected_) return;
  connected_ = false;
  FailPendingKv(why);
}

// ---- frames from the server

void NodeAgent::OnGeneration(const proto::GenerationUpdate& u) {
  const std::string job = u.header.job_id.empty() ? job_id_ : u.header.job_id;
  auto run = runs_.find(job);
  if (run == runs_.end()) {
    LOG(ERROR) << "generation of job " << job
               << ", whose type this node was not told (no job_info); ignored";
    return;
  }
  proto::GenerationInfo next = run->second.latest;
  if (Status s = u.ApplyTo(&next); !s.ok()) {
    LOG(ERROR) << "bad generation from the server: " << s.ToString()
               << "; reconnecting for a full one";
    AgentAction a;
    a.kind = AgentAction::Kind::kCloseServer;
    a.status = s;
    return Emit(std::move(a));
  }
  JobRun& r = run->second;
  if (next.generation <= r.latest.generation && r.latest.generation > 0) return;  // already held
  r.prev = r.latest;
  r.latest = std::move(next);
  r.max_world = std::max(r.max_world, r.latest.world_size());
  const proto::GenerationInfo& g = r.latest;
  const int64_t now = clock_->NowMicros();
  LOG(INFO) << "job " << job << ": generation " << g.generation << " (" << g.reason
            << "): world size " << g.world_size();
  std::vector<std::string> kill_now;
  for (auto& [id, t] : trainers_) {
    if (t.job != job) continue;
    if (g.RankOf(id) >= 0) {
      t.member = true;
      t.joining_generation = 0;
    } else if (t.joining_generation > g.generation) {
      continue;  // prepared for a later generation
    } else if (!t.member && t.joining_generation > 0) {
      kill_now.push_back(id);  // a joiner the commit left out
    } else if (!t.leaving) {
      t.member = false;
      t.leaving = true;
      if (options_.restart_mode) {
        TerminateTrainer(&t, now);
      } else {
        t.leave_deadline_us = now + options_.leave_grace_ms * 1000;
      }
    }
    PushGeneration(&t);
  }
  for (const std::string& id : kill_now) {
    LOG(INFO) << "killing joiner " << id << ": not in generation " << g.generation;
    EmitProcess(AgentAction::Kind::kKill, id);
  }
  for (const proto::MemberInfo& m : g.members) {
    if (m.node != options_.node_name || trainers_.count(m.trainer_id)) continue;
    if (ended_.count(m.trainer_id)) continue;  // ids are never reused: an ended one stays ended
    bool queued = false;
    for (const StartRequest& w : waiting_) queued |= w.id == m.trainer_id;
    if (queued) continue;
    StartRequest sr;
    sr.id = m.trainer_id;
    sr.job = job;
    sr.slot = m.slot;
    sr.env = EnvFor(job, g, m);
    StartTrainer(std::move(sr));
  }
  for (auto it = ended_.begin(); it != ended_.end();) {  // bounded by this node's members
    it = g.RankOf(*it) >= 0 ? std::next(it) : ended_.erase(it);
  }
  // Queued starts the commit no longer wants (e.g. replaced again) are dropped.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const bool wanted =
        it->job != job || g.RankOf(it->id) >= 0 || it->joining_generation > g.generation;
    it = wanted ? std::next(it) : waiting_.erase(it);
  }
}

void NodeAgent::OnPrepare(const proto::Prepare& p) {
  const std::string job = p.job_id.empty() ? job_id_ : p.job_id;
  for (const proto::MemberInfo& j : p.joiners) {
    if (j.node != options_.node_name ||
        std::find(options_.slots.begin(), options_.slots.end(), j.slot) == options_.slots.end()) {
      LOG(ERROR) << "prepare names joiner " << j.trainer_id << " on " << j.node << " slot "
                 << j.slot << ", not a slot of this node; ignored";
      continue;
    }
    if (trainers_.count(j.trainer_id)) continue;
    StartRequest r;
    r.id = j.trainer_id;
    r.job = job;
    r.slot = j.slot;
    proto::GenerationInfo pending;
    pending.generation = p.generation;
    pending.master_addr = p.master_addr;
    pending.master_port = p.master_port;
    pending.members.assign(static_cast<size_t>(p.world_size), j);  // sizes and this member
    r.env = EnvFor(job, pending, j);
    r.env.local_rank = 0;
    r.env.local_world_size = 1;
    r.env.joining = true;
    r.joining_generation = p.generation;
    StartTrainer(std::move(r));
  }
}

void NodeAgent::OnKill(const proto::Kill& k) {
  for (const std::string& id : k.trainer_ids) {
    auto it = trainers_.find(id);
    if (it == trainers_.end()) continue;
    LOG(WARNING) << "server asked to SIGKILL trainer " << id << " (pid " << it->second.pid << ")";
    EmitProcess(AgentAction::Kind::kKill, id);
  }
}

void NodeAgent::OnJobInfo(const proto::JobInfo& info) {
  // The server proposes; this node's own configuration decides what runs.
  auto type = options_.job_types.find(info.job_type);
  std::string why;
  if (type == options_.job_types.end()) why = "this node offers no job type " + info.job_type;
  for (const auto& [flag, value] : info.flags) {
    if (!why.empty()) break;
    const auto& settable = type->second.settable;
    if (std::find(settable.begin(), settable.end(), flag) == settable.end()) {
      why = "flag '" + flag + "' is not settable for job type " + info.job_type + " on this node";
    } else if (flag == proto::kCheckpointDirFlag) {
      why = proto::CheckpointDirProblem(value, options_.checkpoint_root);
    }
  }
  if (!why.empty()) {
    LOG(ERROR) << "refusing job " << info.job_id << ": " << why
               << "; its trainers will not start here";
    runs_.erase(info.job_id);
    return;
  }
  JobRun& run = runs_[info.job_id];
  run.argv = info.Argv(type->second.argv);
  LOG(INFO) << "job " << info.job_id << " of type " << info.job_type << " may run here ("
            << info.flags.size() << " flags set)";
}

void NodeAgent::OnKvReply(proto::KvReply r) {
  auto route = kv_routes_.find(r.req_id);
  if (route == kv_routes_.end()) return;
  auto [trainer_id, their_id] = route->second;
  kv_routes_.erase(route);
  auto t = trainers_.find(trainer_id);
  if (t == trainers_.end() || !t->second.channel) return;
  r.req_id = their_id;
  SendToChannel(t->second.channel, r.Encoded());
}

void NodeAgent::OnServiceMembers(const proto::ServiceMembers& m) {
  auto it = service_watchers_.find(m.service);
  if (it == service_watchers_.end()) return;  // nobody here watches it (any more)
  json clean;                                 // only the fields we decoded travel on
  m.EncodeTo(&clean);
  service_members_[m.service] = clean;
  for (auto id = it->second.begin(); id != it->second.end();) {
    auto t = trainers_.find(*id);
    if (t == trainers_.end()) {  // the trainer is gone
      id = it->second.erase(id);
      continue;
    }
    if (t->second.channel) SendToChannel(t->second.channel, clean);
    ++id;
  }
}

void NodeAgent::OnStop() {
  AgentAction a;
  a.kind = AgentAction::Kind::kShutdown;
  a.code = 0;
  a.why = "the server asked to stop (edl ctl stop)";
  Emit(std::move(a));
}

void NodeAgent::OnDone() {
  done_ = true;
  LOG(INFO) << "edl client " << options_.node_name << ": the job finished";
}

// ---- KV routes and services

void NodeAgent::FailPendingKv(const Status& why) {
  // The server will never answer them: each trainer hears at once, not after its wait's margin
  // (a rendezvous waiting on the server that went away would otherwise sit out timeout + 10 s).
  std::vector<uint64_t> ids;
  for (const auto& [ours, route] : kv_routes_) ids.push_back(ours);
  for (uint64_t ours : ids) {
    proto::KvReply rep;
    rep.req_id = ours;
    rep.status = Status::Unavailable("the node's client lost its server connection (" +
                                     why.ToString() + "); retry");
    OnKvReply(rep);  // relays it and drops the route
  }
}

void NodeAgent::OnKvRequest(ChannelId ch, Trainer* t, proto::KvRequest r) {
  if (!connected_) {
    proto::KvReply rep;
    rep.req_id = r.req_id;
    rep.status = Status::Unavailable("the node's client is not connected to the server; retry");
    return SendToChannel(ch, rep.Encoded());
  }
  const uint64_t ours = next_req_id_++;
  kv_routes_[ours] = {t->id, r.req_id};
  r.req_id = ours;
  r.job = t->job == job_id_ ? "" : t->job;  // the welcome's job keeps the unscoped form
  SendToServer(r.Encoded(), /*queue_if_offline=*/false);
}

Status NodeAgent::OnServiceWatch(Trainer* t, const proto::ServiceWatch& w) {
  auto it = service_watchers_.find(w.service);
  if (it == service_watchers_.end()) {
    if (service_watchers_.size() >= kMaxWatchedServices) {
      return Status::InvalidArgument("the node's trainers already watch " +
                                     std::to_string(kMaxWatchedServices) + " services");
    }
    it = service_watchers_.emplace(w.service, std::set<std::string>()).first;
    SendToServer(w.Encoded(), /*queue_if_offline=*/false);  // ResendServiceWatches on a welcome
  }
  it->second.insert(t->id);
  auto m = service_members_.find(w.service);
  if (m != service_members_.end() && t->channel) SendToChannel(t->channel, m->second);
  return Status::OK();
}

void NodeAgent::ResendServiceWatches() {
  for (const auto& [service, ids] : service_watchers_) {
    proto::ServiceWatch w;
    w.service = service;
    SendToServer(w.Encoded(), /*queue_if_offline=*/false);
  }
}

// ---- the trainers' socket

void NodeAgent::OnChannelFrame(ChannelId ch, const json& msg) {
  const std::string bound = channels_[ch];  // "" until a hello binds it
  const std::string& type = proto::TypeOf(msg);
  if (bound.empty() && type == proto::msg::kSpareHello) {
    proto::SpareHello h;
    if (Status s = h.DecodeFrom(msg); !s.ok()) return CloseChannel(ch, s);
    if (OnSpareHello(ch, h)) channels_[ch] = h.spare_id;
    return;
  }
  if (!bound.empty() && spares_.count(bound)) {
    // A waiting spare has nothing to say but heartbeats.
    if (type != proto::msg::kHeartbeat) {
      CloseChannel(ch, Status::InvalidArgument("a spare sent " + type));
    }
    return;
  }
  if (bound.empty()) return OnTrainerHello(ch, msg);
  auto it = trainers_.find(bound);
  if (it == trainers_.end()) return CloseChannel(ch, Status::Aborted("trainer gone"));
  OnTrainerFrame(ch, &it->second, msg);
}

void NodeAgent::OnTrainerHello(ChannelId ch, const json& msg) {
  proto::TrainerHello h;
  Status s = proto::TypeOf(msg) == proto::msg::kTrainerHello
                 ? h.DecodeFrom(msg)
                 : Status::InvalidArgument("expected trainer_hello first");
  auto it = s.ok() ? trainers_.find(h.trainer_id) : trainers_.end();
  if (s.ok() && it == trainers_.end() && spares_.count(h.trainer_id)) {
    SpareCannotWait(h.trainer_id);
    s = Status::FailedPrecondition("spare " + h.trainer_id +
                                   " said trainer_hello: its command cannot wait as a spare");
  } else if (s.ok() && it == trainers_.end()) {
    s = Status::FailedPrecondition("trainer id '" + h.trainer_id +
                                   "' was not started by the client of node " + options_.node_name);
  }
  if (s.ok() && it->second.channel) {
    s = Status::AlreadyExists("trainer " + h.trainer_id + " already has a channel");
  }
  if (!s.ok()) {
    LOG(WARNING) << "refusing a trainer connection: " << s.ToString();
    return SendAndCloseChannel(ch, proto::ErrorMsg::From(s).Encoded(), s);
  }
  channels_[ch] = h.trainer_id;
  Trainer& t = it->second;
  t.channel = ch;
  t.ever_connected = true;
  t.last_heard_us = clock_->NowMicros();
  t.generation_sent = 0;
  AgentAction idle;  // liveness is judged in Tick (trainer_timeout_ms)
  idle.kind = AgentAction::Kind::kSetChannelIdle;
  idle.channel = ch;
  idle.idle_ms = 0;
  Emit(std::move(idle));
  proto::Welcome w;
  w.job_id = t.job;
  w.heartbeat_ms = 500;
  SendToChannel(ch, w.Encoded());
  PushGeneration(&t);
}

void NodeAgent::OnTrainerFrame(ChannelId ch, Trainer* t, const json& msg) {
  t->last_heard_us = clock_->NowMicros();
  proto::TrainerFrame frame;
  Status s = proto::DecodeTrainerFrame(msg, &frame);
  if (s.ok()) {
    s = std::visit(Overloaded{
                       [&](const proto::Heartbeat&) { return Status::OK(); },
                       [&](proto::Ready& r) {
                         r.trainer_id = t->id;
                         SendToServer(r.Encoded(), /*queue_if_offline=*/true);
                         return Status::OK();
                       },
                       [&](proto::Progress& p) {
                         p.trainer_id = t->id;
                         SendToServer(p.Encoded(), /*queue_if_offline=*/false);
                         return Status::OK();
                       },
                       [&](proto::Event& e) {
                         if (const auto* bad = std::get_if<proto::ev::Malformed>(&e.body)) {
                           // A bad event is the trainer's bug, not a broken channel: dropped, never
                           // relayed.
                           if (net::LogThis(++t->dropped_events)) {
                             LOG(WARNING) << "node " << options_.node_name
                                          << ": dropped an event of trainer " << t->id << ": "
                                          << bad->why.message() << " (" << t->dropped_events
                                          << " dropped so far)";
                           }
                           return Status::OK();
                         }
                         e.trainer_id = t->id;
                         SendToServer(e.Encoded(), /*queue_if_offline=*/true);
                         return Status::OK();
                       },
                       [&](proto::KvRequest& r) {
                         OnKvRequest(ch, t, std::move(r));
                         return Status::OK();
                       },
                       [&](const proto::ServiceWatch& w) { return OnServiceWatch(t, w); },
                   },
                   frame);
  }
  if (!s.ok()) {
    LOG(WARNING) << "trainer " << t->id << ": " << s.ToString() << "; closing its channel";
    CloseChannel(ch, s);
  }
}

void NodeAgent::OnChannelClosed(ChannelId ch, const Status& why) {
  auto bound = channels_.find(ch);
  if (bound == channels_.end()) return;
  auto t = trainers_.find(bound->second);
  if (t != trainers_.end() && t->second.channel == ch) {
    VLOG(1) << "trainer " << t->first << " channel closed: " << why.ToString();
  }
  DetachChannel(ch);
  channels_.erase(bound);
}

// ---- trainers

void NodeAgent::PushGeneration(Trainer* t) {
  auto run = runs_.find(t->job);
  if (run == runs_.end()) return;
  const proto::GenerationInfo& prev = run->second.prev;
  const proto::GenerationInfo& latest = run->second.latest;
  if (!t->channel || latest.generation == 0 || t->generation_sent >= latest.generation) return;
  json j;
  if (t->generation_sent > 0 && t->generation_sent == prev.generation) {
    proto::GenerationUpdate::Between(prev, latest).EncodeTo(&j);
  } else {
    proto::GenerationUpdate::Full(latest).EncodeTo(&j);
  }
  SendToChannel(t->channel, j);
  t->generation_sent = latest.generation;
}

bool NodeAgent::SlotBusy(int slot) const {
  for (const auto& [id, t] : trainers_) {
    if (t.slot == slot) return true;
  }
  return false;
}

void NodeAgent::ReportStartFailure(const std::string& id, const Status& why) {
  LOG(ERROR) << "cannot start trainer " << id << ": " << why.ToString();
  proto::TrainerExit e;
  e.trainer_id = id;
  e.exited = true;
  e.code = 127;
  e.error = why.ToString().substr(0, proto::kMaxErrorLineBytes);
  SendToServer(e.Encoded(), /*queue_if_offline=*/true);
}

void NodeAgent::StartTrainer(StartRequest req) {
  if (shutting_down_) return;
  if (SlotBusy(req.slot)) {
    waiting_.push_back(std::move(req));  // starts once the slot's previous trainer has exited
    return;
  }
  auto run = runs_.find(req.job);
  launcher::TrainerSpec spec;
  if (run != runs_.end()) spec.argv = run->second.argv;
  if (spec.argv.empty()) {
    return ReportStartFailure(
        req.id, Status::FailedPrecondition("this node has no command for job " + req.job +
                                           " (no job_info accepted)"));
  }
  spec.env = launcher::BuildTrainerEnv(req.env);
  spec.log_path = LogPath(req.id);
  Trainer t;
  t.id = req.id;
  t.job = req.job;
  t.slot = req.slot;
  t.start_generation = req.env.generation;
  t.joining_generation = req.joining_generation;
  t.member = req.joining_generation == 0;
  if (AssignSpare(req, spec.log_path, &t.pid)) {
    LOG(INFO) << "assigned trainer " << req.id << " (pid " << t.pid << ", slot " << req.slot
              << ", generation " << req.env.generation << (req.env.joining ? ", joining" : "")
              << "), log " << spec.log_path;
  } else {
    AgentAction a;
    a.kind = AgentAction::Kind::kStartTrainer;
    a.id = req.id;
    a.spec = std::move(spec);
    Emit(std::move(a));
  }
  trainers_.emplace(req.id, std::move(t));
}

void NodeAgent::StartWaiting() {
  std::deque<StartRequest> waiting;
  waiting.swap(waiting_);
  for (StartRequest& r : waiting) StartTrainer(std::move(r));
}

void NodeAgent::OnProcessStarted(const std::string& id, int pid) {
  if (auto t = trainers_.find(id); t != trainers_.end()) {
    t->second.pid = pid;
    LOG(INFO) << "started trainer " << id << " (pid " << pid << ", slot " << t->second.slot
              << ", generation " << t->second.start_generation
              << (t->second.joining_generation > 0 ? ", joining" : "") << "), log " << LogPath(id);
  } else if (auto sp = spares_.find(id); sp != spares_.end()) {
    sp->second.pid = pid;
    LOG(INFO) << "started spare " << id << " for job " << sp->second.job << " (pid " << pid
              << ", warming up for world " << sp->second.world << "), log " << sp->second.log_path;
  }
}

void NodeAgent::OnProcessStartFailed(const std::string& id, const Status& why) {
  if (trainers_.erase(id) > 0) {
    ReportStartFailure(id, why);
    if (!waiting_.empty()) StartWaiting();  // a start queued behind it (none, as a rule)
  } else if (spares_.count(id)) {
    SpareStartFailed(id, why, clock_->NowMicros());
  }
}

void NodeAgent::OnProcessesExited(const std::vector<ProcessExit>& exits) {
  if (shutting_down_) {
    for (const ProcessExit& e : exits) ShutdownExit(e);
    return;
  }
  bool trainer_ended = false;
  for (const ProcessExit& e : exits) {
    if (!trainers_.count(e.id)) continue;
    TrainerExited(e);
    trainer_ended = true;
  }
  const int64_t now = clock_->NowMicros();
  for (const ProcessExit& e : exits) {
    if (spares_.count(e.id)) SpareExited(e, now);
  }
  if (trainer_ended) StartWaiting();
}

void NodeAgent::TrainerExited(const ProcessExit& e) {
  auto it = trainers_.find(e.id);
  Trainer& t = it->second;
  if (t.channel) CloseChannel(t.channel, Status::Aborted("trainer exited"));
  LOG(INFO) << "trainer " << e.id << " (pid " << t.pid << ") ended: " << e.info.ToString();
  // A member that ended is never started again under its id (ids are never reused), even if a
  // generation still listing it arrives: a finished trainer is not run twice.
  auto run = runs_.find(t.job);
  if (run != runs_.end() && run->second.latest.RankOf(e.id) >= 0) ended_.insert(e.id);
  trainers_.erase(it);
  ReportExit(e);
}

void NodeAgent::ReportExit(const ProcessExit& x) {
  proto::TrainerExit e;
  e.trainer_id = x.id;
  e.exited = x.info.exited && !x.info.lost;
  e.code = x.info.lost ? 1 : x.info.code;
  e.signal = x.info.signal;
  // Why it failed, in its own words, for `edl ctl status` (a job that keeps failing says so).
  if (!e.success()) e.error = x.last_log_line.substr(0, proto::kMaxErrorLineBytes);
  SendToServer(e.Encoded(), /*queue_if_offline=*/true);
}

void NodeAgent::ShutdownExit(const ProcessExit& x) {
  if (trainers_.erase(x.id) > 0) {
    LOG(INFO) << "trainer " << x.id << " stopped: " << x.info.ToString();
    proto::TrainerExit e;
    e.trainer_id = x.id;
    e.exited = x.info.exited;
    e.code = x.info.code;
    e.signal = x.info.signal;
    SendToServer(e.Encoded(), /*queue_if_offline=*/false);
  } else if (spares_.erase(x.id) > 0) {
    LOG(INFO) << "spare " << x.id << " released: " << x.info.ToString();
  }
}

void NodeAgent::OnProcessStopped(const std::string& id) {
  auto it = trainers_.find(id);
  if (it == trainers_.end()) return;
  Trainer& t = it->second;
  const int64_t now = clock_->NowMicros();
  if (!t.ever_connected || t.leaving ||
      now - t.last_heard_us <= options_.stopped_silence_ms * 1000) {
    return;  // it spoke since the probe was asked for
  }
  // Silent and stopped: it cannot be slow, it makes no progress at all, and every collective of
  // its job waits on it. No need to wait out the trainer timeout.
  LOG(ERROR) << "trainer " << id << " (pid " << t.pid << ") is stopped (state T: SIGSTOP or a "
             << "job-control stop) and silent for " << (now - t.last_heard_us) / 1000
             << " ms; SIGKILL, its job re-forms without it";
  EmitProcess(AgentAction::Kind::kKill, id);
  t.last_heard_us = INT64_MAX / 2;  // once
}

void NodeAgent::DropStaleTrainers() {
  const int64_t now = clock_->NowMicros();
  int stale = 0;
  for (auto& [id, t] : trainers_) {
    if (t.kill_deadline_us > 0) continue;
    ++stale;
    TerminateTrainer(&t, now);
  }
  if (stale == 0) {
    // Nothing ran on the token's behalf (e.g. a client's first connection to a new job, holding
    // the token of an earlier job from its session file): nothing is lost, nothing to warn about.
    LOG(INFO) << "edl client " << options_.node_name << ": the server does not know this node's "
              << "session token (kept from an earlier job, or the node was lost while no trainer "
              << "ran here); joining as a fresh node";
    return;
  }
  LOG(WARNING) << "edl client " << options_.node_name
               << ": the server dropped this node (it heard nothing from it for longer than its "
                  "heartbeat timeout: was this client stopped or cut off? or the server started "
                  "a new job), so the others went on without its trainers; stopping its "
               << stale << " stale trainer(s) (SIGTERM, then SIGKILL after --stop_grace_s) and "
               << "rejoining with fresh ones";
}

void NodeAgent::TerminateTrainer(Trainer* t, int64_t now_us) {
  if (t->kill_deadline_us > 0) return;
  // The grace counts from the moment the decision was taken (the caller's `now`), and is recorded
  // with the signal: a deadline read after the signal was delivered would start the grace late.
  t->kill_deadline_us = now_us + options_.stop_grace_ms * 1000;
  EmitProcess(AgentAction::Kind::kTerminate, t->id);
}

void NodeAgent::CheckTrainerDeadlines(int64_t now) {
  for (auto& [id, t] : trainers_) {
    if (t.leaving && t.leave_deadline_us > 0 && now >= t.leave_deadline_us &&
        t.kill_deadline_us == 0) {
      LOG(WARNING) << "leaving trainer " << id << " did not exit within --leave_grace_s; SIGTERM";
      TerminateTrainer(&t, now);
    }
    if (t.kill_deadline_us > 0 && now >= t.kill_deadline_us) {
      LOG(WARNING) << "trainer " << id << " ignored SIGTERM for --stop_grace_s; SIGKILL";
      EmitProcess(AgentAction::Kind::kKill, id);
      t.kill_deadline_us = INT64_MAX;
    }
    if (!t.ever_connected || t.leaving) continue;
    if (now - t.last_heard_us > options_.trainer_timeout_ms * 1000) {
      LOG(ERROR) << "trainer " << id << " sent no heartbeat for " << options_.trainer_timeout_ms
                 << " ms (hung or stopped?); SIGKILL";
      EmitProcess(AgentAction::Kind::kKill, id);
      t.last_heard_us = INT64_MAX / 2;  // once
    } else if (now - t.last_heard_us > options_.stopped_silence_ms * 1000) {
      EmitProcess(AgentAction::Kind::kProbeStopped, id);  // OnProcessStopped when it is
    }
  }
}

void NodeAgent::Tick(int64_t now_us) {
  if (shutting_down_) return;
  CheckSpareDeadlines(now_us);
  CheckTrainerDeadlines(now_us);
  KeepSpares(now_us);
  if (done_ && options_.exit_when_done && trainers_.empty()) {
    AgentAction a;
    a.kind = AgentAction::Kind::kShutdown;
    a.code = 0;
    a.why = "the job finished";
    Emit(std::move(a));
  }
}

void NodeAgent::Shutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  ReleaseSpares("", "the client is shutting down");
  for (const auto& [id, t] : trainers_) EmitProcess(AgentAction::Kind::kTerminate, id);
}

void NodeAgent::FillHello(proto::Hello* h) const {
  // Members of the newest generation this client holds, and prepared joiners, each with its
  // generation: a restarted server adopts the survivors and kills joiners of a change it rolled
  // back (PROTOCOL.md "Authentication").
  for (const auto& [id, t] : trainers_) {
    if (t.leaving || (!t.member && t.joining_generation == 0)) continue;
    h->trainers.push_back(id);
    auto run = runs_.find(t.job);
    const int64_t held = run == runs_.end() ? 0 : run->second.latest.generation;
    h->trainer_generations.push_back(t.member ? std::max(held, t.generation_sent)
                                              : t.joining_generation);
  }
}

launcher::EnvContract NodeAgent::EnvFor(const std::string& job, const proto::GenerationInfo& g,
                                        const proto::MemberInfo& m) const {
  launcher::EnvContract c;
  c.job_id = job;
  c.trainer_id = m.trainer_id;
  c.client_socket = options_.socket_path;
  c.restart_mode = options_.restart_mode;
  c.generation = g.generation;
  c.slot = m.slot;
  if (options_.gpu_slots) c.cuda_visible_devices = std::to_string(m.slot);
  c.rank = m.rank;
  c.world_size = g.world_size();
  c.local_world_size = 0;
  std::set<std::string> nodes;  // torchrun's groups: nodes in the order their first rank appears
  for (const proto::MemberInfo& o : g.members) {
    if (nodes.insert(o.node).second && o.node == options_.node_name) {
      c.group_rank = static_cast<int>(nodes.size()) - 1;
    }
    if (o.node != options_.node_name) continue;
    if (o.rank < m.rank) ++c.local_rank;
    ++c.local_world_size;
  }
  c.group_world_size = std::max<int>(1, static_cast<int>(nodes.size()));
  // Every generation change restarts a restart-mode trainer set (in place, the count of changes).
  c.restart_count = static_cast<int>(
      std::clamp<int64_t>(g.generation - 1, 0, launcher::EnvContract::kUnboundedRestarts));
  c.max_restarts = launcher::EnvContract::kUnboundedRestarts;
  c.master_addr = g.master_addr.empty() ? "127.0.0.1" : g.master_addr;
  c.master_port = g.master_port;
  return c;
}

}  // namespace edl::jobclient
