// The server's side of teacher services run by clients (docs/DISTILLATION.md "Teachers run by the
// clients"): placing the teachers jobserver/services/service_placement.h decides on, the clients'
// teacher_exit reports, and the services' part of `edl ctl status`.
#include <glog/logging.h>

#include "edl/proto/messages.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

using nlohmann::json;

void Server::PlaceTeachers() {
  const std::vector<ServicePlacer::Order> orders = placer_.Reconcile(clock_->NowMicros());
  // Kept (synced) before any order reaches a client: a restarted server knows every teacher it
  // placed and the desired counts (STATE.md "Keys": services).
  if (placer_.TakeChanged() && !Persist()) return;
  for (const ServicePlacer::Order& o : orders) {
    proto::TeacherOrder t;
    t.type = o.start ? proto::TeacherOrderType::kStart : proto::TeacherOrderType::kStop;
    t.service = o.service;
    t.name = o.name;
    json j;
    t.EncodeTo(&j);
    LOG(INFO) << "service " << o.service << ": " << (o.start ? "start" : "stop") << " teacher "
              << o.name << " on node " << o.node;
    SendToNode(o.node, j);
    status_dirty_ = true;
  }
}

void Server::RestoreServices(const ServicesState& s) {
  if (s.empty()) return;
  // A node has the scheduler's grace to re-attach: one heartbeat timeout on top of the usual one.
  placer_.Restore(s, clock_->NowMicros(), 2 * options_.cluster.heartbeat_timeout_us);
  LOG(INFO) << "services restored: " << s.desired.size() << " desired count(s), "
            << s.teachers.size() << " teacher(s) placed, awaiting their nodes";
}

void Server::OnTeacherExit(const std::shared_ptr<Peer>& peer, const proto::TeacherOrder& e) {
  placer_.Exited(peer->node, e.name, e.why, clock_->NowMicros());  // only the node's own teachers
  status_dirty_ = true;
}

json Server::ServicesSummary() const {
  json s = services_.Summary();
  const json placement = placer_.Summary(clock_->NowMicros());
  for (const auto& [service, placed] : placement.items()) {
    json& e = s[service];
    if (!e.contains("teachers")) e = {{"students", 0}, {"teachers", json::array()}};
    for (const auto& [k, v] : placed.items()) e[k] = v;
  }
  return s;
}

}  // namespace edl::jobserver
