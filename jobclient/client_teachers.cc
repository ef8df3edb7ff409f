// The client's part in distillation services: running teachers (jobclient/teacher_runner.h) on the
// server's orders (PROTOCOL.md, "Services"). The node's distilling trainers' service watches are
// the NodeAgent's (node_agent.h).
#include <glog/logging.h>

#include "jobclient/client.h"

namespace edl::jobclient {

using nlohmann::json;

TeacherRunner* Client::Teachers() {
  if (!teacher_runner_ && !options_.teachers.commands.empty()) {
    teacher_runner_ = std::make_unique<TeacherRunner>(launcher_.get(), options_.teachers);
  }
  return teacher_runner_.get();
}

void Client::OnTeacherOrder(const proto::TeacherOrder& o) {
  auto refuse = [&](const std::string& why) {
    LOG(WARNING) << "edl client " << options_.node_name << ": " << proto::NameOf(o.type) << " "
                 << o.name << ": " << why;
    proto::TeacherOrder e;
    e.type = proto::TeacherOrderType::kExit;
    e.service = o.service;
    e.name = o.name;
    e.why = why.substr(0, proto::kMaxTeacherWhyBytes);
    for (char& c : e.why) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    json j;
    e.EncodeTo(&j);
    SendIfConnected(j);
  };
  TeacherRunner* r = Teachers();
  if (r == nullptr)
    return refuse("this node offers no service (start its client with --service NAME = COMMAND)");
  if (o.type == proto::TeacherOrderType::kStart) {
    // The teacher registers with the server this client is connected to now.
    if (Status s = r->Start(o.service, o.name, server_->peer()); !s.ok()) refuse(s.ToString());
  } else if (!r->Stop(o.name, clock_->NowMicros())) {
    refuse("not running");
  }
}

void Client::PollTeachers() {
  if (!teacher_runner_) return;  // none started yet
  for (const proto::TeacherOrder& e : teacher_runner_->Poll(clock_->NowMicros())) {
    json j;
    e.EncodeTo(&j);
    SendIfConnected(j);  // a reconnect's hello lists the live ones
  }
}

}  // namespace edl::jobclient
