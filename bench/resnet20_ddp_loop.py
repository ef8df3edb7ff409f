#!/usr/bin/python3
"""examples/pytorch/resnet20_plain.py's loop under DDP (torch.distributed over Gloo, CPU), for
bench/rescale_pytorch.sh's steady own-loop row: the same model, DataLoader, optimizer and
per-trainer batch as resnet20_elastic.py, with DDP's DistributedSampler and gradient all-reduce in
place of edl.torch.Elastic. Reads torchrun's variables (edl launch sets them). Rank 0 appends one
JSON line per step ({"step", "time"}) to --metrics_file at the end.

usage: resnet20_ddp_loop.py [resnet20_plain.py flags] --steps N --metrics_file F
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "pytorch"))

import time  # noqa: E402

import resnet20_plain  # noqa: E402
from resnet20_fashion import ResNet20, load_split  # noqa: E402


def main(argv):
    steps, metrics = 0, ""
    if "--steps" in argv:
        i = argv.index("--steps")
        steps = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--metrics_file" in argv:
        i = argv.index("--metrics_file")
        metrics = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    args = resnet20_plain.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    train_set = TensorDataset(*load_split(args.data_dir, "train", args.train_samples))
    torch.manual_seed(args.seed)
    model = ResNet20()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)
    net = DistributedDataParallel(model)
    net.train()
    times, step, epoch = [], 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            times.append((step, time.time()))
            if step >= steps:
                break
        epoch += 1
    if rank == 0 and metrics:
        with open(metrics, "a") as f:
            for s, t in times:
                f.write(json.dumps({"step": s, "time": t}) + "\n")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as train_ddp.py: torch 1.13's Gloo teardown can deadlock at interpreter exit


if __name__ == "__main__":
    main(sys.argv[1:])
