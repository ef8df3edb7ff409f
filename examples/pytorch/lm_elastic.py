#!/usr/bin/python3
"""A small transformer language model on generated text, trained elastically with its own loop
(edl.torch.Elastic): AdamW over two parameter groups (no weight decay on biases, norms and
embeddings), bfloat16 autocast on the CPU, gradient clipping on the all-reduced gradient,
gradient accumulation, dict batches from a DataLoader with worker processes and a collate_fn, a
warm-up-then-cosine LR schedule of the script's own (a LambdaLR over the job's epoch progress,
times the runtime's linear-scaling factor) and a held-out evaluation the runtime shards over the
trainers after every epoch.

The text: sentences of a small generated language (a subject, a verb agreeing with it, an object,
sometimes a clause), tokenised by word and cut into fixed-length windows. Its next-word
entropy is well below the vocabulary's, so the loss falls visibly within an epoch or two.

  /usr/bin/python3 examples/pytorch/lm_elastic.py --epochs 2
  edl launch -n 2 -- /usr/bin/python3 examples/pytorch/lm_elastic.py --epochs 2
  edl client --slots 2 --server HOST:8180 --secret_file ~/.edl/secret -- \\
      /usr/bin/python3 examples/pytorch/lm_elastic.py --epochs 20 --checkpoint_dir /mnt/edl/ckpt/lm
"""

import argparse
import math
import random
import sys

import edl.torch  # first: the runtime measures a joiner's time to ready from this import
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SUBJECTS = {"sg": ["the cat", "a dog", "the old man", "my sister", "the machine", "a bird"],
            "pl": ["the cats", "two dogs", "the children", "our friends", "the machines"]}
VERBS = {"sg": ["sees", "likes", "follows", "builds", "finds"],
         "pl": ["see", "like", "follow", "build", "find"]}
OBJECTS = ["the house", "a red ball", "the river", "some bread", "the tall tree", "a small box"]
CLAUSES = ["", "", "", "because it rains", "when the sun sets", "and then sleeps"]


def generate_text(sentences, seed):
    """Deterministic text of the generated language, as a list of words."""
    rng = random.Random(seed)
    words = []
    for _ in range(sentences):
        number = rng.choice(["sg", "pl"])
        parts = [rng.choice(SUBJECTS[number]), rng.choice(VERBS[number]), rng.choice(OBJECTS),
                 rng.choice(CLAUSES)]
        words += " ".join(p for p in parts if p).split() + ["."]
    return words


class Windows(Dataset):
    """Map-style: window i is tokens [i * stride, i * stride + length + 1) of the text, as a dict
    (the runtime plans indices, so the data set must be indexable)."""

    def __init__(self, tokens, length, stride):
        self.tokens, self.length, self.stride = tokens, length, stride

    def __len__(self):
        return (len(self.tokens) - self.length - 1) // self.stride

    def __getitem__(self, i):
        start = int(i) * self.stride
        return {"tokens": self.tokens[start:start + self.length + 1]}


def collate(samples):
    """Dict batches: inputs and next-word targets."""
    tokens = torch.stack([s["tokens"] for s in samples])
    return {"input": tokens[:, :-1], "target": tokens[:, 1:]}


class TinyLM(nn.Module):
    def __init__(self, vocab, length, dim=64, heads=4, layers=2, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(length, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        mask = torch.triu(torch.full((length, length), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.embed(tokens) + self.position[:t]
        h = self.blocks(h, mask=self.causal[:t, :t])
        return self.head(self.norm(h))


def loss_of(model, batch):
    """The mean next-word loss of a batch, computed in bfloat16 (the loss itself in float32)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(batch["input"])
    return F.cross_entropy(logits.float().flatten(0, 1), batch["target"].flatten())


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sentences", type=int, default=6000, help="generated training sentences")
    p.add_argument("--length", type=int, default=32, help="tokens per window")
    p.add_argument("--batch_size", type=int, default=16, help="windows per trainer and step")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --epochs)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak rate at a global batch of 32")
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up, in epochs")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / trainers)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint_dir", default="")
    p.add_argument("--log_every", type=int, default=10)
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(args.threads or edl.torch.default_threads())
    words = generate_text(args.sentences + args.sentences // 10, args.seed)
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    tokens = torch.tensor([vocab[w] for w in words], dtype=torch.long)
    split = int(len(tokens) * 10 / 11)
    train_set = Windows(tokens[:split], args.length, args.length // 2)
    held_out = Windows(tokens[split:], args.length, args.length)

    torch.manual_seed(args.seed)
    model = TinyLM(len(vocab), args.length)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    job = None

    def schedule(_):  # warm-up, then cosine to 10%, over the job's progress in epochs
        progress = job.epoch_progress if job is not None else 0.0
        if progress < args.warmup:
            return (progress + 1e-3) / args.warmup
        t = min(1.0, (progress - args.warmup) / max(1e-9, args.epochs - args.warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def evaluate(batch):  # the runtime shards the held-out windows over the trainers
        return float(loss_of(model, batch)) * batch["target"].shape[0], 0  # (loss sum, correct)

    def clip():  # runs on the all-reduced gradient, before AdamW steps
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)

    job = edl.torch.Elastic(
        model, optimizer, train_set, batch_size=args.batch_size, accumulate=args.accumulate,
        state={"scheduler": scheduler}, lr_mode="scaled", base_batch=32, max_steps=args.steps,
        seed=args.seed, checkpoint_dir=args.checkpoint_dir, checkpoint_steps=50,
        warm_up=lambda batch: loss_of(model, batch), eval_set=held_out, eval_fn=evaluate,
        collate_fn=collate, log_every=args.log_every)
    job.extra["updates"] = 0  # job.extra: plain values synced and checkpointed with the model
    loader = DataLoader(train_set, batch_sampler=job.batch_sampler(), num_workers=args.workers,
                        collate_fn=collate, persistent_workers=args.workers > 0)
    model.train()
    for epoch in job.epochs(args.epochs):
        for batch in job.batches(loader):
            loss = loss_of(model, batch)
            (loss * job.micro_weight).backward()  # the step's mean over its micro-batches
            # After every micro-batch: job.step only all-reduces and steps after the step's last.
            if job.step(optimizer, before_update=clip, loss=loss):
                scheduler.step()
                job.extra["updates"] += 1
        if job.rank == 0:
            ev = job.last_eval  # the evaluation after the previous epoch (the runtime's, sharded)
            print("epoch %d: %d updates%s" % (
                epoch, job.extra["updates"],
                "" if ev is None else ", held-out loss after the previous epoch %.3f" % ev["loss"]),
                flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
