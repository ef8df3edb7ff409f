"""ResNet-20 on Fashion-MNIST for the PyTorch examples (train_ddp.py, train_inplace.py): the IDX
files as Debian's dataset-fashion-mnist ships them, normalised, and the model (He et al. 2016,
CIFAR variant: 3 stages of 3 basic blocks, 16/32/64 channels). Both scripts build the same model
from the same seed, which the parity check between them relies on."""

import gzip
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"


def _fail(message):
    sys.exit("%s: %s" % (os.path.basename(sys.argv[0]), message))


# ---- data

def read_idx(path, limit):
    """The first `limit` items (0: all) of an IDX file (plain or .gz) as a uint8 tensor."""
    for candidate in (path + ".gz", path):
        if os.path.exists(candidate):
            break
    else:
        _fail("%s(.gz) not found: install dataset-fashion-mnist (scripts/install_deps.sh) or "
              "give --data_dir" % path)
    opener = gzip.open if candidate.endswith(".gz") else open
    with opener(candidate, "rb") as f:
        magic = f.read(4)
        if len(magic) != 4 or magic[0] != 0 or magic[1] != 0 or magic[2] != 0x08:
            _fail("%s is not an unsigned-byte IDX file" % candidate)
        ndim = magic[3]
        if ndim < 1 or ndim > 3:
            _fail("%s has %d dimensions; expected 1 to 3" % (candidate, ndim))
        dims = list(struct.unpack(">" + "I" * ndim, f.read(4 * ndim)))
        count = dims[0] if limit == 0 else min(limit, dims[0])
        item = 1
        for d in dims[1:]:
            item *= d
        raw = f.read(count * item)
        if len(raw) != count * item:
            _fail("%s is truncated" % candidate)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape([count] + dims[1:])


def load_split(data_dir, prefix, limit):
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte"), limit)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte"), limit)
    if images.shape[0] != labels.shape[0]:
        _fail("%s images and labels differ in count" % prefix)
    x = (images.float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)).unsqueeze(1)
    return x, labels.long()


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet20(nn.Module):
    def __init__(self, in_channels=1, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


