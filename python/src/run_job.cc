#include "python/src/run_job.h"

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <utility>

#include "edl/runtime/checkpoint_loader.h"

namespace edl::python {
namespace {

namespace py = pybind11;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// The checks the runtime does not do itself (it validates the batch and the LR schedule).
Status Validate(const RunOptions& o) {
  if (!(o.epochs > 0)) return Status::InvalidArgument("epochs must be > 0");
  if (o.max_steps < 0) return Status::InvalidArgument("max_steps must be >= 0");
  if (!(o.comm_timeout_s > 0) || !(o.generation_wait_s > 0)) {
    return Status::InvalidArgument("comm_timeout_s and generation_wait_s must be > 0");
  }
  if (o.checkpoint_steps < 0 || o.checkpoint_secs < 0) {
    return Status::InvalidArgument("checkpoint_steps and checkpoint_secs must be >= 0");
  }
  if (o.keep_checkpoints < 1) return Status::InvalidArgument("keep_checkpoints must be >= 1");
  if (o.eval_batch < 1) return Status::InvalidArgument("eval_batch must be >= 1");
  return Status::OK();
}

Status ToElastic(const RunOptions& o, runtime::ElasticOptions* e) {
  EDL_RETURN_IF_ERROR(runtime::ParseBatchPolicy(o.batch_policy, &e->batch_policy));
  e->batch = o.batch;
  e->seed = o.seed;
  e->epochs = o.epochs;
  e->max_steps = o.max_steps;
  e->lr.base_lr = o.lr;
  e->lr.base_batch = o.base_batch;
  e->lr.decay = o.lr_decay;
  e->lr.warmup_epochs = o.warmup_epochs;
  e->lr.milestones = o.milestones;
  e->lr.rescale_ramp_steps = o.rescale_ramp_steps;
  e->lr.total_epochs = o.epochs;
  e->comm_timeout = Millis(o.comm_timeout_s);
  e->generation_wait = Millis(o.generation_wait_s);
  e->evaluate_each_epoch = o.evaluate_each_epoch;
  e->eval_batch = o.eval_batch;
  e->progress_every = o.progress_every;
  e->sample_log_path = o.sample_log;
  e->start_micros = o.start_micros;
  e->backend = "gloo";  // the registered memory is host memory
  return Status::OK();
}

// The checkpoint loader, saving at once after a step when `saves` asks (job.save()).
class SaveOnRequest : public runtime::StateLoader {
 public:
  SaveOnRequest(std::unique_ptr<runtime::CheckpointLoader> base, SaveRequests* saves)
      : base_(std::move(base)), saves_(saves) {}
  Status Load(runtime::Trainable* t, runtime::TrainingState* state) override {
    return base_->Load(t, state);
  }
  Status AfterStep(runtime::Trainable* t, const runtime::TrainingState& state,
                   const runtime::StepContext& ctx) override {
    if (saves_ != nullptr && saves_->TakeSaveRequest()) return base_->Finish(t, state, ctx);
    return base_->AfterStep(t, state, ctx);
  }
  Status Finish(runtime::Trainable* t, const runtime::TrainingState& state,
                const runtime::StepContext& ctx) override {
    return base_->Finish(t, state, ctx);
  }
  std::vector<nlohmann::json> TakeEvents() override { return base_->TakeEvents(); }

 private:
  const std::unique_ptr<runtime::CheckpointLoader> base_;
  SaveRequests* const saves_;
};

}  // namespace

Status RunJob(runtime::Trainable* t, const RunOptions& o, runtime::TrainingObserver* observer,
              SaveRequests* saves, runtime::ElasticResult* result) {
  EDL_RETURN_IF_ERROR(Validate(o));
  runtime::ElasticOptions e;
  EDL_RETURN_IF_ERROR(ToElastic(o, &e));
  auto plan = runtime::PlanRunFromProcess();
  EDL_RETURN_IF_ERROR(plan.status());
  plan.value().ApplyTo(&e);
  auto membership = runtime::Connect(plan.value());
  EDL_RETURN_IF_ERROR(membership.status());
  std::unique_ptr<runtime::StateLoader> loader;
  if (!o.checkpoint_dir.empty()) {
    ckpt::RocksDbStoreOptions store;
    store.dir = o.checkpoint_dir;
    store.keep_checkpoints = o.keep_checkpoints;
    runtime::CheckpointLoaderOptions co;
    co.save.checkpoint_steps = o.checkpoint_steps;
    co.save.checkpoint_secs = o.checkpoint_secs;
    // The data cursor means the same samples only for the same seed and data set size.
    co.config_fingerprint =
        "seed=" + std::to_string(o.seed) + ";train=" + std::to_string(t->train_size());
    loader = std::make_unique<SaveOnRequest>(runtime::NewRocksDbCheckpointLoader(store, co), saves);
    e.loader = loader.get();
  }
  e.observer = observer;
  runtime::ElasticTrainer trainer(e, t, membership.value().get());
  return trainer.Run(result);
}

StatusOr<runtime::RunPlan> PlanAndSyncEnviron() {
  auto plan = runtime::PlanRunFromProcess();
  if (!plan.ok()) return plan;
  py::object environ = py::module_::import("os").attr("environ");
  for (const char* name : runtime::env::kAll) {
    const char* value = std::getenv(name);
    if (value != nullptr) {
      environ[py::str(name)] = py::str(value);
    } else if (environ.contains(py::str(name))) {
      environ.attr("pop")(py::str(name));
    }
  }
  return plan;
}

}  // namespace edl::python
