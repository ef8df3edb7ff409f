// `edl ctl` at the server: its commands (README "edl ctl"), stopping the job as one decision
// (STATE.md "Stopping a job"), the status body and the watchers it is streamed to.
#include <glog/logging.h>

#include "edl/proto/frame.h"
#include "edl/proto/messages.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

using nlohmann::json;

void Server::OnCtl(const std::shared_ptr<Peer>& peer, const json& msg) {
  proto::CtlRequest r;
  Status s = r.DecodeFrom(msg);
  if (!s.ok()) return Reject(peer, s);
  proto::CtlReply rep;
  bool stopping = stop_deadline_us_ >= 0;
  // `scale NAME N` names a service when a client offers NAME or it has a desired count, and no
  // cluster job is called NAME.
  const bool service_scale = r.command == "scale" && !r.job.empty() && placer_.Knows(r.job) &&
                             !(cluster_ && cluster_->FindJob(r.job) != nullptr);
  if (service_scale) {
    LOG(INFO) << "ctl " << peer->conn->peer() << ": scale service " << r.job << " to " << r.n;
    rep.status = placer_.SetDesired(r.job, static_cast<int>(r.n));
  } else if (cluster_ && (r.command == "submit" || r.command == "jobs" || r.command == "cancel" || r.command == "scale")) {
    rep.status = OnClusterCtl(peer, r);
    if (r.command == "scale" && rep.status.code() == Status::Code::kNotFound) {
      rep.status = Status::NotFound(rep.status.message() + "; nor does a client offer a service '" + r.job +
                                    "' (start one with --service " + r.job + " = 'edl teacher ...')");
    }
  } else if (r.command == "submit" || r.command == "jobs" || r.command == "cancel" || !r.job.empty()) {
    rep.status = Status::FailedPrecondition("'" + r.command + "' with jobs needs a cluster server: start "
                                            "`edl server --cluster` (this one runs the single job " +
                                            options_.scheduler.job_id + "); or, for a service, start a client with "
                                            "--service " + (r.job.empty() ? "NAME" : r.job) + " = 'edl teacher ...'");
  } else if (r.command == "scale") {
    if (r.n < 1) {
      rep.status = Status::InvalidArgument("scale N needs N >= 1");
    } else {
      LOG(INFO) << "ctl " << peer->conn->peer() << ": scale " << r.n;
      scheduler_.SetDesired(static_cast<int>(r.n), "ctl");
    }
  } else if (r.command == "watch") {
    peer->watch = true;
  } else if (r.command == "stop" && stop_deadline_us_ < 0) {
    LOG(INFO) << "ctl " << peer->conn->peer() << ": stop";
    Record({{"type", "stopped"}, {"by", "ctl"}});
    stopping = BeginStop("ctl");
  }
  Dispatch();
  if (!DropIfNotReading(peer)) {
    rep.body = StatusBody();
    json j;
    rep.EncodeTo(&j);
    peer->conn->Send(j);
  }
  if (r.command == "stop" && !stopping) Shutdown(/*stop_clients=*/true);
}

bool Server::BeginStop(const std::string& by) {
  std::vector<proto::MemberInfo> leaving;
  if (cluster_ || !scheduler_.Stop(by, &leaving)) return false;
  for (const proto::MemberInfo& m : leaving) {
    if (nodes_.count(m.node)) stop_waiting_.emplace(m.trainer_id, m.node);
  }
  stop_deadline_us_ = clock_->NowMicros() + options_.stop_timeout_ms * 1000;
  LOG(INFO) << "job " << options_.scheduler.job_id << " stopping: waiting up to "
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
    LOG(WARNING) << "job " << options_.scheduler.job_id << ": " << stop_waiting_.size()
                 << " trainer(s) did not leave within --stop_timeout_s; their clients stop them";
  }
  LOG(INFO) << "job " << options_.scheduler.job_id << " stopped; telling the clients to exit";
  Record({{"type", "stop_complete"}, {"generation", scheduler_.current().generation},
          {"not_left", stop_waiting_.size()}});
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
  json s;
  if (cluster_) {
    s = ClusterStatusBody();
  } else {
    s = scheduler_.Summary();
    s["progress"] = ProgressSummary(scheduler_.current(), progress_);
    s["port"] = port_;
    s["events_log"] = events_.path();
  }
  s["services"] = ServicesSummary();
  return s;
}

}  // namespace edl::jobserver
