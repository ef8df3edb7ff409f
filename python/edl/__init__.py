"""EDL's elastic runtime for Python.

`edl.torch` is what a PyTorch program uses (docs/PYTORCH.md, "PyTorch, in place"): its Elastic
keeps the program's own training loop and makes it an in-place trainer of the same C++ runtime as
`edl train`, which owns the data order, the gradient all-reduce, the re-forms and the checkpoints;
its ElasticTrainer hands the runtime the loop as well. This
package holds the binding (`edl._edl`, pybind11 over libedl) and the names both share.
"""

from edl._edl import (DataPlan, OwnLoop, RunOptions, Trainable, TrainingError, label_hash,
                      now_micros, plan, run)

# The runtime's clock when edl was first imported: a joiner's time to ready is measured from it,
# so import edl before torch to count torch's import too.
START_MICROS = now_micros()

__all__ = ["DataPlan", "OwnLoop", "RunOptions", "Trainable", "TrainingError", "label_hash",
           "now_micros", "plan", "run", "START_MICROS"]
