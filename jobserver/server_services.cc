// The server's side of teacher services run by clients (README "Distillation"): placing the
// teachers jobserver/service_placement.h decides on, the clients' teacher_exit reports, and the
// services' part of `edl ctl status`.
#include <glog/logging.h>

#include "edl/proto/messages.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

using nlohmann::json;

void Server::PlaceTeachers() {
  for (const ServicePlacer::Order& o : placer_.Reconcile(clock_->NowMicros())) {
    proto::TeacherOrder t;
    t.type = o.start ? proto::msg::kTeacherStart : proto::msg::kTeacherStop;
    t.service = o.service;
    t.name = o.name;
    json j;
    t.EncodeTo(&j);
    LOG(INFO) << "service " << o.service << ": " << (o.start ? "start" : "stop") << " teacher " << o.name
              << " on node " << o.node;
    SendToNode(o.node, j);
    status_dirty_ = true;
  }
}

void Server::OnTeacherExit(const std::shared_ptr<Peer>& peer, const json& msg) {
  proto::TeacherOrder e;
  if (Status s = e.DecodeFrom(msg); !s.ok() || e.type != proto::msg::kTeacherExit) {
    return Reject(peer, s.ok() ? Status::InvalidArgument("expected teacher_exit") : s);
  }
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
