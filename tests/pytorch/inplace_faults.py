#!/usr/bin/python3
"""examples/pytorch/train_inplace.py with the faults pytorch_inplace_test injects, each armed by a
marker file the test writes into FAULT_DIR and taken by exactly one trainer (an atomic rename):

  raise_in_forward   holds a trainer id: that trainer's forward raises ValueError once the model
                     has run (BatchNorm statistics already updated: a half-finished step)
  other_model        the next trainer to build its model builds ResNet-20 with 11 classes
  adam               the next trainer to build its optimizer builds Adam instead of SGD

A trainer that takes a marker writes FAULT_DIR/<marker>.taken.<its EDL_TRAINER_ID>.

usage: inplace_faults.py FAULT_DIR [train_inplace.py flags]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))

import edl.torch  # noqa: E402,F401  (first, as in train_inplace.py)
import torch  # noqa: E402

import resnet20_fashion  # noqa: E402
import train_inplace  # noqa: E402

FAULTS = sys.argv[1]


def me():
    """This trainer's id, read when needed: a warm spare learns it only at edl.plan()."""
    return os.environ.get("EDL_TRAINER_ID", "")


def take(marker):
    """True for the one trainer that takes `marker` (if it names a trainer, only that one)."""
    my_id = me()
    path = os.path.join(FAULTS, marker)
    try:
        with open(path) as f:
            target = f.read().strip()
    except FileNotFoundError:
        return False
    if target and target != my_id:
        return False
    try:
        os.rename(path, "%s.taken.%s" % (path, my_id))
    except FileNotFoundError:
        return False  # another trainer took it first
    return True


class FaultyResNet20(resnet20_fashion.ResNet20):
    def forward(self, x):
        out = super().forward(x)
        if self.training and take("raise_in_forward"):
            raise ValueError("injected fault in forward (trainer %s)" % me())
        return out


def make_model():
    return FaultyResNet20(classes=11) if take("other_model") else FaultyResNet20()


REAL_SGD = torch.optim.SGD


def make_optimizer(params, lr, **kwargs):
    if take("adam"):
        return torch.optim.Adam(params, lr=lr / 100)
    return REAL_SGD(params, lr=lr, **kwargs)


train_inplace.ResNet20 = make_model
torch.optim.SGD = make_optimizer
sys.exit(train_inplace.main(sys.argv[2:]))
