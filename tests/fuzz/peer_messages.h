// One valid example of every message a node's client, a trainer or `edl ctl` sends the job
// server (and of every trainer event kind), built from the typed structs' encoders: the seeds the
// type mutations of json_mutation.h start from. `trainer`: a trainer placed on the sender's node;
// `generation`: the job's newest.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"

namespace edl::fuzz {

using nlohmann::json;

// The trainer events a trainer sends (edl/runtime), each as its "event" object.
inline std::vector<json> TrainerEventBodies(int64_t generation) {
  return {
      {{"event", "config"}, {"fingerprint", "data=fashion batch=64 model=resnet20"}},
      {{"event", "joiner_first_step"}, {"generation", generation}, {"since_start_s", 1.5}},
      {{"event", "reform_failed"}, {"generation", generation}, {"error", "peer gone"}},
      {{"event", "comm_failed"}, {"generation", generation}},
      {{"event", "checkpoint_saved"}, {"ok", true}, {"saves", 2}, {"seconds", 0.25}},
      {{"event", "checkpoint_failed"},
       {"step", 10},
       {"refused", false},
       {"code", "IOError"},
       {"error", "disk full"},
       {"failed", 1},
       {"failed_total", 1},
       {"store", "/tmp/ckpt"}},
      {{"event", "stop_checkpoint"},
       {"generation", generation},
       {"step", 12},
       {"ok", false},
       {"error", "no space"}},
      {{"event", "stall"},
       {"generation", generation},
       {"from_generation", generation > 0 ? generation - 1 : 0},
       {"world_before", 2},
       {"world_after", 3},
       {"switch_step", 7},
       {"failure", false},
       {"stall_s", 0.4},
       {"reform_s", 0.1}},
      {{"event", "sync"},
       {"generation", generation},
       {"rank", 0},
       {"world_size", 2},
       {"state_hash", "123"}},
      {{"event", "eval"}, {"generation", generation}, {"step", 10}, {"accuracy", 0.9}},
      {{"event", "leave"}, {"generation", generation}, {"step", 10}},
  };
}

// What a node's client sends the server (proto::ClientFrame), with trainer events relayed.
inline std::vector<json> NodeMessages(const std::string& trainer, int64_t generation) {
  std::vector<json> out;
  out.push_back(proto::Heartbeat().Encoded());
  proto::TrainerExit exit;
  exit.trainer_id = trainer;
  exit.exited = true;
  exit.code = 1;
  exit.error = "Traceback: boom";
  out.push_back(exit.Encoded());
  proto::Ready ready;
  ready.trainer_id = trainer;
  ready.generation = generation;
  out.push_back(ready.Encoded());
  proto::Progress progress;
  progress.trainer_id = trainer;
  progress.report.generation = generation;
  progress.report.step = 5;
  progress.report.loss = 1.5;
  progress.report.images_per_sec = 100;
  progress.report.world_size = 2;
  out.push_back(progress.Encoded());
  // Every optional field: what the job measures of itself and its batch rule.
  progress.report.samples = 640;
  progress.report.noise_steps = 12;
  progress.report.grad_sqr = 0.5;
  progress.report.grad_var = 40;
  progress.report.noise_scale = 80;
  progress.report.compute_s_per_sample = 0.002;
  progress.report.sync_s = 0.03;
  progress.report.batch = 32;
  progress.report.batch_policy = BatchPolicy::kFixedGlobal;
  out.push_back(progress.Encoded());
  for (const json& body : TrainerEventBodies(generation)) {
    proto::Event e;
    e.trainer_id = trainer;
    e.event = body;
    out.push_back(e.Encoded());
  }
  proto::KvRequest kv;
  kv.req_id = 7;
  kv.op = proto::KvOp::kSet;
  kv.key = "rdzv/1/addr";
  kv.value = "127.0.0.1:1234";
  out.push_back(kv.Encoded());
  kv.op = proto::KvOp::kWait;
  kv.timeout_ms = 1000;
  out.push_back(kv.Encoded());
  proto::NodeStats st;
  st.cpu_busy = 1.5;
  st.cpu_cores = 2;
  st.gpu_util = 40;
  out.push_back(st.Encoded());
  proto::ServiceWatch w;
  w.service = "teacher";
  out.push_back(w.Encoded());
  proto::TeacherOrder t;
  t.type = proto::TeacherOrderType::kExit;
  t.service = "teacher";
  t.name = "t0";
  t.why = "exit 1";
  out.push_back(t.Encoded());
  return out;
}

// What `edl ctl` sends (every command but `stop`, which ends the server by design).
inline std::vector<json> CtlMessages() {
  std::vector<json> out;
  using C = proto::CtlCommand;
  for (C c : {C::kStatus, C::kScale, C::kWatch, C::kJobs, C::kSubmit, C::kCancel}) {
    proto::CtlRequest r;
    r.command = c;
    if (c == C::kScale) r.n = 3;
    if (c == C::kCancel) r.job = "other";
    if (c == C::kSubmit)
      r.spec = {{"name", "j2"}, {"type", "resnet"}, {"min_trainers", 1}, {"max_trainers", 2}};
    out.push_back(r.Encoded());
  }
  return out;
}

}  // namespace edl::fuzz
