// Run-mode selection: the runtime, not the model app, decides from the env contract
// (edl/runtime/env_contract.h) how this trainer process takes part in the job and where its
// generations come from (docs/ARCHITECTURE.md, "Run modes"):
//
//   EDL_CLIENT_SOCKET, EDL_RESTART_MODE=1  restart: under an edl client in restart mode. The world
//                                          is the generation the trainer was started in; it never
//                                          re-forms (the client restarts every trainer on a
//                                          change), resumes from the checkpoint store, and uses
//                                          the client for rendezvous, progress and events.
//   EDL_CLIENT_SOCKET                      elastic: in place under an edl client (a hot joiner
//                                          when EDL_JOINING=1, for generation EDL_GENERATION).
//   RANK / WORLD_SIZE                      static: a fixed world (`edl launch`), rendezvous in a
//                                          FileKvStore in EDL_RENDEZVOUS_DIR (default
//                                          /tmp/edl-rdzv-<MASTER_ADDR>-<MASTER_PORT>), every key
//                                          under this run's id (NewRunScopedKvStore).
//   none of them                           standalone: world size 1, in-memory rendezvous.
//
// A model app calls PlanRunFromProcess() early (before loading data: a bad environment fails
// fast), ApplyTo() on its ElasticOptions, and Connect() once it is ready to train.
//
// Warm spares (EDL_SPARE, docs/TRAINERS.md "Warm spares"): a client keeps trainer processes that
// prepared what does not depend on their identity and wait for one. PlanRunFromProcess() waits for
// the assignment by itself, so every app's spare saves at least its process start; an app that can
// prepare more (data, model, warm-up: `edl train`) reads the plan with ReadRunPlanFromProcess(),
// prepares, then calls AwaitAssignment().
//
// Thread-safety: pure functions, except AwaitAssignment and PlanRunFromProcess, which write the
// process environment (call them before starting threads that read it); Connect() returns a
// MembershipSource (thread-safe).
#pragma once

#include <chrono>
#include <memory>

#include "edl/base/status.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/env_contract.h"
#include "edl/runtime/membership.h"

namespace edl::runtime {

enum class RunMode { kStandalone, kStatic, kElastic, kRestart };

// "standalone", "static", "elastic", "restart".
const char* RunModeName(RunMode mode);

struct RunPlan {
  RunMode mode = RunMode::kStandalone;
  EnvContract env;

  // A hot joiner: elastic mode with EDL_JOINING=1.
  bool joining() const { return mode == RunMode::kElastic && env.joining; }
  // A warm spare (EDL_SPARE): nothing but preparation until AwaitAssignment().
  bool spare() const { return mode == RunMode::kElastic && env.spare != SpareKind::kNone; }
  // Sets the ElasticOptions the environment decides: joining, join_generation and join_world.
  void ApplyTo(ElasticOptions* options) const;
};

// The mode `env` selects (see the file comment). Pure.
RunPlan PlanRun(const EnvContract& env);

// TrainerEnvFromProcess() + PlanRun(): InvalidArgument naming a malformed variable. A spare's
// plan is returned as it is (spare() true).
StatusOr<RunPlan> ReadRunPlanFromProcess();

// A spare's wait (`spare` has spare() true): connects to its client and blocks until the client
// assigns it a trainer's identity, checks that identity (the same job and client, not a spare,
// not restart mode: InvalidArgument naming the variable), writes it into this process's
// environment (every env contract variable: set as assigned, or unset) and returns its plan.
// Aborted when the client released the spare or exited (the spare should then exit 0).
StatusOr<RunPlan> AwaitAssignment(const RunPlan& spare, std::chrono::milliseconds connect_timeout =
                                                            std::chrono::milliseconds(10000));

// A spare's process name (/proc/PID/comm, what `ps -o comm` shows) from the moment its plan is
// read until its assignment, so neither a person nor a script takes it for a trainer.
inline constexpr char kSpareProcessName[] = "edl-spare";
// Names the process (the calling thread: call it from the main thread) kSpareProcessName, or back
// to its executable's name. ReadRunPlanFromProcess and AwaitAssignment call it.
void NameProcessAsSpare(bool spare);

// ReadRunPlanFromProcess(), then AwaitAssignment() for a spare.
StatusOr<RunPlan> PlanRunFromProcess();

// The MembershipSource of `plan`: connects to the edl client within `timeout` (elastic, restart;
// Unavailable/Timeout when it does not answer), or builds the static / standalone one.
StatusOr<std::unique_ptr<MembershipSource>> Connect(
    const RunPlan& plan, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

// Static mode's rendezvous store: every key of `base` (owned; the FileKvStore a static run shares
// with earlier runs on the same MASTER_ADDR/MASTER_PORT) goes under "run/<id>/", where <id> is a
// random id rank 0 makes at construction. The other ranks learn it by a handshake no stale key can
// satisfy: rank r writes "run/hello/<r>" = a fresh random nonce; rank 0 keeps answering
// "run/welcome/<r>/<nonce>" = <id> for whatever nonce it reads there, until rank r confirms with
// "run/joined/<id>/<r>" (a helper thread of rank 0, stopped when every rank confirmed or at
// destruction). Rank r runs the handshake on its first Set/Get/Wait, bounded by `join_bound`
// (Timeout naming the directory's run and the fix); a key of an earlier run is never read, since
// no earlier run wrote under <id> or answered rank r's nonce.
std::unique_ptr<KvStore> NewRunScopedKvStore(std::unique_ptr<KvStore> base, int rank, int world,
                                             std::chrono::milliseconds join_bound);

// Restart mode's membership over `base` (owned): only generation `generation` is ever reported.
// WaitGeneration for it returns it (Aborted when the client already committed a newer one: this
// trainer is about to be restarted); waiting past it times out, as in static mode.
std::unique_ptr<MembershipSource> NewPinnedMembership(std::unique_ptr<MembershipSource> base,
                                                      int64_t generation);

}  // namespace edl::runtime
