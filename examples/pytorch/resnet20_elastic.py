#!/usr/bin/python3
"""ResNet-20 on Fashion-MNIST, elastic: resnet20_plain.py with its own loop kept and
edl.torch.Elastic added (`diff resnet20_plain.py resnet20_elastic.py`). The same command runs alone
(world size 1), under `edl launch -n N` (a fixed world) and under `edl client` (in place: when the
job shrinks, grows or loses a trainer, the others keep running from the line they are at; joiners
enter the loop with the synced state). The runtime plans every trainer's samples (each once per
epoch, whatever the world size does), all-reduces the gradients in job.step, commits each step,
syncs the scheduler's state with the model's and checkpoints all of it (--checkpoint_dir).

  /usr/bin/python3 examples/pytorch/resnet20_elastic.py --epochs 1 --train_samples 4096
  edl launch -n 2 -- /usr/bin/python3 examples/pytorch/resnet20_elastic.py --epochs 1
  edl client --slots 2 --server HOST:8180 --secret_file ~/.edl/secret -- \\
      /usr/bin/python3 examples/pytorch/resnet20_elastic.py --checkpoint_dir /mnt/edl/ckpt/r20
"""

import argparse
import math
import sys

import edl.torch  # first: the runtime measures a joiner's time to ready from this import
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
    p.add_argument("--checkpoint_dir", default="", help="checkpoint store (rank 0 writes)")
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
    job = edl.torch.Elastic(model, optimizer, train_set, batch_size=args.batch_size,
                            state=[scheduler], checkpoint_dir=args.checkpoint_dir,
                            checkpoint_steps=50, labels=lambda batch: batch[1])
    loader = DataLoader(train_set, batch_sampler=job.batch_sampler(),
                        num_workers=args.workers)
    model.train()
    trained = 0
    for epoch in job.epochs(args.epochs):
        for x, y in job.batches(loader):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            job.step(optimizer, loss=loss)
            trained += 1
            if args.log_every > 0 and trained % args.log_every == 0:
                print("epoch %d: %d steps trained here, loss %.4f" % (epoch, trained, loss.item()))
        scheduler.step()
    if args.save_model and job.rank == 0:
        torch.save(model.state_dict(), args.save_model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
