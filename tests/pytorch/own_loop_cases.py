#!/usr/bin/python3
"""Small own-loop jobs (edl.torch.Elastic) for tests/pytorch/pytorch_own_loop_test.cc, one per
CASE, on a tiny model and generated data (no data set needed). Alone they run at world size 1;
under `edl launch -n N` at N.

  features        several models and optimizers, parameter groups, dict batches from a
                  DataLoader with worker processes and a collate_fn, accumulation, gradient
                  clipping, a registered scheduler, a loss scaler and job.extra; prints one line
                  "RESULT {json}" with the parameters' hash, the runtime's state hash and more
  accumulation    the same steps with and without accumulate=2: prints the largest difference
  lr_modes        what the optimizers' lr is under lr_mode user / scaled / runtime
  no_grad, model_changed, iterable, no_step, sampler_replaced, loader_direct, hook_raises, nan,
  short_batch     a mistake each, which must end the trainer with a clear error (exit status 1)

usage: own_loop_cases.py CASE
"""

import hashlib
import json
import sys

import edl.torch
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

torch.set_num_threads(1)
N = 96


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + 2 * (x[:, 2] > 0).long()
    return x, y


def mlp(seed=5):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def param_hash(*models):
    h = hashlib.sha1()
    for m in models:
        for t in m.state_dict().values():
            h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Records(Dataset):
    """Dict samples, map-style."""

    def __init__(self):
        self.x, self.y = data()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


def collate(samples):
    return {"features": torch.stack([s["features"] for s in samples]),
            "label": torch.stack([s["label"] for s in samples])}


class LossScaler:
    """A dynamic loss scaler with GradScaler's interface (torch 1.13's GradScaler is CUDA-only):
    scale(loss), unscale_(opt), step(opt) (skipped when a gradient is not finite), update()."""

    def __init__(self, scale=1024.0):
        self.scale_, self.good, self.found_inf, self.skipped = scale, 0, False, 0

    def scale(self, loss):
        return loss * self.scale_

    def unscale_(self, optimizer):
        for g in optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale_)
                    self.found_inf |= not bool(torch.isfinite(p.grad).all())

    def step(self, optimizer):
        if not self.found_inf:
            optimizer.step()

    def update(self):
        if self.found_inf:
            self.scale_ /= 2
            self.good = 0
            self.skipped += 1
        else:
            self.good += 1
            if self.good % 4 == 0:
                self.scale_ *= 2
        self.found_inf = False

    def state_dict(self):
        return {"scale": self.scale_, "good": self.good, "skipped": self.skipped}

    def load_state_dict(self, d):
        self.scale_, self.good, self.skipped = d["scale"], d["good"], d["skipped"]


def features():
    torch.manual_seed(5)
    encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    head = nn.Linear(16, 4)
    enc_opt = torch.optim.SGD([{"params": [encoder[0].weight], "weight_decay": 1e-3},
                               {"params": [encoder[0].bias], "weight_decay": 0.0}],
                              lr=0.05, momentum=0.9)
    head_opt = torch.optim.Adam(head.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(enc_opt, step_size=5, gamma=0.5)
    scaler = LossScaler()
    dataset = Records()
    job = edl.torch.Elastic([encoder, head], [enc_opt, head_opt], dataset, batch_size=8,
                            accumulate=2, state={"scheduler": scheduler, "scaler": scaler},
                            collate_fn=collate, labels=lambda b: b["label"])
    job.extra["updates"] = 0
    loader = DataLoader(dataset, batch_sampler=job.batch_sampler(), num_workers=2,
                        collate_fn=collate)
    poisoned = False
    for epoch in job.epochs(3):
        for batch in job.batches(loader):
            loss = F.cross_entropy(head(encoder(batch["features"])), batch["label"])
            if job.steps_done == 7 and not poisoned:  # one overflow: every rank skips the step
                loss = loss * float("inf")
                poisoned = True
            with job.no_sync():
                scaler.scale(loss * job.micro_weight).backward()
            clip = lambda: nn.utils.clip_grad_norm_(  # noqa: E731
                list(encoder.parameters()) + list(head.parameters()), 1.0)
            if job.step(enc_opt, head_opt, scaler=scaler, before_update=clip, loss=loss):
                scheduler.step()
                job.extra["updates"] += 1
    print("RESULT " + json.dumps({
        "rank": job.rank, "world": job.world_size, "params": param_hash(encoder, head),
        "state_hash": job.result["state_hash"], "steps": job.result["step"],
        "updates": job.extra["updates"], "skipped": scaler.skipped, "scale": scaler.scale_,
        "enc_lr": enc_opt.param_groups[0]["lr"], "epochs_done": job.epoch_progress}), flush=True)


def train(accumulate, steps):
    """`steps` steps of plain SGD on batches of 8, split into `accumulate` micro-batches."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    job = edl.torch.Elastic(model, opt, TensorDataset(x, y), batch_size=8,
                            accumulate=accumulate, max_steps=steps, log_every=0)
    for _ in job.epochs(10):
        for bx, by in job.batches():
            (F.cross_entropy(model(bx), by) * job.micro_weight).backward()
            job.step(opt)
    return model


def accumulation():
    a, b = train(1, 6), train(2, 6)
    worst = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    moved = max((p - q).abs().max().item() for p, q in zip(a.parameters(), mlp().parameters()))
    print("RESULT " + json.dumps({"max_difference": worst, "moved": moved}), flush=True)


def lr_modes():
    out = {}
    for mode in ("user", "scaled", "runtime"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = data()
        job = edl.torch.Elastic(model, opt, TensorDataset(x, y), batch_size=8, lr_mode=mode,
                                base_batch=32, lr_decay="cosine", max_steps=4, log_every=0)
        seen = []
        for _ in job.epochs(2):
            for bx, by in job.batches():
                F.cross_entropy(model(bx), by).backward()
                job.step(opt, before_update=lambda: seen.append(opt.param_groups[0]["lr"]))
        out[mode] = {"seen": seen, "after": opt.param_groups[0]["lr"], "scale": job.lr_scale}
    print("RESULT " + json.dumps(out), flush=True)


def simple_job(model=None, dataset=None, **kwargs):
    model = model or mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if dataset is None:
        dataset = TensorDataset(*data())
    return model, opt, edl.torch.Elastic(model, opt, dataset, batch_size=8, log_every=0,
                                         **kwargs)


def mistake(case):
    if case == "iterable":
        class Stream(IterableDataset):
            def __iter__(self):
                return iter(zip(*data()))
        simple_job(dataset=Stream())
        return
    if case == "no_grad":
        model = nn.ModuleDict({"used": mlp(), "unused": nn.Linear(4, 4)})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        job = edl.torch.Elastic(model, opt, TensorDataset(*data()), batch_size=8)
        for _ in job.epochs(1):
            for x, y in job.batches():
                F.cross_entropy(model["used"](x), y).backward()
                job.step(opt)
        return
    model, opt, job = simple_job(collate_fn=(lambda s: torch.utils.data.default_collate(s[:-1]))
                                 if case == "short_batch" else None)
    loader = DataLoader(job.dataset, batch_size=8) if case == "sampler_replaced" else \
        DataLoader(job.dataset, batch_sampler=job.batch_sampler(),
                   collate_fn=job._collate if case == "short_batch" else None)
    for _ in job.epochs(2):
        batches = loader if case == "loader_direct" else job.batches(loader)
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            if case == "nan" and job.steps_done == 3:
                loss = loss * float("nan")
            loss.backward()
            if case == "model_changed" and job.steps_done == 2:
                model[2] = nn.Linear(16, 4)
            if case == "no_step":
                continue
            if case == "hook_raises" and job.steps_done == 4:
                def hook():
                    raise ValueError("a hook that fails")
                job.step(opt, before_update=hook)
            else:
                job.step(opt)


CASES = {"features": features, "accumulation": accumulation, "lr_modes": lr_modes}

if __name__ == "__main__":
    case = sys.argv[1]
    if case in CASES:
        CASES[case]()
    else:
        mistake(case)
    print("no error", flush=True)
