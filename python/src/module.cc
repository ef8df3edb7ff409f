// edl._edl: the elastic runtime for Python (docs/PYTORCH.md, "PyTorch, in place"). The package edl
// (python/edl/) wraps it; edl.torch is what a PyTorch program uses. Exposes:
//   Trainable     python/src/py_trainable.h, subclassed by edl.torch's ElasticTrainer
//   OwnLoop       python/src/own_loop.h, the runtime side of edl.torch.Elastic (the user's loop)
//   RunOptions    the runtime's options (ElasticOptions, its LR schedule, the checkpoint store)
//   DataPlan      edl/runtime/data_plan.h: the samples of each rank and step, for the own loop's
//                 batch sampler to look ahead
//   plan()        the run mode the environment selects (edl/runtime/run_mode.h), before any work
//   run()         ElasticTrainer::Run over the membership of that mode, with the GIL released
//   label_hash()  runtime::LabelHash, for the sample log's fed-label check
//   now_micros()  the runtime's clock (time to ready of a joiner is measured from a reading)
//   TrainingError what run() raises when training fails (the Python exception as its cause)
#include <glog/logging.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edl/base/clock.h"
#include "edl/runtime/data_plan.h"
#include "edl/runtime/elastic_trainer.h"
#include "python/src/own_loop.h"
#include "python/src/py_trainable.h"
#include "python/src/report_dicts.h"
#include "python/src/run_job.h"

namespace edl::python {
namespace {

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

// edl._edl.TrainingError (a RuntimeError); created by the module's init, which the module keeps.
struct TrainingErrorTag {};
PyObject* g_training_error = nullptr;

py::dict Run(PyTrainable* t, const RunOptions& o, py::object on_step, py::object on_eval) {
  runtime::ElasticResult r;
  Status s;
  {
    const RunOptions options = o;  // Python threads may touch `o` once the GIL is released
    // A spare that did not call plan() waits here, with the GIL (it has nothing else to do), so
    // os.environ follows; an error is RunJob's to report.
    (void)PlanAndSyncEnviron();
    PyObserver observer(t, std::move(on_step), std::move(on_eval));
    py::gil_scoped_release release;
    s = RunJob(t, options, &observer, /*saves=*/nullptr, &r);
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
  py::class_<HostTrainable>(m, "_HostTrainable")
      .def("set_state", &HostTrainable::SetState, py::arg("tensors"))
      .def("set_gradients", &HostTrainable::SetGradients, py::arg("owner"), py::arg("data_ptr"),
           py::arg("count"))
      .def("set_sizes", &HostTrainable::SetSizes, py::arg("train_size"), py::arg("test_size"))
      .def("set_fingerprint", &HostTrainable::SetFingerprint, py::arg("fingerprint"))
      .def_property_readonly("fingerprint", &HostTrainable::Fingerprint)
      .def_property_readonly_static("inband_slots",
                                    [](py::object) { return runtime::Trainable::kInbandSlots; });
  py::class_<PyTrainable, HostTrainable>(m, "Trainable").def(py::init<>());
  py::class_<OwnLoop, HostTrainable>(m, "OwnLoop")
      .def(py::init<>())
      .def("start", &OwnLoop::Start, py::arg("options"))
      .def("wait", &OwnLoop::Wait)
      .def("answer", &OwnLoop::Answer, py::arg("seq"), py::arg("loss_sum") = 0.0,
           py::arg("correct") = 0, py::arg("samples") = 0, py::arg("label_hash") = 0,
           py::arg("save") = false)
      .def("abort", &OwnLoop::Abort, py::arg("why"))
      .def("join", &OwnLoop::Join, py::arg("timeout_s"))
      .def_property_readonly("state_writes", &OwnLoop::state_writes)
      .def("last_step", &OwnLoop::last_step)
      .def("last_eval", &OwnLoop::last_eval);

  py::class_<runtime::DataPlan>(m, "DataPlan")
      .def(py::init([](int64_t n, uint64_t seed) {
             if (n <= 0) throw py::value_error("DataPlan: the data set is empty");
             return std::make_unique<runtime::DataPlan>(n, seed);
           }),
           py::arg("num_samples"), py::arg("seed"))
      .def(
          "slice",
          [](runtime::DataPlan& p, int64_t epoch, int64_t cursor,
             const std::vector<int64_t>& batches, int rank) {
            const std::vector<int64_t> s = p.Slice({epoch, cursor}, batches, rank);
            return py::array_t<int64_t>(static_cast<py::ssize_t>(s.size()), s.data());
          },
          py::arg("epoch"), py::arg("cursor"), py::arg("batches"), py::arg("rank"))
      .def(
          "step",
          [](runtime::DataPlan& p, int64_t epoch, int64_t cursor,
             const std::vector<int64_t>& batches) {
            py::list out;
            for (const std::vector<int64_t>& s : p.Step({epoch, cursor}, batches)) {
              out.append(py::array_t<int64_t>(static_cast<py::ssize_t>(s.size()), s.data()));
            }
            return out;
          },
          py::arg("epoch"), py::arg("cursor"), py::arg("batches"))
      .def(
          "advance",
          [](const runtime::DataPlan& p, int64_t epoch, int64_t cursor,
             const std::vector<int64_t>& batches) {
            const runtime::DataPosition next = p.Advance({epoch, cursor}, batches);
            return std::make_pair(next.epoch, next.cursor);
          },
          py::arg("epoch"), py::arg("cursor"), py::arg("batches"))
      .def(
          "epoch_progress",
          [](const runtime::DataPlan& p, int64_t epoch, int64_t cursor) {
            return p.EpochProgress({epoch, cursor});
          },
          py::arg("epoch"), py::arg("cursor"));

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
