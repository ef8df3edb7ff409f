// A stand-in trainer for the control-plane integration tests. It appends one JSON line per event
// (start, generation seen, leave, term, kv) with its pid and env to $STANDIN_RECORD, and:
//  - STANDIN_MODE=restart: sleeps until SIGTERM (a torchrun-style program, restarted by the
//  client);
//  - otherwise (in-place): connects its TrainerChannel, reports ready when EDL_JOINING=1, follows
//    generations, does a KV round per generation, and exits 0 once a generation no longer
//    contains it, or, with STANDIN_EXIT_AFTER_MS=T, T ms after starting (training "finished");
//    with STANDIN_HOLD_READY_FILE=F a joiner holds its ready report while F exists;
//  - started as a warm spare (EDL_SPARE): records "spare", waits for its assignment through the
//    runtime (edl::runtime::PlanRunFromProcess) and goes on as the assigned trainer ("start"
//    carries "spare": its spare id), or records "spare_released" and exits 0; with
//    STANDIN_SPARE_FAIL_WITH=LINE a spare prints LINE to stderr and exits 3 instead (a spare that
//    cannot start), with STANDIN_IGNORE_SPARE=1 it goes on as if it were a trainer (a command
//    that knows nothing of spares);
//  - STANDIN_FAIL_WITH=LINE: prints LINE to stderr and exits 3 at once (a trainer that keeps
//  failing);
//  - STANDIN_CONFIG=FP: reports a "config" event with fingerprint FP before anything else (as the
//    runtime does with ElasticOptions::config_fingerprint);
//  - STANDIN_FINAL_CHECKPOINT_ERROR=MSG: rank 0 leaving a stop generation reports its final save as
//    failed with MSG (a "stop_checkpoint" event with ok false, as `edl train` does).
//  - SIGUSR1: reports a "comm_failed" event for the newest generation it has seen and records
//    "comm_failed" (as the runtime does when a collective fails: a peer died).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "edl/net/trainer_channel.h"
#include "edl/proto/rendezvous_key.h"
#include "edl/runtime/env_contract.h"
#include "edl/runtime/run_mode.h"

namespace {

std::atomic<bool> g_term{false};
std::atomic<bool> g_comm_failed{false};
edl::runtime::EnvContract g_env;  // the env contract the client built, parsed as a trainer would

std::string Env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

void Record(nlohmann::json j) {
  j["pid"] = ::getpid();
  j["trainer_id"] = g_env.trainer_id;
  j["job_id"] = g_env.job_id;
  const std::string line = j.dump() + "\n";
  const int fd = ::open(Env("STANDIN_RECORD").c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());  // one write: lines from trainers never interleave
  ::close(fd);
}

}  // namespace

int main() {
  std::signal(SIGTERM, [](int) { g_term = true; });
  std::signal(SIGUSR1, [](int) { g_comm_failed = true; });
  std::signal(SIGPIPE, SIG_IGN);
  auto contract = edl::runtime::TrainerEnvFromProcess();
  if (!contract.ok()) {
    Record({{"event", "contract_error"}, {"error", contract.status().ToString()}});
    return 3;
  }
  g_env = contract.value();
  std::string was_spare;
  if (g_env.spare != edl::runtime::SpareKind::kNone && Env("STANDIN_IGNORE_SPARE") != "1") {
    was_spare = g_env.trainer_id;
    Record({{"event", "spare"}, {"spare", was_spare}, {"world_size", g_env.world_size}});
    if (!Env("STANDIN_SPARE_FAIL_WITH").empty()) {
      std::fprintf(stderr, "%s\n", Env("STANDIN_SPARE_FAIL_WITH").c_str());
      return 3;
    }
    auto plan = edl::runtime::PlanRunFromProcess();
    if (!plan.ok()) {
      Record(
          {{"event", "spare_released"}, {"spare", was_spare}, {"error", plan.status().ToString()}});
      return plan.status().code() == edl::Status::Code::kAborted ? 0 : 3;
    }
    g_env = plan.value().env;
  }
  Record({{"event", "start"},
          {"spare", was_spare},
          {"generation", g_env.generation},
          {"rank", g_env.rank},
          {"world_size", g_env.world_size},
          {"slot", g_env.slot},
          {"joining", g_env.joining},
          {"restart_mode", g_env.restart_mode},
          {"master", g_env.master_addr + ":" + std::to_string(g_env.master_port)}});
  if (!Env("STANDIN_FAIL_WITH").empty()) {
    std::fprintf(stderr, "%s\n", Env("STANDIN_FAIL_WITH").c_str());
    return 3;
  }
  if (Env("STANDIN_MODE") == "restart") {
    while (!g_term) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Record({{"event", "term"}});
    return 0;
  }
  using std::chrono::milliseconds;
  const std::string id = g_env.trainer_id;
  auto ch = edl::net::TrainerChannel::Connect(g_env.client_socket, id, milliseconds(5000),
                                              milliseconds(200));
  if (!ch.ok()) {
    Record({{"event", "channel_error"}, {"error", ch.status().ToString()}});
    return 3;
  }
  const int64_t start_gen = g_env.generation;
  if (!Env("STANDIN_CONFIG").empty()) {
    (void)ch.value()->ReportEvent({{"event", "config"}, {"fingerprint", Env("STANDIN_CONFIG")}});
  }
  // STANDIN_HOLD_READY_FILE=F: a joiner reports ready only once F no longer exists (a prepare
  // phase that lasts as long as a test needs, e.g. to kill the server in the middle of a grow).
  const std::string hold = Env("STANDIN_HOLD_READY_FILE");
  if (g_env.joining && !hold.empty() && ::access(hold.c_str(), F_OK) == 0) {
    Record({{"event", "holding"}, {"generation", start_gen}});
    while (!g_term && ::access(hold.c_str(), F_OK) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (g_env.joining) (void)ch.value()->ReportReady(start_gen);
  int64_t seen = 0;
  int last_rank = -1;
  const std::string exit_after = Env("STANDIN_EXIT_AFTER_MS");
  const auto finish_at =
      std::chrono::steady_clock::now() +
      milliseconds(exit_after.empty() ? INT32_MAX : std::atoll(exit_after.c_str()));
  while (!g_term) {
    if (std::chrono::steady_clock::now() >= finish_at) {
      Record({{"event", "finished"}});
      return 0;
    }
    if (g_comm_failed.exchange(false)) {
      (void)ch.value()->ReportEvent({{"event", "comm_failed"}, {"generation", seen}});
      Record({{"event", "comm_failed"}, {"generation", seen}});
    }
    edl::proto::GenerationInfo g;
    edl::Status s = ch.value()->WaitGeneration(seen, milliseconds(200), &g);
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      Record({{"event", "channel_broken"}, {"error", s.ToString()}});
      return 4;
    }
    seen = g.generation;
    const int rank = g.RankOf(id);
    Record({{"event", "generation"},
            {"generation", g.generation},
            {"rank", rank},
            {"world_size", g.world_size()},
            {"reason", g.reason},
            {"failure", g.failure}});
    if (rank < 0) {
      if (g.generation >= start_gen) {
        if (g.reason == edl::proto::kStopReason && last_rank == 0 &&
            !Env("STANDIN_FINAL_CHECKPOINT_ERROR").empty()) {
          (void)ch.value()->ReportEvent({{"event", "stop_checkpoint"},
                                         {"ok", false},
                                         {"error", Env("STANDIN_FINAL_CHECKPOINT_ERROR")}});
        }
        Record({{"event", "leave"}, {"generation", g.generation}});
        return 0;
      }
      continue;  // a joiner that has not been committed yet
    }
    last_rank = rank;
    edl::net::ProgressReport p;
    p.generation = g.generation;
    p.step = g.generation * 10;
    p.world_size = g.world_size();
    p.images_per_sec = 100;
    // What a job measures of itself, as fixed stand-in figures: the status, /metrics and the
    // dashboard show what the trainers report.
    p.compute_s_per_sample = 0.0025;
    if (g.world_size() > 1) {
      p.sync_s = 0.04;
      p.noise_steps = 10;
      p.grad_sqr = 2;
      p.grad_var = 250;
      p.noise_scale = 125;
    }
    (void)ch.value()->ReportProgress(p);
    // A rendezvous round: rank 0 publishes, everyone reads it back.
    const std::string key =
        edl::proto::GenerationKeyPrefix(g.generation) + "root";  // GC'd as the runtime's
    if (rank == 0) (void)ch.value()->KvSet(key, std::to_string(::getpid()));
    std::string v;
    s = ch.value()->KvWait(key, milliseconds(5000), &v);
    Record({{"event", "kv"}, {"generation", g.generation}, {"ok", s.ok()}, {"value", v}});
  }
  Record({{"event", "term"}});
  return 0;
}
