"""edl.torch: a PyTorch model trained in place by EDL's elastic runtime (docs/PYTORCH.md, "PyTorch,
in place").

    import edl.torch
    trainer = edl.torch.ElasticTrainer(model, optimizer, train_set, batch_size=32, epochs=3)
    result = trainer.run()

The same program runs alone (world size 1), under `edl launch -n N` (a fixed world) and under
`edl client` (in place: survivors keep running through every shrink, grow and failure, joiners get
the state from a peer). The C++ runtime (edl/runtime/elastic_trainer.h) owns the loop: which
samples each rank takes at each step (exactly once per epoch across resizes), the learning rate
(linear scaling, schedule, ramp after a re-form), the process group (Gloo over TCP) and the
checkpoint store. This module gives it what it needs from PyTorch, and no more:

  * the gradients as one flat float32 tensor: every parameter's .grad is a view into it, so the
    runtime all-reduces that memory in place (flatten_gradients);
  * the whole training state as named tensors whose memory stays in place: parameters, buffers
    (BatchNorm statistics), the optimizer's state and the RNG (state_tensors); the step, epoch and
    data cursor are the runtime's own. Peers broadcast these bytes to joiners and the checkpoint
    store saves them;
  * a loader that fetches the indices the runtime announces for the next step, on worker threads,
    while the current step trains (BatchLoader).

Limits: one model and one optimizer, CPU tensors (float32 parameters), a forward pass that is
deterministic across ranks, optimizers whose state is tensors updated in place and zero before the
first step (SGD with dampening 0, Adam, AdamW, RMSprop, ...), batches of (input, target).

Threads: the runtime calls into Python only from the thread that called run(), holding the GIL
just for each call; its own threads never touch Python.
"""

import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import edl


def _log(message):
    print("edl.torch: " + message, file=sys.stderr, flush=True)


def launch_info():
    """How this process takes part (a dict: mode, rank, world_size, trainer_id, joining,
    trainers_on_node), decided by the runtime from the environment the launcher set."""
    return edl.plan()


def default_threads():
    """Intra-op threads for this trainer: the cores divided among the trainers on this node."""
    return max(1, (os.cpu_count() or 1) // max(1, launch_info()["trainers_on_node"]))


def flatten_gradients(params):
    """One zeroed float32 tensor holding every parameter's gradient followed by the runtime's
    in-band slots; each p.grad becomes a view into it. Returns (flat, views, count)."""
    count = sum(p.numel() for p in params)
    flat = torch.zeros(count + edl.Trainable.inband_slots, dtype=torch.float32)
    views, offset = [], 0
    for p in params:
        view = flat[offset:offset + p.numel()].view_as(p)
        p.grad = view
        views.append(view)
        offset += p.numel()
    return flat, views, count


def _materialize_optimizer_state(optimizer, params):
    """Creates the optimizer's lazily-made state with one step at lr 0 over zero gradients, then
    zeroes it: the state a first step would find (and the same first step: SGD's momentum buffer
    starts as the first gradient, zero times momentum plus it). Parameters do not move."""
    if all(len(optimizer.state.get(p, {})) == 0 for p in params):
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        optimizer.step()
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
        for p in params:
            for value in optimizer.state.get(p, {}).values():
                if torch.is_tensor(value):
                    value.zero_()


def state_tensors(model, optimizer, rng):
    """The training state as [(name, tensor, per_rank)] in a fixed order: parameters and buffers
    as the state dict names them (buffers per rank: each rank's BatchNorm statistics come from its
    own samples, as under DDP), the optimizer's state by parameter name, and `rng` (per rank)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = [("model/" + n, p.data, False) for n, p in model.named_parameters()]
    out += [("model/" + n, b, True) for n, b in model.named_buffers() if b is not None]
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a parameter that is not in the model; give "
                                 "the optimizer model.parameters()")
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if value is None:  # e.g. SGD's momentum_buffer without momentum
                    continue
                if not torch.is_tensor(value):
                    raise ValueError("optimizer state '%s' of %s is a %s, not a tensor: edl "
                                     "carries tensor state only" % (key, names[id(p)],
                                                                    type(value).__name__))
                out.append(("optimizer/%s/%s" % (names[id(p)], key), value, False))
    out.append(("rng/torch_cpu", rng, True))
    return out


def _layout(tensors):
    text = ";".join("%s:%s:%s" % (n, str(t.dtype)[6:], list(t.shape)) for n, t, _ in tensors)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def fingerprint(model, optimizer, tensors):
    """What the runtime compares between peers and with checkpoints: the model's and the
    optimizer's class and the names, dtypes and shapes of their state, readably."""
    model_part = [t for t in tensors if t[0].startswith("model/")]
    opt_part = [t for t in tensors if t[0].startswith("optimizer/")]
    keys = sorted({n.rsplit("/", 1)[1] for n, _, _ in opt_part})
    return ("model %s [%d tensors, %d values, layout %s]; optimizer %s [state %s, %d tensors, "
            "layout %s]" % (type(model).__name__, len(model_part),
                            sum(t.numel() for _, t, _ in model_part), _layout(model_part),
                            type(optimizer).__name__, ",".join(keys) or "none", len(opt_part),
                            _layout(opt_part)))


class BatchLoader:
    """Batches of a map-style dataset by index list: a TensorDataset is indexed directly, any
    other dataset item by item and collated. With workers > 0, prefetch() loads on a pool of that
    many threads and get() takes the result when the indices match."""

    def __init__(self, dataset, workers=0):
        self.dataset = dataset
        self.pool = ThreadPoolExecutor(workers, "edl-loader") if workers > 0 else None
        self.pending = {}  # indices (bytes) -> future, at most the current and the next step's

    def load(self, indices):
        index = torch.from_numpy(indices)
        if isinstance(self.dataset, TensorDataset):
            return tuple(t[index] for t in self.dataset.tensors)
        return torch.utils.data.default_collate([self.dataset[int(i)] for i in indices])

    def prefetch(self, indices):
        if self.pool is None:
            return
        key = indices.tobytes()
        if key not in self.pending:
            while len(self.pending) >= 2:  # a hint that went unused (the world changed)
                self.pending.pop(next(iter(self.pending)))
            self.pending[key] = self.pool.submit(self.load, indices.copy())

    def get(self, indices):
        future = self.pending.pop(indices.tobytes(), None)
        return future.result() if future is not None else self.load(indices)


class TorchTrainable(edl.Trainable):
    """The runtime's Trainable over a PyTorch model and optimizer (python/src/py_trainable.h):
    its methods are what the runtime calls, on the training thread."""

    def __init__(self, model, optimizer, train_data, test_data=None, loss_fn=None, workers=0):
        super().__init__()
        params = [p for p in model.parameters() if p.requires_grad]
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t is not None and t.device.type != "cpu":
                raise ValueError("%s is on %s: edl.torch trains CPU tensors (over Gloo)"
                                 % (n, t.device))
        bad = [n for n, p in model.named_parameters()
               if p.requires_grad and p.dtype != torch.float32]
        if bad:
            raise ValueError("parameter %s is not float32: the runtime all-reduces float32 "
                             "gradients" % bad[0])
        self.model, self.optimizer, self.params = model, optimizer, params
        self.loss_fn = loss_fn or F.cross_entropy
        self.flat, self.views, count = flatten_gradients(params)
        _materialize_optimizer_state(optimizer, params)
        self.rng = torch.get_rng_state().clone()
        self.tensors = state_tensors(model, optimizer, self.rng)
        for n, t, _ in self.tensors:
            if not t.is_contiguous():
                raise ValueError("state tensor %s is not contiguous" % n)
        self.set_state([(n, t, t.data_ptr(), list(t.shape), str(t.dtype)[6:],
                         t.numel() * t.element_size(), per_rank)
                        for n, t, per_rank in self.tensors])
        self.set_gradients(self.flat, self.flat.data_ptr(), count)
        self.set_sizes(len(train_data), len(test_data) if test_data is not None else 0)
        self.set_fingerprint(fingerprint(model, optimizer, self.tensors))
        self.train_loader = BatchLoader(train_data, workers)
        self.test_loader = BatchLoader(test_data) if test_data is not None else None
        self.opt_state = [(optimizer.state[p], k, v) for p in params
                          for k, v in optimizer.state.get(p, {}).items() if torch.is_tensor(v)]
        self.epoch = 0

    # ---- what the runtime calls
    def prefetch(self, epoch, indices):
        self.train_loader.prefetch(indices)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def forward_backward(self, indices):
        x, y = self.train_loader.get(indices)
        torch.set_rng_state(self.rng)  # the synced RNG, not whatever this process drew before
        self.flat.zero_()
        self.model.train()
        out = self.model(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        for p, view in zip(self.params, self.views):
            if p.grad is not view:  # a hook or an optimizer replaced it: put it back in the buffer
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        labels = _labels(y)
        label_hash = edl.label_hash(labels.numpy()) if labels is not None else 0
        return float(loss) * len(indices), _correct(out, labels), len(indices), label_hash

    def warm_up(self, indices):
        self.forward_backward(indices)

    def apply_update(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for state, key, tensor in self.opt_state:
            if state.get(key) is not tensor:
                raise RuntimeError("the optimizer replaced its state tensor '%s' instead of "
                                   "updating it in place; edl.torch needs in-place optimizer "
                                   "state" % key)
        self.rng.copy_(torch.get_rng_state())

    def evaluate(self, indices):
        if self.test_loader is None:
            return 0.0, 0, 0
        x, y = self.test_loader.get(indices)
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model(x)
                loss = float(self.loss_fn(out, y))
        finally:
            self.model.train()
        return loss * len(indices), _correct(out, _labels(y)), len(indices)


def _labels(y):
    """Class labels as int32 (for the sample log's label hash), or None for other targets."""
    if torch.is_tensor(y) and y.dim() == 1 and not y.is_floating_point():
        return y.to(torch.int32)
    return None


def _correct(out, labels):
    """Top-1 correct predictions of class scores `out` (0 when the targets are not labels)."""
    if labels is None or out.dim() != 2:
        return 0
    return int((out.argmax(1) == labels).sum())


def _where(info):
    """How this trainer takes part, in words (the runtime's mode and its world)."""
    mode = info["mode"]
    if mode == "standalone":
        return ("no launcher, so world size 1 (run it under `edl launch -n N` or `edl client` to "
                "train on several)")
    if mode == "static":
        return "rank %d of a fixed world of %d (edl launch)" % (info["rank"], info["world_size"])
    if mode == "elastic":
        return "in place under an edl client, trainer %s%s" % (
            info["trainer_id"], " (joining)" if info["joining"] else "")
    return "restart mode under an edl client, trainer %s" % info["trainer_id"]


class ElasticTrainer:
    """Trains `model` with `optimizer` on `train_data` (a map-style dataset of (input, target)) in
    place, in whatever world the launcher gives: see the module's docstring. The runtime sets
    every parameter group's lr each step: `lr` (default: the optimizer's) at a global batch of
    `base_batch` (0: no linear scaling), decayed by `lr_decay` (constant, step at `milestones`,
    cosine over `epochs`). `batch_size` is per trainer (batch_policy fixed-local) or in total
    (fixed-global). With `checkpoint_dir`, rank 0 saves to a RocksDB store every
    `checkpoint_steps` steps / `checkpoint_secs` seconds and at the end, and a job nobody holds
    state of resumes from it. `on_step(report)` / `on_eval(report)` get a dict per committed step
    / evaluation on every rank; rank 0 prints a progress line every `log_every` steps (0: none).
    """

    def __init__(self, model, optimizer, train_data, *, test_data=None, loss_fn=None,
                 batch_size=32, batch_policy="fixed-local", epochs=1.0, max_steps=0, lr=None,
                 base_batch=0, lr_decay="constant", warmup_epochs=0.0, milestones=(),
                 rescale_ramp_steps=0, seed=1, checkpoint_dir="", checkpoint_steps=0,
                 checkpoint_secs=0.0, keep_checkpoints=3, evaluate_each_epoch=False,
                 eval_batch=256, workers=0, log_every=10, sample_log="", comm_timeout_s=30.0,
                 generation_wait_s=120.0, on_step=None, on_eval=None):
        self.info = launch_info()
        self.trainable = TorchTrainable(model, optimizer, train_data, test_data, loss_fn, workers)
        o = edl.RunOptions()  # typed: a value of the wrong type raises TypeError here
        for name, value in dict(
                batch=batch_size, batch_policy=batch_policy, seed=seed, epochs=epochs,
                max_steps=max_steps, lr=optimizer.param_groups[0]["lr"] if lr is None else lr,
                base_batch=base_batch, lr_decay=lr_decay, warmup_epochs=warmup_epochs,
                milestones=list(milestones), rescale_ramp_steps=rescale_ramp_steps,
                checkpoint_dir=checkpoint_dir, checkpoint_steps=checkpoint_steps,
                checkpoint_secs=checkpoint_secs, keep_checkpoints=keep_checkpoints,
                evaluate_each_epoch=evaluate_each_epoch and test_data is not None,
                eval_batch=eval_batch, sample_log=sample_log,
                progress_every=max(1, min(log_every, 10)) if log_every > 0 else 10,
                comm_timeout_s=comm_timeout_s, generation_wait_s=generation_wait_s,
                start_micros=edl.START_MICROS).items():
            setattr(o, name, value)
        self.options, self.log_every = o, log_every
        self.user_on_step, self.user_on_eval = on_step, on_eval
        self.rank, self.world_size = 0, 0  # of the last committed step
        self.window = (time.monotonic(), 0)

    def _on_step(self, r):
        self.rank, self.world_size = r["rank"], r["world_size"]
        t0, samples = self.window
        samples += r["samples"]
        self.window = (t0, samples)
        if self.log_every > 0 and r["step"] % self.log_every == 0:
            now = time.monotonic()
            if r["rank"] == 0:
                _log("step %d epoch %.2f loss %.4f acc %.1f%% lr %.5f images/s %.1f generation %d "
                     "world %d" % (r["step"], r["epochs_done"], r["loss"],
                                   100.0 * r["correct"] / max(1, r["samples"]), r["lr"],
                                   samples / max(1e-9, now - t0), r["generation"], r["world_size"]))
            self.window = (now, 0)
        if self.user_on_step is not None:
            self.user_on_step(r)

    def _on_eval(self, r):
        if r["rank"] == 0:
            _log("eval after step %d (epoch %d): test loss %.4f acc %.2f%% on %d samples, %d ranks"
                 % (r["step"], r["epoch"], r["loss"], 100.0 * r["accuracy"], r["samples"],
                    r["world_size"]))
        if self.user_on_eval is not None:
            self.user_on_eval(r)

    def run(self):
        """Trains until the epochs / max_steps are done or this trainer leaves the job. Returns a
        dict: left, step, generation, last_loss, accuracy (-1: none), state_hash. Raises
        edl.TrainingError when training fails (a Python exception from the model: its cause)."""
        _log("%s mode: %s; %s" % (self.info["mode"], _where(self.info), self.trainable.fingerprint))
        self.window = (time.monotonic(), 0)
        result = edl.run(self.trainable, self.options, self._on_step, self._on_eval)
        if result["left"]:
            _log("left the job at generation %d after step %d"
                 % (result["generation"], result["step"]))
        elif self.rank == 0:
            accuracy = result["accuracy"]
            _log("finished at step %d, generation %d, world %d, last loss %.4f%s"
                 % (result["step"], result["generation"], self.world_size, result["last_loss"],
                    "" if accuracy < 0 else ", test accuracy %.2f%%" % (100 * accuracy)))
        return result


# The own-loop API (python/edl/elastic.py), after the helpers above that it uses.
from edl.elastic import BatchSampler, Elastic  # noqa: E402,F401
