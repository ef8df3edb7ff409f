// `edl ctl` at the server: its commands (docs/WATCHING.md "edl ctl"), stopping the one job as one
// decision (STATE.md "Stopping a job"), the status body and the watchers it is streamed to.
#include <glog/logging.h>

#include "edl/proto/frame.h"
#include "edl/proto/messages.h"
#include "jobserver/events/events.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

using nlohmann::json;

void Server::OnCtl(const std::shared_ptr<Peer>& peer, const json& msg) {
  proto::CtlRequest r;
  Status s = r.DecodeFrom(msg);
  if (!s.ok()) return Reject(peer, s);
  using Command = proto::CtlCommand;
  proto::CtlReply rep;
  bool stopping = stop_deadline_us_ >= 0;
  const bool stop = r.command == Command::kStop;
  switch (r.command) {
    case Command::kSubmit:
    case Command::kJobs:
    case Command::kCancel:
    case Command::kScale:
      rep.status = OnJobCtl(peer, r);
      break;
    case Command::kWatch:
      peer->watch = true;
      break;
    case Command::kStop:
      if (stop_deadline_us_ >= 0) break;
      LOG(INFO) << "ctl " << peer->conn->peer() << ": stop";
      Record("", events::Stopped{"ctl"});
      stopping = BeginStop("ctl");
      break;
    case Command::kStatus:
      break;
  }
  // A stop's caller also hears how it ended (MaybeEndStop): whether the final checkpoint was saved.
  if (stop && stopping) stop_callers_.push_back(peer);
  Dispatch();
  if (!DropIfNotReading(peer)) {
    rep.body = StatusBody();
    if (stop && stopping) rep.body["stop_timeout_s"] = options_.stop_timeout_ms / 1000;
    json j;
    rep.EncodeTo(&j);
    peer->conn->Send(j);
  }
  if (stop && !stopping) Shutdown(/*stop_clients=*/true);
}

Status Server::OnJobCtl(const std::shared_ptr<Peer>& peer, const proto::CtlRequest& r) {
  using Command = proto::CtlCommand;
  if (r.command == Command::kJobs) return Status::OK();  // the reply's body lists them
  // `scale --service NAME N`: the teachers of a distillation service (a client offers it, or it
  // has a desired count already).
  if (r.command == Command::kScale && !r.service.empty()) {
    if (!placer_.Knows(r.service)) {
      return Status::NotFound("no client offers a service '" + r.service +
                              "' (start one with --service " + r.service + " = 'edl teacher ...')");
    }
    LOG(INFO) << "ctl " << peer->conn->peer() << ": scale service " << r.service << " to " << r.n;
    return placer_.SetDesired(r.service, static_cast<int>(r.n));
  }
  if (r.command == Command::kSubmit) {
    JobSpec spec;
    EDL_RETURN_IF_ERROR(DecodeJobSpec(r.spec, &spec));
    if (spec.job.name == options_.id) {
      return Status::InvalidArgument("job name " + spec.job.name +
                                     " is the server's own --job_id (its "
                                     "cluster-wide records use it); pick another name");
    }
    EDL_RETURN_IF_ERROR(cluster_.Submit(spec));
    LOG(INFO) << "ctl " << peer->conn->peer() << ": submitted job " << spec.job.name << " (type "
              << spec.job.type << ", " << spec.job.min_trainers << ".." << spec.job.max_trainers
              << " trainers, priority " << spec.job.priority << ")";
    Record(spec.job.name, events::Submitted{spec});
    return Status::OK();
  }
  if (r.command == Command::kCancel) {
    if (r.job.empty())
      return Status::InvalidArgument("'cancel' names a job: `edl ctl cancel NAME`");
    LOG(INFO) << "ctl " << peer->conn->peer() << ": cancel " << r.job;
    return cluster_.Cancel(r.job);
  }
  LOG(INFO) << "ctl " << peer->conn->peer() << ": scale " << (r.job.empty() ? "" : r.job + " ")
            << r.n;
  Status s = cluster_.Scale(r.job, static_cast<int>(r.n));
  if (s.code() == Status::Code::kNotFound && placer_.Knows(r.job)) {
    return Status::NotFound(s.message() + "; '" + r.job +
                            "' is a service: `edl ctl scale --service " + r.job + " N`");
  }
  return s;
}

bool Server::BeginStop(const std::string& by) {
  std::vector<proto::MemberInfo> leaving;
  if (!cluster_.StopOwnJob(by, &leaving)) return false;
  for (const proto::MemberInfo& m : leaving) {
    if (nodes_.count(m.node)) stop_waiting_.emplace(m.trainer_id, m.node);
  }
  stop_deadline_us_ = clock_->NowMicros() + options_.stop_timeout_ms * 1000;
  LOG(INFO) << "job " << cluster_.own_job() << " stopping: waiting up to "
            << options_.stop_timeout_ms / 1000 << " s for " << stop_waiting_.size()
            << " trainer(s) to leave (rank 0 saves a final checkpoint first)";
  Dispatch();  // the stop generation goes out now
  MaybeEndStop();
  return true;
}

void Server::MaybeEndStop() {
  if (stop_deadline_us_ < 0 || shutting_down_) return;
  const bool late = clock_->NowMicros() >= stop_deadline_us_;
  if (!stop_waiting_.empty() && !late) return;
  if (late && !stop_waiting_.empty()) {
    LOG(WARNING) << "job " << cluster_.own_job() << ": " << stop_waiting_.size()
                 << " trainer(s) did not leave within --stop_timeout_s; their clients stop them";
  }
  LOG(INFO) << "job " << cluster_.own_job() << " stopped; telling the clients to exit";
  const JobMembership* own = cluster_.FindJob(cluster_.own_job());
  std::string error;
  const Cluster::FinalCheckpoint final = cluster_.FinalCheckpointOf(cluster_.own_job(), &error);
  const char* final_name = events::kFinalCheckpointNames.Name(final);
  Record("", events::StopComplete{own != nullptr ? own->current().generation : 0,
                                  stop_waiting_.size(), final});
  proto::CtlReply outcome;
  if (final == Cluster::FinalCheckpoint::kFailed) {
    outcome.status = Status::FailedPrecondition(
        "job " + cluster_.own_job() + " stopped, but rank 0's final checkpoint failed: " + error +
        "; its trainers resume from the newest checkpoint the store accepted (`edl ckpt ls`)");
  }
  outcome.body = {
      {"stopped", {{"final_checkpoint", final_name}, {"not_left", stop_waiting_.size()}}}};
  json j;
  outcome.EncodeTo(&j);
  for (const auto& caller : stop_callers_) {
    if (!caller->conn->closed()) caller->conn->Send(j);
  }
  Shutdown(/*stop_clients=*/true);
}

bool Server::HasWatchers() const {
  for (const auto& [raw, peer] : peers_) {
    if (peer->watch) return true;
  }
  return false;
}

bool Server::DropIfNotReading(const std::shared_ptr<Peer>& peer) {
  const size_t queued = peer->conn->queued_bytes();
  if (queued <= options_.max_ctl_queue_bytes) return false;
  const Status why = Status::FailedPrecondition(
      "ctl peer " + peer->conn->peer() + " does not read: " + std::to_string(queued) +
      " bytes wait to be written, the limit is " + std::to_string(options_.max_ctl_queue_bytes));
  LOG(WARNING) << "dropping " << (peer->watch ? "watcher" : "ctl") << ": " << why.ToString();
  peer->conn->Close(why);
  return true;
}

void Server::NotifyWatchers(const json& body) {
  std::shared_ptr<const std::string> frame;
  std::vector<std::shared_ptr<Peer>> stuck;
  for (auto& [raw, peer] : peers_) {
    if (!peer->watch || peer->conn->closed()) continue;
    if (peer->conn->queued_bytes() > options_.max_ctl_queue_bytes) {
      stuck.push_back(peer);  // closed after the loop: closing erases from peers_
      continue;
    }
    if (!frame) {
      proto::CtlReply rep;
      rep.body = body;
      json j;
      rep.EncodeTo(&j);
      frame = std::make_shared<const std::string>(proto::EncodeFrame(j));
    }
    peer->conn->SendFrame(frame);
  }
  for (const auto& peer : stuck) DropIfNotReading(peer);
}

json Server::StatusBody() const {
  json s = cluster_.StatusJson();
  s["port"] = port_;
  s["events_log"] = events_.path();
  s["services"] = ServicesSummary();
  return s;
}

}  // namespace edl::jobserver
