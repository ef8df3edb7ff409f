// ServiceRegistry: the server's inference services (docs/DISTILLATION.md; PROTOCOL.md,
// "Services"). In the cluster model a service is a job whose members form no ring: its members
// (teachers) register under the service name, their connection and heartbeats are their liveness
// (a lost connection removes the teacher at once), and its member list is pushed to the jobs that
// name it (students watching the service), whole, at subscribe time and after every change.
// Teachers report their load (requests/s, samples/s, mean latency) with each heartbeat; `edl ctl
// status` shows it per service.
//
// The registry knows peers by the server's connection ids and talks back through `send`; it owns
// no sockets, so it is tested without a network.
//
// Thread-safety: none; used from the server's io_context thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"

namespace edl::jobserver {

struct ServiceLimits {
  size_t max_services = 64;  // distinct service names
  size_t max_teachers_per_service = proto::kMaxServiceMembers;
  size_t max_watchers_per_service = 1024;
};

class ServiceRegistry {
 public:
  // Sends one message to the peer with this connection id (the caller drops unknown ids).
  using SendFn = std::function<void(uint64_t peer, const nlohmann::json& msg)>;

  // `clock` is not owned and must outlive the registry.
  ServiceRegistry(Clock* clock, SendFn send, ServiceLimits limits = {});

  // An authenticated hello of role "teacher" or "student" from connection `peer`. A teacher joins
  // its service (replacing an older connection of the same name, whose id goes to *replaced so
  // the caller closes it; 0 otherwise) and its watchers get the new list; a student starts
  // watching its service. InvalidArgument naming the limit when one is reached.
  Status Attach(uint64_t peer, const proto::Hello& hello, uint64_t* replaced);
  // A client's service_watch on behalf of its trainers (connection `peer`, already a client):
  // it watches `service` too and gets its member list now and after every change. Limits as for
  // students; watching again is a no-op.
  Status Watch(uint64_t peer, const std::string& service);
  // The welcome of an attached peer is out: a student now gets its service's member list.
  void Welcomed(uint64_t peer);
  // A message from an attached peer. Teachers send service_stats (and heartbeats); students only
  // heartbeats. InvalidArgument for anything else (the caller closes the peer).
  Status OnMessage(uint64_t peer, const std::string& type, const nlohmann::json& msg);
  // Connection `peer` closed (any peer; unknown ids are ignored). A teacher leaves its service.
  void Remove(uint64_t peer);

  bool IsTeacher(uint64_t peer) const { return teacher_of_.count(peer) > 0; }
  // {"<service>": {"students": N, "teachers": [{"name","host","port","requests_per_sec",
  //  "samples_per_sec","latency_ms","since_s"}]}} for `edl ctl status`.
  nlohmann::json Summary() const;
  // The member list message of `service` (empty members when unknown).
  proto::ServiceMembers Members(const std::string& service) const;

 private:
  struct Teacher {
    uint64_t peer = 0;
    proto::ServiceMember member;
    int64_t joined_us = 0;
    proto::ServiceStats last;  // the latest report
  };
  struct Service {
    std::map<std::string, Teacher> teachers;  // by name
    std::set<uint64_t> watchers;
  };
  void Push(const std::string& service);

  Clock* const clock_;  // not owned
  const SendFn send_;
  const ServiceLimits limits_;
  std::map<std::string, Service> services_;
  std::map<uint64_t, std::pair<std::string, std::string>> teacher_of_;  // peer -> service, name
  std::map<uint64_t, std::set<std::string>> watcher_of_;                // peer -> services
};

}  // namespace edl::jobserver
