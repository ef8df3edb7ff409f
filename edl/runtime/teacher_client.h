// TeacherClient: the student side of distillation (docs/DISTILLATION.md; PROTOCOL.md,
// "Services"). It keeps a window of teacher requests in flight ahead of the training step that
// needs them, spreads them over the service's teachers by measured latency, sends a request again
// to another teacher when its teacher dies, is removed or does not answer in time, and never
// holds a step longer than `answer_wait`: a batch without an answer by then is trained on labels
// only and counted (TeacherCounters::fallback).
//
// Teachers come from the edl server (`server`: the client watches the service and gets its member
// list whenever it changes), from the trainer's node client relaying the server's lists (`feed`),
// or from a fixed address list (`teachers`). Every connection is
// authenticated and sealed with the cluster secret; every reply is validated (shape, class count,
// finite values) and a teacher that answers with the wrong shape is dropped with an error in the
// log, its requests going to the others.
//
// Thread-safety: Request / Get / counters from any thread (the training thread in practice).
// Internally: one discovery thread (with a server), one maintenance thread (connects, re-sends,
// dispatches) and one reader thread per connected teacher, all under mu_.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/membership.h"
#include "edl/runtime/teacher_source.h"

namespace edl::runtime {

struct TeacherClientOptions {
  std::string service;  // the service name the teachers registered under
  std::string server;   // HOST:PORT of the edl server; empty: `feed` or `teachers`
  // The member lists relayed by the trainer's node client (not owned; outlives the client); used
  // when `server` is empty.
  ServiceFeed* feed = nullptr;
  std::vector<std::string> teachers;  // fixed HOST:PORT list when there is no server
  std::string secret;                 // the cluster secret (--secret_file's content)
  int classes = 0;                    // the student's class count; replies must match it
  // The student's augmentation (the teachers fill the same images from the indices and seed).
  bool random_crop = false;
  int pad = 4;
  bool flip = false;
  int top_k = 0;  // 0: every class's logit; k: the k largest per sample (less traffic)
  // Get waits at most this long for a batch that is not answered yet (then: labels only).
  std::chrono::milliseconds answer_wait{2000};
  // A request unanswered for this long goes to another teacher (when there is one).
  std::chrono::milliseconds resend_after{1000};
  // No teacher of the service listed for this long: Get fails with NotFound (an unknown service).
  std::chrono::milliseconds discovery_wait{30000};
  std::chrono::milliseconds io_timeout{5000};  // connect, handshake, one send
  int max_inflight_per_teacher = 4;            // requests outstanding at one teacher
  size_t max_batches = 256;                    // batches held (asked ahead, not taken yet)
};

class TeacherClient : public TeacherSource {
 public:
  // Validates the options and starts the threads. With a server, the first connection to it must
  // succeed (Unavailable / Unauthenticated naming the server otherwise); teachers may come later.
  static StatusOr<std::unique_ptr<TeacherClient>> Create(const TeacherClientOptions& options);
  ~TeacherClient() override;  // stops and joins every thread

  void Request(const std::vector<int64_t>& indices, uint64_t aug_seed) override;
  Status Get(const std::vector<int64_t>& indices, uint64_t aug_seed, int classes, float* logits,
             uint8_t* has) override;
  TeacherCounters counters() const override;

  // Names of the teachers connected now (tests and logs).
  std::vector<std::string> Connected() const;

  class Impl;

 private:
  explicit TeacherClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace edl::runtime
