// The client's part in distillation services: running teachers (jobclient/teacher_runner.h) and
// relaying the server's member lists to the node's distilling trainers (PROTOCOL.md, "Services").
#include <glog/logging.h>

#include "jobclient/client.h"

namespace edl::jobclient {

using nlohmann::json;

namespace {
constexpr size_t kMaxWatchedServices = 64;  // per client, whatever its trainers ask
}  // namespace

TeacherRunner* Client::Teachers() {
  if (!teacher_runner_ && !options_.teachers.commands.empty()) {
    teacher_runner_ = std::make_unique<TeacherRunner>(launcher_.get(), options_.teachers);
  }
  return teacher_runner_.get();
}

void Client::OnTeacherOrder(const proto::TeacherOrder& o) {
  auto refuse = [&](const std::string& why) {
    LOG(WARNING) << "edl client " << options_.node_name << ": " << proto::NameOf(o.type) << " " << o.name << ": "
                 << why;
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
    SendToServer(j, /*queue_if_offline=*/false);
  };
  TeacherRunner* r = Teachers();
  if (r == nullptr) return refuse("this node offers no service (start its client with --service NAME = COMMAND)");
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
    SendToServer(j, /*queue_if_offline=*/false);  // a reconnect's hello lists the live ones
  }
}

Status Client::OnServiceWatch(Trainer* t, const proto::ServiceWatch& w) {
  auto it = service_watchers_.find(w.service);
  if (it == service_watchers_.end()) {
    if (service_watchers_.size() >= kMaxWatchedServices) {
      return Status::InvalidArgument("the node's trainers already watch " + std::to_string(kMaxWatchedServices) +
                                     " services");
    }
    it = service_watchers_.emplace(w.service, std::set<std::string>()).first;
    json j;
    w.EncodeTo(&j);
    SendToServer(j, /*queue_if_offline=*/false);  // ResendServiceWatches after a (re)connect
  }
  it->second.insert(t->id);
  auto m = service_members_.find(w.service);
  if (m != service_members_.end() && t->channel) t->channel->Send(m->second);
  return Status::OK();
}

void Client::OnServiceMembers(const proto::ServiceMembers& m) {
  auto it = service_watchers_.find(m.service);
  if (it == service_watchers_.end()) return;  // nobody here watches it (any more)
  json clean;  // only the fields we decoded travel on
  m.EncodeTo(&clean);
  service_members_[m.service] = clean;
  for (auto id = it->second.begin(); id != it->second.end();) {
    auto t = trainers_.find(*id);
    if (t == trainers_.end()) {  // the trainer is gone
      id = it->second.erase(id);
      continue;
    }
    if (t->second.channel) t->second.channel->Send(clean);
    ++id;
  }
}

void Client::ResendServiceWatches() {
  for (const auto& [service, ids] : service_watchers_) {
    proto::ServiceWatch w;
    w.service = service;
    json j;
    w.EncodeTo(&j);
    server_->Send(j);
  }
}

}  // namespace edl::jobclient
