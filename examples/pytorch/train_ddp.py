#!/usr/bin/python3
"""ResNet-20 on Fashion-MNIST with torch.distributed (Gloo, CPU): a plain PyTorch DDP trainer
that runs unchanged under `torchrun`, `edl launch` and `edl client --mode restart`.

It reads only what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID; docs/TRAINERS.md, "Restart mode"),
and, like any program in restart mode, checkpoints and resumes by itself:

  * the global batch (--batch_size) is fixed and split across however many ranks the current
    start has, so a step means the same work at every world size and the job always ends at the
    same step count (--steps, or --epochs over --train_samples);
  * the samples of global step s are a function of s alone (a per-epoch permutation seeded by
    --seed and the epoch), so a resumed run continues the data order where the checkpoint left it;
  * rank 0 writes <--checkpoint_dir>/checkpoint.pt every --checkpoint_every steps and at the end
    (torch.save to a temporary file, fsync, atomic rename); at start rank 0 reads it and
    broadcasts it, so the other nodes need not share the directory;
  * a collective that fails (a peer died) makes the trainer wait for its launcher's SIGTERM (the
    edl client and torchrun restart the whole set), exiting 1 only if none comes.

Standalone (no WORLD_SIZE) it trains alone without torch.distributed.

Examples:
  torchrun --standalone --nproc_per_node 2 examples/pytorch/train_ddp.py --checkpoint_dir /tmp/c
  edl launch --nproc_per_node 2 -- /usr/bin/python3 examples/pytorch/train_ddp.py --checkpoint_dir /tmp/c
  edl client --mode restart --slots 2 ... -- /usr/bin/python3 examples/pytorch/train_ddp.py \\
      --checkpoint_dir /mnt/edl/ckpt/ddp
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

STARTED = time.time()  # before importing torch: a start's time to first step includes the import

import torch  # noqa: E402
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from resnet20_fashion import ResNet20, load_split  # noqa: E402  (next to this script)

CHECKPOINT_NAME = "checkpoint.pt"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory with the Fashion-MNIST IDX files (.gz or plain); Debian's "
                        "dataset-fashion-mnist installs them here")
    p.add_argument("--train_samples", type=int, default=0,
                   help="use only the first N training samples (0: all 60000)")
    p.add_argument("--test_samples", type=int, default=10000,
                   help="test samples rank 0 evaluates at the end (0: no evaluation)")
    p.add_argument("--batch_size", type=int, default=128,
                   help="GLOBAL batch per step, split across the ranks of the current start")
    p.add_argument("--epochs", type=float, default=1.0, help="training length in epochs")
    p.add_argument("--steps", type=int, default=0, help="training length in steps (wins over --epochs)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--lr_decay", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--seed", type=int, default=1, help="init and data order seed")
    p.add_argument("--checkpoint_dir", default="",
                   help="where rank 0 keeps checkpoint.pt (empty: no checkpoints, no resume)")
    p.add_argument("--checkpoint_every", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0: cores / LOCAL_WORLD_SIZE)")
    p.add_argument("--log_every", type=int, default=10, help="progress line every N steps")
    p.add_argument("--metrics_file", default="",
                   help="append JSON lines here: a 'start' line per rank, rank 0's 'step' lines "
                        "and a final 'done' line")
    p.add_argument("--timeout_s", type=float, default=120,
                   help="bound on the rendezvous and on every collective")
    p.add_argument("--peer_failure_wait_s", type=float, default=60,
                   help="after a failed collective, wait this long for the launcher's SIGTERM "
                        "before exiting 1")
    p.add_argument("--sample_order", default="",
                   help="test flag: train step s on the global batch that line {\"step\": s+1, "
                        "\"idx\": [...]} of this JSON-lines file lists (an edl --sample_log) "
                        "instead of this script's own data order")
    args = p.parse_args(argv)
    for name in ("batch_size", "checkpoint_every", "log_every"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name)
    if args.train_samples < 0 or args.test_samples < 0 or args.steps < 0 or args.threads < 0:
        p.error("--train_samples, --test_samples, --steps and --threads must be >= 0")
    return args


def env_int(name, default):
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        sys.exit("train_ddp.py: %s=%r is not an integer (the launcher sets it: torchrun, "
                 "edl launch or edl client)" % (name, value))


# ---- data order

def step_indices(step, n, batch, seed):
    """The global batch of `step`: a slice of epoch (step // steps_per_epoch)'s permutation."""
    per_epoch = n // batch
    epoch, offset = divmod(step, per_epoch)
    g = torch.Generator()
    g.manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(n, generator=g)
    return perm[offset * batch:(offset + 1) * batch]


def read_sample_order(path):
    """Global batches by 0-based step from an edl sample log (its steps count from 1)."""
    order = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            order[record["step"] - 1] = torch.tensor(record["idx"], dtype=torch.long)
    return order


def rank_slice(indices, rank, world):
    """This rank's contiguous share of the global batch (sizes differ by at most one)."""
    base, extra = divmod(len(indices), world)
    start = rank * base + min(rank, extra)
    return indices[start:start + base + (1 if rank < extra else 0)]


# ---- checkpoints

def save_checkpoint(directory, state):
    """torch.save to a temporary file in `directory`, fsync, then an atomic rename."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, CHECKPOINT_NAME)
    tmp = final + ".tmp-%d" % os.getpid()
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_checkpoint(directory, fingerprint):
    path = os.path.join(directory, CHECKPOINT_NAME)
    if not directory or not os.path.exists(path):
        return None
    state = torch.load(path, map_location="cpu")
    if state.get("fingerprint") != fingerprint:
        sys.exit("train_ddp.py: %s was written by a run with other settings (%s, now %s): give "
                 "another --checkpoint_dir or delete it" % (path, state.get("fingerprint"), fingerprint))
    return state


class Metrics:
    """JSON lines appended with one write each, so the lines of several ranks never interleave."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None

    def write(self, **record):
        if self.fd is not None:
            os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())


def log(rank, message):
    print("[%s rank %d] %s" % (time.strftime("%H:%M:%S"), rank, message), flush=True)


def wait_for_restart(rank, seconds, error):
    """A collective failed, most likely because a peer died: the launcher (torchrun, edl client)
    notices that death and restarts every trainer, SIGTERMing this one. Wait for it rather than
    exit with a failure of our own."""
    log(rank, "collective failed (%s); waiting up to %.0f s for the launcher to restart the "
              "trainers" % (str(error).splitlines()[0] if str(error) else type(error).__name__, seconds))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
    log(rank, "no restart came: exiting 1")
    sys.exit(1)


def main(argv):
    args = parse_args(argv)
    distributed = os.environ.get("WORLD_SIZE", "") != ""
    world = env_int("WORLD_SIZE", 1)
    rank = env_int("RANK", 0)
    local_world = env_int("LOCAL_WORLD_SIZE", 1)
    restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if world < 1 or not 0 <= rank < world:
        sys.exit("train_ddp.py: RANK=%d outside [0, WORLD_SIZE=%d)" % (rank, world))
    if world > args.batch_size:
        sys.exit("train_ddp.py: WORLD_SIZE=%d is larger than the global --batch_size %d"
                 % (world, args.batch_size))
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, local_world))
    torch.set_num_threads(threads)
    metrics = Metrics(args.metrics_file)

    x_train, y_train = load_split(args.data_dir, "train", args.train_samples)
    n = x_train.shape[0]
    if n < args.batch_size:
        sys.exit("train_ddp.py: %d training samples, fewer than one --batch_size %d"
                 % (n, args.batch_size))
    per_epoch = n // args.batch_size
    total = args.steps or max(1, int(math.ceil(args.epochs * per_epoch)))
    fingerprint = "resnet20 n=%d batch=%d steps=%d seed=%d" % (n, args.batch_size, total, args.seed)

    if distributed:
        dist.init_process_group("gloo", init_method="env://", world_size=world, rank=rank,
                                timeout=datetime.timedelta(seconds=args.timeout_s))
    torch.manual_seed(args.seed)
    model = ResNet20()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)

    # Resume: rank 0 reads the checkpoint and broadcasts it (other nodes need no shared disk).
    state = [load_checkpoint(args.checkpoint_dir, fingerprint) if rank == 0 else None]
    try:
        if distributed:
            dist.broadcast_object_list(state, src=0)
    except RuntimeError as e:
        wait_for_restart(rank, args.peer_failure_wait_s, e)
    step = 0
    if state[0] is not None:
        model.load_state_dict(state[0]["model"])
        opt.load_state_dict(state[0]["optimizer"])
        step = state[0]["step"]
    state = None
    metrics.write(event="start", pid=os.getpid(), rank=rank, world_size=world, wall_time=STARTED,
                  restart_count=restart_count, run_id=run_id, step=step, threads=threads)
    log(rank, "world %d, restart %d, run %r, starting at step %d of %d (%d samples, global "
              "batch %d, %d threads)" % (world, restart_count, run_id, step, total, n,
                                         args.batch_size, threads))
    net = nn.parallel.DistributedDataParallel(model) if distributed else model
    net.train()

    def checkpoint():
        save_checkpoint(args.checkpoint_dir, {"model": model.state_dict(),
                                              "optimizer": opt.state_dict(), "step": step,
                                              "fingerprint": fingerprint})

    order = read_sample_order(args.sample_order) if args.sample_order else None
    if order is not None and any(s not in order for s in range(step, total)):
        sys.exit("train_ddp.py: %s lacks steps of this run's %d" % (args.sample_order, total))
    started, started_step = time.monotonic(), step
    try:
        while step < total:
            lr = args.lr if args.lr_decay == "constant" else \
                0.5 * args.lr * (1 + math.cos(math.pi * step / total))
            for group in opt.param_groups:
                group["lr"] = lr
            batch = order[step] if order is not None else step_indices(step, n, args.batch_size, args.seed)
            mine = rank_slice(batch, rank, world)
            out = net(x_train[mine])
            # Sum over this rank's samples / the global batch, times the world size that DDP's
            # gradient averaging divides by: the gradient of the global batch's mean loss.
            loss_sum = F.cross_entropy(out, y_train[mine], reduction="sum")
            opt.zero_grad(set_to_none=True)
            (loss_sum * (world / args.batch_size)).backward()
            opt.step()
            step += 1
            # The job's loss takes a collective of its own: only for the steps that log it.
            if step % args.log_every == 0 or step == total:
                loss = loss_sum.detach().clone()
                if distributed:
                    dist.all_reduce(loss)
                loss = loss.item() / args.batch_size
            if rank == 0 and (step % args.log_every == 0 or step == total):
                rate = (step - started_step) * args.batch_size / max(1e-9, time.monotonic() - started)
                log(rank, "step %d/%d loss %.4f lr %.4f %.0f images/s" % (step, total, loss, lr, rate))
                metrics.write(event="step", step=step, loss=loss, world_size=world,
                              restart_count=restart_count, pid=os.getpid(), time=time.time())
            if rank == 0 and args.checkpoint_dir and (step % args.checkpoint_every == 0 or step == total):
                checkpoint()
        if distributed:
            dist.barrier()  # nobody leaves while another rank may still need it
    except RuntimeError as e:
        if not distributed:
            raise
        wait_for_restart(rank, args.peer_failure_wait_s, e)

    if rank == 0:
        accuracy = None
        if args.test_samples > 0:
            x_test, y_test = load_split(args.data_dir, "t10k", args.test_samples)
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, x_test.shape[0], 500):
                    correct += (model(x_test[i:i + 500]).argmax(1) == y_test[i:i + 500]).sum().item()
            accuracy = correct / x_test.shape[0]
            log(rank, "test accuracy %.2f%% on %d samples" % (100 * accuracy, x_test.shape[0]))
        metrics.write(event="done", step=step, test_accuracy=accuracy, world_size=world,
                      restart_count=restart_count)
    if distributed:
        dist.destroy_process_group()
    log(rank, "finished at step %d" % step)
    # Leave now, before main's frame frees the DDP module. With Debian's torch 1.13 that teardown
    # can deadlock: ~Reducer drops the last reference to the Gloo process group, whose destructor
    # joins its worker thread while holding the GIL, and the worker, freeing a tensor Python
    # allocated, waits for the GIL (seen in gdb on a rank that had logged "finished" and never
    # exited, so its job never ended). Everything this script writes is already out: log lines are
    # flushed, metrics are one os.write each, the checkpoint is fsynced.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
