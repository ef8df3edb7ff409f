// TeacherServer: the network side of `edl teacher` (docs/DISTILLATION.md; PROTOCOL.md,
// "Services"). It accepts students on TCP, authenticates each with the cluster secret (the
// control plane's handshake and sealed frames), and answers their teacher_request messages with
// the model's logits (or top-k logits), batching concurrent requests adaptively: while the model
// runs, requests queue, and the next forward pass takes every queued request up to `max_batch`
// samples, so the batch grows with the load and a lone request waits for nobody.
//
// Optionally it registers with an edl server under its service name and reports its request rate
// and latency with every heartbeat (`Register`); the server's member list of the service is what
// students follow.
//
// Every per-peer resource is capped: authenticated students (`max_students`), connections that
// have not authenticated (`unauthenticated`, oldest closed first, so that idle connections without
// the secret cannot lock students out), requests queued per student
// (`max_queued_per_student`, beyond which a request is answered Unavailable), the frame size of
// requests, and the handshake time. No answer is computed for nobody: a request its student
// cancels (teacher_cancel) before its forward pass is dropped and answered Aborted, and the queued
// requests of a student whose connection closed are dropped.
//
// Thread-safety: Start / Stop / port / TakeStats from one thread (main); internally one accept
// thread, one thread per student connection, one inference thread and, when registered, one
// server thread, sharing state under mu_.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/net/admission.h"
#include "edl/proto/service_messages.h"

namespace edl::teacher {

struct TeacherServerOptions {
  std::string bind_host = "0.0.0.0";
  int port = 0;           // 0: an ephemeral port (port() tells which)
  std::string service;    // the service this teacher serves (students must name it)
  std::string name;       // this teacher's name in the service
  std::string secret;     // the cluster secret
  int max_students = 64;  // concurrent authenticated students
  // Connections that have not authenticated yet, in all and per source address: beyond either
  // bound the oldest of them is closed (edl/net/admission.h). They never count against
  // max_students. max_total 0: the edl server's default, from the open-file limit.
  net::AdmissionControl::Limits unauthenticated{0, 0};
  int max_queued_per_student = 16;
  int max_batch = 1024;  // samples per forward pass
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds io_timeout{10000};  // one reply send
};

// Runs the model: batches[i]'s logits, all rows [sum of batch sizes, classes] in order. A non-OK
// status fails every request of the pass (e.g. an index outside the dataset).
using InferFn = std::function<Status(const std::vector<const proto::TeacherRequest*>& batches,
                                     std::vector<float>* logits)>;
// Checks one request before it is queued (e.g. indices inside the dataset); non-OK answers it.
using CheckFn = std::function<Status(const proto::TeacherRequest& r)>;

struct TeacherStats {
  int64_t requests = 0, samples = 0, passes = 0;
  // Queued requests dropped unanswered-by-the-model: cancelled by their student (teacher_cancel),
  // or whose student's connection closed.
  int64_t cancelled = 0, orphaned = 0;
  double latency_ms_sum = 0;  // receive -> answer sent, summed over requests
};

class TeacherServer {
 public:
  // `classes`: the model's class count. `check` may be null.
  TeacherServer(TeacherServerOptions options, int classes, InferFn infer, CheckFn check);
  ~TeacherServer();  // Stop()
  TeacherServer(const TeacherServer&) = delete;
  TeacherServer& operator=(const TeacherServer&) = delete;

  // Binds and starts serving. IOError naming the address when the port cannot be bound.
  Status Start();
  // Registers with the edl server at `server` (HOST:PORT) as `advertise_host`:port() and keeps
  // the registration alive (heartbeats with this teacher's stats; reconnects with backoff when
  // the server goes away). The first attempt must succeed (its error is returned).
  Status Register(const std::string& server, const std::string& advertise_host);
  // Stops accepting, closes every connection, joins every thread. Idempotent.
  void Stop();
  int port() const;
  // Counters since the previous call.
  TeacherStats TakeStats();
  // Counters since Start (tests).
  TeacherStats Totals() const;
  // Requests waiting for a forward pass (tests).
  size_t queued() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace edl::teacher
