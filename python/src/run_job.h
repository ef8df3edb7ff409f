// RunJob: one ElasticTrainer::Run over the membership the process's environment selects, with the
// options a Python program sets (RunOptions) mapped onto the runtime's own, and, with a checkpoint
// directory, the RocksDB checkpoint store. Shared by edl.run (ElasticTrainer's loop over
// PyTrainable hooks) and edl.OwnLoop (the user's loop; python/src/own_loop.h).
//
// Thread-safety: RunJob touches no Python object and runs on any thread, the GIL released;
// PlanAndSyncEnviron needs the GIL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/run_mode.h"

namespace edl::python {

// What a Python program sets (edl.RunOptions); RunJob maps it onto the runtime's option structs.
struct RunOptions {
  int64_t batch = 32;
  std::string batch_policy = "fixed-local";
  uint64_t seed = 1;
  double epochs = 1;
  int64_t max_steps = 0;
  double lr = 0.1;
  int64_t base_batch = 0;  // 0: no linear scaling
  std::string lr_decay = "constant";
  double warmup_epochs = 0;
  std::vector<double> milestones;
  int64_t rescale_ramp_steps = 0;
  double comm_timeout_s = 30;
  double generation_wait_s = 120;
  bool evaluate_each_epoch = false;
  int64_t eval_batch = 256;
  int progress_every = 10;
  std::string sample_log;
  std::string checkpoint_dir;
  int64_t checkpoint_steps = 0;
  double checkpoint_secs = 0;
  int keep_checkpoints = 3;
  int64_t start_micros = 0;
};

// Asked on rank 0 after each committed step: true saves a checkpoint at once (edl.torch's
// job.save()), whatever checkpoint_steps / checkpoint_secs say. Runtime thread.
class SaveRequests {
 public:
  virtual ~SaveRequests() = default;
  virtual bool TakeSaveRequest() = 0;
};

// The run: Validate, plan, connect, checkpoint store (when o.checkpoint_dir is set), Run.
// `observer` and `saves` may be null.
Status RunJob(runtime::Trainable* t, const RunOptions& o, runtime::TrainingObserver* observer,
              SaveRequests* saves, runtime::ElasticResult* result);

// The plan, after a warm spare's wait (docs/TRAINERS.md "Warm spares"): the spare takes its
// assigned identity into the C environment, and Python's os.environ, a copy taken at start, is
// brought up to date with it, so a script reading os.environ["RANK"] after plan() sees the trainer
// it became. GIL held.
StatusOr<runtime::RunPlan> PlanAndSyncEnviron();

}  // namespace edl::python
