// The client's part in running teachers (jobclient/teacher_runner.h; PROTOCOL.md, "Services:
// teachers run by clients").
#include <glog/logging.h>

#include "jobclient/client.h"

namespace edl::jobclient {

using nlohmann::json;

void Client::OnTeacherOrder(const json& msg) {
  proto::TeacherOrder o;
  Status s = o.DecodeFrom(msg);
  if (!s.ok()) return server_->Close(s);
  auto refuse = [&](const std::string& why) {
    LOG(WARNING) << "edl client " << options_.node_name << ": " << o.type << " " << o.name << ": " << why;
    proto::TeacherOrder e;
    e.type = proto::msg::kTeacherExit;
    e.service = o.service;
    e.name = o.name;
    e.why = why.substr(0, proto::kMaxTeacherWhyBytes);
    for (char& c : e.why) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    json j;
    e.EncodeTo(&j);
    SendToServer(j, /*queue_if_offline=*/false);
  };
  if (!teacher_runner_) return refuse("this node offers no service (start its client with --service NAME = COMMAND)");
  if (o.type == proto::msg::kTeacherStart) {
    if (s = teacher_runner_->Start(o.service, o.name); !s.ok()) refuse(s.ToString());
  } else if (!teacher_runner_->Stop(o.name, clock_->NowMicros())) {
    refuse("not running");
  }
}

void Client::PollTeachers() {
  if (!teacher_runner_) return;
  for (const proto::TeacherOrder& e : teacher_runner_->Poll(clock_->NowMicros())) {
    json j;
    e.EncodeTo(&j);
    SendToServer(j, /*queue_if_offline=*/false);  // a reconnect's hello lists the live ones
  }
}

}  // namespace edl::jobclient
