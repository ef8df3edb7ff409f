#!/usr/bin/python3
"""PyTorch (Debian python3-torch 1.13) reference for bench/trainer_cpu.sh: the same models, data,
batch, thread count and recipe as `edl train`, printing one `images/s X` or `test_acc X` line.

ResNet-20 here matches resnet50/model.cc: CIFAR-style, 3 stages of 16/32/64, projection (1x1 conv
+ BN) shortcuts, He init (fan_out), BN gamma 1 / beta 0. Recipe: SGD momentum 0.9, weight decay
5e-4 on conv/fc weights only, lr 0.1 at batch 128 with cosine decay over the epochs (per step),
no augmentation, Fashion-MNIST normalised with mean 0.2860 / std 0.3530.
"""
import argparse
import gzip
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, k, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = conv_bn(cin, cout, 3, stride)
        self.c2 = conv_bn(cout, cout, 3, 1)
        self.down = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        h = self.c2(F.relu(self.c1(x)))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class CifarResNet(nn.Module):
    def __init__(self, n, in_ch, classes=10):
        super().__init__()
        self.stem = conv_bn(in_ch, 16, 3, 1)
        layers, cin = [], 16
        for s, w in enumerate([16, 32, 64]):
            for i in range(n):
                layers.append(Basic(cin, w, 2 if (i == 0 and s > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.layers(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model(name, in_ch):
    if name == "resnet20":
        return CifarResNet(3, in_ch)
    if name == "resnet56":
        return CifarResNet(9, in_ch)
    import torchvision
    return getattr(torchvision.models, name)(num_classes=10)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[:4], "big")
    if magic == 0x803:
        n, r, c = (int.from_bytes(data[i:i + 4], "big") for i in (4, 8, 12))
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, r, c)
    return np.frombuffer(data, np.uint8, offset=8)


def fashion(data_dir, split):
    pre = "train" if split == "train" else "t10k"
    x = read_idx(f"{data_dir}/{pre}-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{data_dir}/{pre}-labels-idx1-ubyte.gz").astype(np.int64)
    return torch.from_numpy((x - 0.2860) / 0.3530), torch.from_numpy(y)


def optimizer(model, lr, decay_all=False):
    """SGD momentum 0.9, weight decay 5e-4 on conv/fc weights (or on every parameter)."""
    decay = [p for n, p in model.named_parameters() if decay_all or p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if not decay_all and p.dim() <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": 5e-4},
                            {"params": no_decay, "weight_decay": 0.0}], lr=lr, momentum=0.9)


def best_cpu_settings(model, x):
    """PyTorch's fastest CPU training set-up that 1.13 offers for this model: channels_last tensors
    (oneDNN's blocked/NHWC kernels) and a TorchScript-compiled model (NNC fuses the elementwise tail
    of BN/ReLU/add). Returns the model, the input and a label naming what was applied."""
    model = model.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
    try:
        model = torch.jit.script(model)
        return model, x, "channels_last+torchscript"
    except Exception:  # noqa: BLE001  (a model TorchScript cannot compile runs eagerly)
        return model, x, "channels_last"


def throughput(args):
    if args.data == "fashion-mnist":
        x, y = fashion(args.data_dir, "train")
        x, y = x[: args.batch * (args.steps + args.warmup)], y[: args.batch * (args.steps + args.warmup)]
    else:
        n = args.batch * (args.steps + args.warmup)
        side = args.image_size or 224
        x = torch.randn(n, 3, side, side)
        y = torch.randint(0, 10, (n,))
    model = make_model(args.model, x.shape[1])
    opt = optimizer(model, 0.01)
    label = "eager"
    if args.best:
        model, x, label = best_cpu_settings(model, x)
    model.train()
    t0 = None
    for i in range(args.steps + args.warmup):
        if i == args.warmup:
            t0 = time.time()
        xb, yb = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    # The window is steps [warmup, warmup + steps), as edl's progress line at step warmup + steps
    # with --log_every steps covers the same steps (bench/trainer_cpu.sh passes matching counts).
    print(f"images/s {args.steps * args.batch / (time.time() - t0):.1f} {label}")


def pad_to(x, size):
    """Centres normalised 28x28 images in a size x size frame of black pixels (raw value 0, so
    (0 - mean) / std once normalised), as edl train --image_size does. Padding with 0 after
    normalisation would frame each image in mean grey instead: a different input distribution."""
    if size <= x.shape[-1]:
        return x
    p = size - x.shape[-1]
    return F.pad(x, (p // 2, p - p // 2, p // 2, p - p // 2), value=(0.0 - 0.2860) / 0.3530)


def evaluate(model, xte, yte):
    model.eval()
    correct = 0
    with torch.no_grad():
        for b in range(0, len(xte), 500):
            correct += (model(xte[b:b + 500]).argmax(1) == yte[b:b + 500]).sum().item()
    model.train()
    return 100.0 * correct / len(xte)


def accuracy(args):
    """Recipes: cosine (lr 0.1 cosine per step, wd on conv/fc weights) or constant (lr 0.1, no
    decay, wd on every parameter). Prints the test accuracy after every epoch, then the last."""
    torch.manual_seed(args.seed)
    xtr, ytr = fashion(args.data_dir, "train")
    xte, yte = fashion(args.data_dir, "test")
    xtr, xte = pad_to(xtr, args.image_size or 28), pad_to(xte, args.image_size or 28)
    model = make_model(args.model, 1)
    opt = optimizer(model, 0.1, decay_all=args.recipe == "constant")
    steps_per_epoch = math.ceil(len(xtr) / args.batch)
    total = steps_per_epoch * args.epochs
    step = 0
    g = torch.Generator().manual_seed(args.seed)
    acc = float("nan")
    model.train()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xtr), generator=g)
        for b in range(steps_per_epoch):
            lr = 0.1 * 0.5 * (1 + math.cos(math.pi * step / total)) if args.recipe == "cosine" else 0.1
            for group in opt.param_groups:
                group["lr"] = lr
            idx = perm[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
            step += 1
        acc = evaluate(model, xte, yte)
        print(f"epoch {epoch + 1} test_acc {acc:.2f}", flush=True)
    print(f"test_acc {acc:.2f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["throughput", "accuracy"])
    p.add_argument("--model", default="resnet20")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--image_size", type=int, default=None,
                   help="synthetic: side (default 224); fashion-mnist: pad to this side (default 28)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--recipe", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--best", action="store_true",
                   help="throughput with PyTorch's best CPU settings (channels_last, TorchScript)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    throughput(args) if args.mode == "throughput" else accuracy(args)


if __name__ == "__main__":
    main()
