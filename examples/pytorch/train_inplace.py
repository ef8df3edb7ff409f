#!/usr/bin/python3
"""ResNet-20 on Fashion-MNIST trained in place by EDL's elastic runtime (edl.torch): an ordinary
PyTorch model, optimizer and dataset, handed to edl.torch.ElasticTrainer instead of a training
loop. The same command runs alone (world size 1), under `edl launch -n N` (a fixed world) and
under `edl client` (in place: when the job shrinks, grows or loses a trainer, the others keep
running, re-form and go on; joiners get the state from a peer, not from disk).

What the runtime owns, so this script does not: which samples each trainer takes at each step
(every sample once per epoch, whatever the world size does), the learning rate (--lr at a global
batch of --base_batch, scaled linearly with the global batch), the process group (Gloo), the
gradient all-reduce and the checkpoints (--checkpoint_dir: a RocksDB store, written by rank 0; a
job that nobody holds state of, e.g. restarted after `kill all`, resumes from it).

Examples:
  /usr/bin/python3 examples/pytorch/train_inplace.py --epochs 1
  edl launch -n 2 -- /usr/bin/python3 examples/pytorch/train_inplace.py --epochs 1
  edl client --slots 2 --server HOST:8180 --secret_file ~/.edl/secret -- \\
      /usr/bin/python3 examples/pytorch/train_inplace.py --checkpoint_dir /mnt/edl/ckpt/inplace

Needs the edl Python package (`make install`, the .deb, or PYTHONPATH=build/python).
"""

import argparse
import sys

import edl.torch  # first: the runtime measures a joiner's time to ready from this import

import torch  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from resnet20_fashion import DEFAULT_DATA_DIR, ResNet20, load_split  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=DEFAULT_DATA_DIR, help="Fashion-MNIST IDX files")
    p.add_argument("--train_samples", type=int, default=0,
                   help="the first N training samples (0: all)")
    p.add_argument("--test_samples", type=int, default=10000,
                   help="test samples, evaluated (sharded across the trainers) after each epoch")
    p.add_argument("--batch_size", type=int, default=64, help="samples per step and trainer")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --epochs)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--base_batch", type=int, default=0,
                   help="--lr is the rate at this global batch, scaled linearly (0: no scaling)")
    p.add_argument("--lr_decay", choices=["constant", "cosine"], default="cosine")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=1, help="init and data order seed")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: cores / trainers on this node)")
    p.add_argument("--workers", type=int, default=1, help="loader threads fetching the next batch")
    p.add_argument("--checkpoint_dir", default="", help="checkpoint store (empty: none)")
    p.add_argument("--checkpoint_steps", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--log_every", type=int, default=10, help="progress line every N steps")
    p.add_argument("--save_model", default="", help="rank 0 writes the final state_dict here")
    p.add_argument("--sample_log", default="", help="test flag: the runtime's per-step sample log")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.epochs <= 0 or args.steps < 0 or args.workers < 0:
        p.error("--batch_size must be >= 1, --epochs > 0, --steps and --workers >= 0")
    return args


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(args.threads or edl.torch.default_threads())
    x, y = load_split(args.data_dir, "train", args.train_samples)
    test = None
    if args.test_samples > 0:
        test = TensorDataset(*load_split(args.data_dir, "t10k", args.test_samples))

    torch.manual_seed(args.seed)
    model = ResNet20()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    trainer = edl.torch.ElasticTrainer(
        model, optimizer, TensorDataset(x, y), test_data=test, batch_size=args.batch_size,
        epochs=args.epochs, max_steps=args.steps, base_batch=args.base_batch,
        lr_decay=args.lr_decay, seed=args.seed, workers=args.workers,
        checkpoint_dir=args.checkpoint_dir, checkpoint_steps=args.checkpoint_steps,
        evaluate_each_epoch=test is not None, log_every=args.log_every,
        sample_log=args.sample_log)
    result = trainer.run()
    if args.save_model and trainer.rank == 0 and not result["left"]:
        torch.save(model.state_dict(), args.save_model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
