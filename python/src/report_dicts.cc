#include "python/src/report_dicts.h"

namespace edl::python {

namespace py = pybind11;

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

}  // namespace edl::python
