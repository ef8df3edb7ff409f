#include "jobserver/services/service_registry.h"

#include <glog/logging.h>

namespace edl::jobserver {

using nlohmann::json;

ServiceRegistry::ServiceRegistry(Clock* clock, SendFn send, ServiceLimits limits)
    : clock_(clock), send_(std::move(send)), limits_(limits) {}

Status ServiceRegistry::Attach(uint64_t peer, const proto::Hello& hello, uint64_t* replaced) {
  *replaced = 0;
  if (hello.role != proto::Role::kTeacher && hello.role != proto::Role::kStudent) {
    return Status::InvalidArgument("ServiceRegistry: role '" +
                                   std::string(proto::NameOf(hello.role)) +
                                   "' is not a service role");
  }
  if (services_.count(hello.service) == 0 && services_.size() >= limits_.max_services) {
    return Status::InvalidArgument("the server already tracks " +
                                   std::to_string(limits_.max_services) + " services; service '" +
                                   hello.service + "' is one too many");
  }
  Service& s = services_[hello.service];
  if (hello.role == proto::Role::kStudent) {
    if (s.watchers.size() >= limits_.max_watchers_per_service) {
      return Status::InvalidArgument("service '" + hello.service + "' already has " +
                                     std::to_string(limits_.max_watchers_per_service) +
                                     " students");
    }
    s.watchers.insert(peer);
    watcher_of_[peer].insert(hello.service);
    return Status::OK();
  }
  auto old = s.teachers.find(hello.node);
  if (old == s.teachers.end() && s.teachers.size() >= limits_.max_teachers_per_service) {
    return Status::InvalidArgument("service '" + hello.service + "' already has " +
                                   std::to_string(limits_.max_teachers_per_service) + " teachers");
  }
  if (old != s.teachers.end()) {
    // A restarted teacher (or a half-dead connection of the same one): the new one wins.
    *replaced = old->second.peer;
    teacher_of_.erase(old->second.peer);
    LOG(WARNING) << "service " << hello.service << ": teacher " << hello.node
                 << " registered again; closing its older connection";
  }
  Teacher t;
  t.peer = peer;
  t.member = {hello.node, hello.host, hello.port};
  t.joined_us = clock_->NowMicros();
  s.teachers[hello.node] = t;
  teacher_of_[peer] = {hello.service, hello.node};
  LOG(INFO) << "service " << hello.service << ": teacher " << hello.node << " at " << hello.host
            << ":" << hello.port << " joined (" << s.teachers.size() << " teachers)";
  Push(hello.service);
  return Status::OK();
}

Status ServiceRegistry::OnMessage(uint64_t peer, const std::string& type, const json& msg) {
  if (type == proto::msg::kHeartbeat) return Status::OK();
  auto t = teacher_of_.find(peer);
  if (t == teacher_of_.end() || type != proto::msg::kServiceStats) {
    return Status::InvalidArgument(
        std::string(t == teacher_of_.end() ? "students" : "teachers") + " send only 'heartbeat'" +
        (t == teacher_of_.end() ? "" : " and 'service_stats'") + ", got '" + type + "'");
  }
  proto::ServiceStats st;
  EDL_RETURN_IF_ERROR(st.DecodeFrom(msg));
  services_[t->second.first].teachers[t->second.second].last = st;
  return Status::OK();
}

Status ServiceRegistry::Watch(uint64_t peer, const std::string& service) {
  if (teacher_of_.count(peer)) return Status::InvalidArgument("a teacher does not watch services");
  if (services_.count(service) == 0 && services_.size() >= limits_.max_services) {
    return Status::InvalidArgument("the server already tracks " +
                                   std::to_string(limits_.max_services) + " services; service '" +
                                   service + "' is one too many");
  }
  Service& s = services_[service];
  if (s.watchers.count(peer)) return Status::OK();
  if (s.watchers.size() >= limits_.max_watchers_per_service) {
    return Status::InvalidArgument("service '" + service + "' already has " +
                                   std::to_string(limits_.max_watchers_per_service) + " students");
  }
  s.watchers.insert(peer);
  watcher_of_[peer].insert(service);
  json j;
  Members(service).EncodeTo(&j);
  send_(peer, j);
  return Status::OK();
}

void ServiceRegistry::Welcomed(uint64_t peer) {
  auto w = watcher_of_.find(peer);
  if (w == watcher_of_.end()) return;
  for (const std::string& service : w->second) {
    json j;
    Members(service).EncodeTo(&j);
    send_(peer, j);
  }
}

void ServiceRegistry::Remove(uint64_t peer) {
  std::set<std::string> touched;
  if (auto w = watcher_of_.find(peer); w != watcher_of_.end()) {
    for (const std::string& service : w->second) services_[service].watchers.erase(peer);
    touched = std::move(w->second);
    watcher_of_.erase(w);
  }
  if (auto t = teacher_of_.find(peer); t != teacher_of_.end()) {
    const std::string service = t->second.first;
    const std::string name = t->second.second;
    teacher_of_.erase(t);
    Service& s = services_[service];
    s.teachers.erase(name);
    LOG(WARNING) << "service " << service << ": teacher " << name << " lost (" << s.teachers.size()
                 << " left)";
    Push(service);
    touched.insert(service);
  }
  // A service nobody serves or watches any more is forgotten (the limit counts live ones).
  for (const std::string& service : touched) {
    auto it = services_.find(service);
    if (it != services_.end() && it->second.teachers.empty() && it->second.watchers.empty()) {
      services_.erase(it);
    }
  }
}

proto::ServiceMembers ServiceRegistry::Members(const std::string& service) const {
  proto::ServiceMembers m;
  m.service = service;
  auto it = services_.find(service);
  if (it != services_.end()) {
    for (const auto& [name, t] : it->second.teachers) m.members.push_back(t.member);
  }
  for (const auto& [name, s] : services_) {
    if (!s.teachers.empty()) m.known.push_back(name);
  }
  return m;
}

void ServiceRegistry::Push(const std::string& service) {
  json j;
  Members(service).EncodeTo(&j);
  for (uint64_t w : services_[service].watchers) send_(w, j);
}

json ServiceRegistry::Summary() const {
  json out = json::object();
  const int64_t now = clock_->NowMicros();
  for (const auto& [name, s] : services_) {
    if (s.teachers.empty() && s.watchers.empty()) continue;
    json teachers = json::array();
    for (const auto& [tname, t] : s.teachers) {
      const double p = t.last.period_s > 0 ? t.last.period_s : 1;
      teachers.push_back({{"name", tname},
                          {"host", t.member.host},
                          {"port", t.member.port},
                          {"requests_per_sec", t.last.requests / p},
                          {"samples_per_sec", t.last.samples / p},
                          {"latency_ms", t.last.latency_ms},
                          {"since_s", (now - t.joined_us) / 1e6}});
    }
    out[name] = {{"students", s.watchers.size()}, {"teachers", std::move(teachers)}};
  }
  return out;
}

}  // namespace edl::jobserver
