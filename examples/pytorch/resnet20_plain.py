#!/usr/bin/python3
"""ResNet-20 on Fashion-MNIST, the plain PyTorch way: one process, a DataLoader, SGD and a
per-epoch cosine schedule. resnet20_elastic.py is this script made elastic with edl.torch.Elastic:
`diff resnet20_plain.py resnet20_elastic.py` shows everything a script changes (at most 10 lines
of code; tests/pytorch/pytorch_own_loop_test.cc checks it).

  /usr/bin/python3 examples/pytorch/resnet20_plain.py --epochs 1 --train_samples 4096
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from resnet20_fashion import DEFAULT_DATA_DIR, ResNet20, load_split


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=DEFAULT_DATA_DIR, help="Fashion-MNIST IDX files")
    p.add_argument("--train_samples", type=int, default=0, help="the first N samples (0: all)")
    p.add_argument("--batch_size", type=int, default=64, help="samples per step (per trainer)")
    p.add_argument("--epochs", type=float, default=1.0, help="epochs (elastic: fractions too)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr_decay", choices=["constant", "cosine"], default="cosine")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=1, help="initialisation seed")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--log_every", type=int, default=10, help="print the loss every N steps")
    p.add_argument("--save_model", default="", help="write the final state_dict here")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    train_set = TensorDataset(*load_split(args.data_dir, "train", args.train_samples))
    torch.manual_seed(args.seed)
    model = ResNet20()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    epochs = max(1, math.ceil(args.epochs))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs) \
        if args.lr_decay == "cosine" else torch.optim.lr_scheduler.StepLR(optimizer, 1, 1.0)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model.train()
    trained = 0
    for epoch in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trained += 1
            if args.log_every > 0 and trained % args.log_every == 0:
                print("epoch %d: %d steps trained here, loss %.4f" % (epoch, trained, loss.item()))
        scheduler.step()
    if args.save_model:
        torch.save(model.state_dict(), args.save_model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
