// edl._edl: the elastic runtime for Python (docs/PYTORCH.md, "PyTorch, in place"). The package edl
// (python/edl/) wraps it; edl.torch is what a PyTorch program uses. Exposes:
//   Trainable     python/src/py_trainable.h, subclassed by edl.torch
//   RunOptions    the runtime's options (ElasticOptions, its LR schedule, the checkpoint store)
//   plan()        the run mode the environment selects (edl/runtime/run_mode.h), before any work
//   run()         ElasticTrainer::Run over the membership of that mode, with the GIL released
//   label_hash()  runtime::LabelHash, for the sample log's fed-label check
//   now_micros()  the runtime's clock (time to ready of a joiner is measured from a reading)
//   TrainingError what run() raises when training fails (the Python exception as its cause)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "edl/base/clock.h"
#include "edl/runtime/checkpoint_loader.h"
#include "edl/runtime/elastic_trainer.h"
#include "edl/runtime/run_mode.h"
#include "python/src/py_trainable.h"

namespace edl::python {
namespace {

// What a Python program sets; Finish() maps it onto the runtime's own option structs.
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
  e->backend = "gloo";  // PyTrainable's memory is host memory
  return Status::OK();
}

py::dict StepDict(const runtime::StepReport& r) {
  py::dict d;
  d["step"] = r.step;
  d["epoch"] = r.position.epoch;
  d["cursor"] = r.position.cursor;
  d["epochs_done"] = r.epochs_done;
  d["loss"] = r.loss;
  d["correct"] = r.correct;
  d["samples"] = r.samples;
  d["lr"] = r.lr;
  d["generation"] = r.generation;
  d["world_size"] = r.world_size;
  d["rank"] = r.rank;
  return d;
}

py::dict EvalDict(const runtime::EvalReport& r) {
  py::dict d;
  d["step"] = r.step;
  d["epoch"] = r.epoch;
  d["loss"] = r.loss;
  d["accuracy"] = r.accuracy;
  d["samples"] = r.samples;
  d["generation"] = r.generation;
  d["world_size"] = r.world_size;
  d["rank"] = r.rank;
  d["seconds"] = r.seconds;
  return d;
}

// Progress callbacks into Python, on the training thread with the GIL taken for the call. An
// exception fails the trainable (its next hook returns the error, which ends the run).
class PyObserver : public runtime::TrainingObserver {
 public:
  PyObserver(PyTrainable* t, py::object on_step, py::object on_eval)
      : t_(t), on_step_(std::move(on_step)), on_eval_(std::move(on_eval)) {}
  void OnStep(const runtime::StepReport& r) override {
    Call(on_step_, "on_step", [&] { return StepDict(r); });
  }
  void OnEval(const runtime::EvalReport& r) override {
    Call(on_eval_, "on_eval", [&] { return EvalDict(r); });
  }

 private:
  template <typename MakeDict>
  void Call(const py::object& f, const char* name, MakeDict make) {
    py::gil_scoped_acquire gil;
    if (f.is_none()) return;
    try {
      f(make());
    } catch (py::error_already_set& e) {
      t_->Fail(e, name);
    }
  }
  PyTrainable* const t_;
  const py::object on_step_, on_eval_;
};

// The plan, after a warm spare's wait (docs/TRAINERS.md "Warm spares"): the spare takes its
// assigned identity into the C environment, and Python's os.environ, a copy taken at start, is
// brought up to date with it, so a script reading os.environ["RANK"] after plan() sees the trainer
// it became.
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

py::dict Plan() {
  auto plan = PlanAndSyncEnviron();
  if (!plan.ok()) throw py::value_error(plan.status().message());
  const runtime::RunPlan& p = plan.value();
  py::dict d;
  d["mode"] = runtime::RunModeName(p.mode);
  d["joining"] = p.joining();
  d["trainer_id"] = p.env.trainer_id;
  d["trainers_on_node"] = p.env.TrainersOnNode();
  d["rank"] = p.env.rank;  // of the generation it was started in (static: for good)
  d["world_size"] = p.env.has_world ? p.env.world_size : 1;
  return d;
}

// The run, with the GIL released: no Python object is touched here.
Status RunReleased(PyTrainable* t, const RunOptions& o, runtime::TrainingObserver* observer,
                   runtime::ElasticResult* result) {
  EDL_RETURN_IF_ERROR(Validate(o));
  runtime::ElasticOptions e;
  EDL_RETURN_IF_ERROR(ToElastic(o, &e));
  auto plan = runtime::PlanRunFromProcess();
  EDL_RETURN_IF_ERROR(plan.status());
  plan.value().ApplyTo(&e);
  auto membership = runtime::Connect(plan.value());
  EDL_RETURN_IF_ERROR(membership.status());
  std::unique_ptr<runtime::CheckpointLoader> loader;
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
    loader = runtime::NewRocksDbCheckpointLoader(store, co);
    e.loader = loader.get();
  }
  e.observer = observer;
  runtime::ElasticTrainer trainer(e, t, membership.value().get());
  return trainer.Run(result);
}

// edl._edl.TrainingError (a RuntimeError); created by the module's init, which the module keeps.
struct TrainingErrorTag {};
PyObject* g_training_error = nullptr;

py::dict Run(PyTrainable* t, const RunOptions& o, py::object on_step, py::object on_eval) {
  runtime::ElasticResult r;
  Status s;
  {
    const RunOptions options = o;  // Python threads may touch `o` once the GIL is released
    // A spare that did not call plan() waits here, with the GIL (it has nothing else to do), so
    // os.environ follows; an error is RunReleased's to report.
    (void)PlanAndSyncEnviron();
    PyObserver observer(t, std::move(on_step), std::move(on_eval));
    py::gil_scoped_release release;
    s = RunReleased(t, options, &observer, &r);
  }
  if (!s.ok()) t->Raise(py::handle(g_training_error), s.ToString());
  py::dict d;
  d["left"] = r.left;
  d["step"] = r.step;
  d["generation"] = r.generation;
  d["last_loss"] = r.last_loss;
  d["accuracy"] = r.accuracy;
  d["state_hash"] = std::to_string(r.state_hash);
  return d;
}

uint64_t LabelHashOf(
    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& labels) {
  return runtime::LabelHash(labels.data(), static_cast<size_t>(labels.size()));
}

}  // namespace

PYBIND11_MODULE(_edl, m) {
  m.doc() = "The EDL elastic runtime (libedl) for Python; use edl.torch.";
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("edl");
  }
  py::class_<PyTrainable>(m, "Trainable")
      .def(py::init<>())
      .def("set_state", &PyTrainable::SetState, py::arg("tensors"))
      .def("set_gradients", &PyTrainable::SetGradients, py::arg("owner"), py::arg("data_ptr"),
           py::arg("count"))
      .def("set_sizes", &PyTrainable::SetSizes, py::arg("train_size"), py::arg("test_size"))
      .def("set_fingerprint", &PyTrainable::SetFingerprint, py::arg("fingerprint"))
      .def_property_readonly("fingerprint", &PyTrainable::Fingerprint)
      .def_property_readonly_static("inband_slots",
                                    [](py::object) { return runtime::Trainable::kInbandSlots; });

  py::class_<RunOptions>(m, "RunOptions")
      .def(py::init<>())
      .def_readwrite("batch", &RunOptions::batch)
      .def_readwrite("batch_policy", &RunOptions::batch_policy)
      .def_readwrite("seed", &RunOptions::seed)
      .def_readwrite("epochs", &RunOptions::epochs)
      .def_readwrite("max_steps", &RunOptions::max_steps)
      .def_readwrite("lr", &RunOptions::lr)
      .def_readwrite("base_batch", &RunOptions::base_batch)
      .def_readwrite("lr_decay", &RunOptions::lr_decay)
      .def_readwrite("warmup_epochs", &RunOptions::warmup_epochs)
      .def_readwrite("milestones", &RunOptions::milestones)
      .def_readwrite("rescale_ramp_steps", &RunOptions::rescale_ramp_steps)
      .def_readwrite("comm_timeout_s", &RunOptions::comm_timeout_s)
      .def_readwrite("generation_wait_s", &RunOptions::generation_wait_s)
      .def_readwrite("evaluate_each_epoch", &RunOptions::evaluate_each_epoch)
      .def_readwrite("eval_batch", &RunOptions::eval_batch)
      .def_readwrite("progress_every", &RunOptions::progress_every)
      .def_readwrite("sample_log", &RunOptions::sample_log)
      .def_readwrite("checkpoint_dir", &RunOptions::checkpoint_dir)
      .def_readwrite("checkpoint_steps", &RunOptions::checkpoint_steps)
      .def_readwrite("checkpoint_secs", &RunOptions::checkpoint_secs)
      .def_readwrite("keep_checkpoints", &RunOptions::keep_checkpoints)
      .def_readwrite("start_micros", &RunOptions::start_micros);

  m.def("plan", &Plan, "The run mode this process's environment selects (a dict).");
  static py::exception<TrainingErrorTag> training_error(m, "TrainingError", PyExc_RuntimeError);
  training_error.attr("__module__") = "edl";  // as the package exports it: edl.TrainingError
  g_training_error = training_error.ptr();
  m.def("run", &Run, py::arg("trainable"), py::arg("options"), py::arg("on_step"),
        py::arg("on_eval"),
        "Trains `trainable` in place until done or left; raises TrainingError on failure, with the "
        "Python exception a hook raised as its cause.");
  m.def("label_hash", &LabelHashOf, py::arg("labels"));
  m.def("now_micros", [] { return Clock::Real()->NowMicros(); });
}

}  // namespace edl::python
