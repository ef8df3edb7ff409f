// The Python form of the runtime's step and evaluation reports: one dict layout for the
// ElasticTrainer callbacks (on_step / on_eval) and the own loop's last_step() / last_eval()
// (docs/PYTORCH.md). Thread-safety: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include "edl/runtime/elastic_trainer.h"

namespace edl::python {

pybind11::dict StepDict(const runtime::StepReport& r);
pybind11::dict EvalDict(const runtime::EvalReport& r);

}  // namespace edl::python
