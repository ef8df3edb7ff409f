#!/usr/bin/env python3
"""How far correct bf16 gradients are from fp32 ones: PyTorch's bf16 autocast (CPU) against its
fp32, on a ResNet-20 (3x32x32, batch 8, fresh initialisation: the shapes of
cuda_parity_test.cc's ResNet20TrainingStep). Prints, per seed, the metrics that test uses: the
per-tensor max relative difference (max |a-b| / max |a|) and, over the whole gradient vector, the
cosine similarity and relative L2 error. The bounds for bf16/fp16 in cuda_parity_test.cc come from
this run.

    /usr/bin/python3 tests/resnet50/bf16_reference.py [SEEDS...]   (default 11 12 13 14 15)
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet20(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in [(16, 1), (32, 2), (64, 2)]:
            for k in range(3):
                blocks.append(Block(cin, cout, stride if k == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def gradients(model, x, y, bf16):
    model.zero_grad()
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
    else:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def main():
    seeds = [int(s) for s in sys.argv[1:]] or [11, 12, 13, 14, 15]
    for seed in seeds:
        torch.manual_seed(seed)
        model = ResNet20()
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        l32, g32 = gradients(model, x, y, False)
        l16, g16 = gradients(model, x, y, True)
        per = sorted(((g32[n] - g16[n]).abs().max() / g32[n].abs().max().clamp_min(1e-6)).item() for n in g32)
        a = torch.cat([g32[n].flatten() for n in g32])
        b = torch.cat([g16[n].flatten() for n in g32])
        print("seed %d: loss rel diff %.1e; per-tensor max rel diff median %.3f max %.3f; "
              "whole-model cosine %.4f, relative L2 %.3f" % (
                  seed, abs(l16 - l32) / l32, per[len(per) // 2], per[-1],
                  F.cosine_similarity(a, b, dim=0).item(), ((a - b).norm() / a.norm()).item()))


if __name__ == "__main__":
    main()
