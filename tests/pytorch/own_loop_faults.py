#!/usr/bin/python3
"""examples/pytorch/resnet20_elastic.py (the own-loop API) with the faults
pytorch_own_loop_job_test injects, each armed by a marker file the test writes into FAULT_DIR
holding the id of the trainer that is to fail, and taken by it (an atomic rename):

  nan_loss      its next loss is NaN
  hook_raises   its next job.step() runs a before_update hook that raises ValueError
  short_batch   its DataLoader's next batch lacks a sample (the collate_fn drops one)

A trainer that takes a marker writes FAULT_DIR/<marker>.taken.<its EDL_TRAINER_ID>.

usage: own_loop_faults.py FAULT_DIR [resnet20_elastic.py flags]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))

import edl.torch  # noqa: E402  (first, as in resnet20_elastic.py)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.data._utils.collate as collate  # noqa: E402

import resnet20_elastic  # noqa: E402

FAULTS = sys.argv[1]


def take(marker):
    """True for the trainer the marker names, once (read when needed: a warm spare learns its id
    only when it becomes a trainer; DataLoader workers inherit it)."""
    my_id = os.environ.get("EDL_TRAINER_ID", "")
    path = os.path.join(FAULTS, marker)
    try:
        with open(path) as f:
            if f.read().strip() != my_id:
                return False
        os.rename(path, "%s.taken.%s" % (path, my_id))
    except FileNotFoundError:
        return False
    return True


REAL_CROSS_ENTROPY = F.cross_entropy


def cross_entropy(*args, **kwargs):
    loss = REAL_CROSS_ENTROPY(*args, **kwargs)
    return loss * float("nan") if take("nan_loss") else loss


REAL_STEP = edl.torch.Elastic.step


def step(self, *optimizers, **kwargs):
    if take("hook_raises"):
        def hook():
            raise ValueError("injected fault in a before_update hook")
        kwargs["before_update"] = hook
    return REAL_STEP(self, *optimizers, **kwargs)


REAL_COLLATE = collate.default_collate


def default_collate(samples):
    return REAL_COLLATE(samples[:-1] if take("short_batch") else samples)


F.cross_entropy = cross_entropy
edl.torch.Elastic.step = step
collate.default_collate = default_collate
sys.exit(resnet20_elastic.main(sys.argv[2:]))
