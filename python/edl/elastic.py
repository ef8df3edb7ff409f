"""edl.torch.Elastic: your own PyTorch training loop, elastic (docs/PYTORCH.md, "Your own loop").

    job = edl.torch.Elastic(model, optimizer, train_set, batch_size=64, state=[scheduler])
    loader = DataLoader(train_set, batch_sampler=job.batch_sampler(), num_workers=4)
    for epoch in job.epochs(10):
        for x, y in job.batches(loader):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            job.step(optimizer, before_update=lambda: clip_grad_norm_(model.parameters(), 1.0))
            scheduler.step()

The loop, the loss, the optimizer code, the batches (a DataLoader of yours, with workers and a
collate_fn) stay the script's; the C++ runtime (edl/runtime/elastic_trainer.h, the same one as
ElasticTrainer's and `edl train`'s) keeps which samples each trainer takes at each step (every
sample once per epoch, whatever the world size does), the gradient all-reduce, the commit of each
step, the re-forms and the checkpoints.

How the two meet (python/src/own_loop.h). The runtime's loop runs on a thread of its own and
hands each step to this one: "train on these indices" (the batch sampler turns them into the
DataLoader's batches), then, once job.step has put the gradients in the runtime's flat buffer,
"the gradients are all-reduced, lr is ...", at which point job.step runs the hooks and the
optimizers. The runtime then waits until the loop asks for its next batch (job.batches) or its next
epoch (job.epochs): only then does it commit the step, so whatever the loop did after job.step
(a scheduler step, a counter) is part of that step, everywhere. That is also where a re-form
happens: a trainer whose world changes finds, when it asks for the next batch, the state synced
and the data plan of the new world; a joiner enters `for epoch in job.epochs(...)` with the synced
state at the job's data position. The two threads never run at once (each waits while the other
works), so the runtime never sees the model half-updated; the runtime thread never takes the GIL,
and this thread releases it while it waits.

A failure (a peer dies during the all-reduce) discards the step: job.step returns False without
stepping the optimizers, and whatever the loop does before asking for its next batch is undone
(the synced state is put back), then the step is trained again in the new world.
"""

import atexit
import collections
import contextlib
import hashlib
import math
import os
import pickle
import sys
import time

import numpy as np
import torch
from torch.utils.data import IterableDataset, TensorDataset

import edl
import edl.torch as _et

_LR_MODES = ("user", "scaled", "runtime")


def _log(message):
    print("edl.torch: " + message, file=sys.stderr, flush=True)


def _as_list(x, what):
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError("edl.torch.Elastic: no %s given" % what)
        return list(x)
    return [x]


def _split(indices, parts):
    """The micro-batches of one step: `parts` nearly equal, non-empty slices in order."""
    n = min(parts, len(indices))
    if n <= 1:
        return [indices] if n == 1 else []
    return list(np.array_split(indices, n))


def _leading_dim(batch):
    """The sample count of a collated batch: the first dimension of its first tensor (tensors in
    tuples, lists and dicts, depth first), or None when there is none."""
    if torch.is_tensor(batch):
        return batch.shape[0] if batch.dim() > 0 else None
    if isinstance(batch, dict):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        n = _leading_dim(item)
        if n is not None:
            return n
    return None


class _Cursor:
    """Where the batch sampler goes on: a step's plan (epoch, cursor, per-rank batches, rank) and a
    micro-batch within it."""

    __slots__ = ("step", "epoch", "cursor", "batches", "rank", "micro", "parts")

    def __init__(self, step, epoch, cursor, batches, rank, micro, parts):
        self.step, self.epoch, self.cursor, self.batches = step, epoch, cursor, list(batches)
        self.rank, self.micro, self.parts = rank, micro, parts


class _Feed:
    """One pass of job.batches() over an epoch: what the batch sampler handed the DataLoader
    (keys of index lists, in order) and where it goes on. The DataLoader delivers batches in the
    order it drew their indices, so the oldest key belongs to the next batch it delivers."""

    def __init__(self, job, epoch):
        self.job, self.epoch = job, epoch
        self.queue = collections.deque()
        self.cursor = None

    def rebase(self, req, micro, parts):
        self.cursor = _Cursor(req["step"], req["epoch"], req["cursor"], req["batches"],
                              req["rank"], micro, parts)

    def next_key(self):
        c = self.cursor
        return None if c is None else c.parts[c.micro].tobytes()

    def next_indices(self):
        """The DataLoader's next index list: the step the runtime asked for, then this rank's
        slices of the following steps as planned for the current world (a guess a re-form can make
        wrong: job.batches drops such batches unused)."""
        c = self.cursor
        if c is None:
            raise StopIteration
        idx = c.parts[c.micro]
        self.queue.append(idx.tobytes())
        if c.micro + 1 < len(c.parts):
            c.micro += 1
        else:
            self.cursor = self.job._following(c, self.epoch)
        return idx.tolist()


class _IndexIterator:
    def __init__(self, feed):
        self.feed = feed

    def __iter__(self):
        return self

    def __next__(self):
        return self.feed.next_indices()


class BatchSampler:
    """What `DataLoader(dataset, batch_sampler=job.batch_sampler())` draws its index lists from:
    the runtime's indices for this trainer, step by step. Iterate job.batches(loader), not the
    DataLoader itself: that is where batches are matched with the runtime's steps."""

    def __init__(self, job):
        self._job = job

    def __iter__(self):
        feed = self._job._feed
        if feed is None:
            raise self._job._fatal(
                "this DataLoader's batch sampler is the job's, but the loop iterates the "
                "DataLoader itself: iterate job.batches(loader) instead (`for batch in "
                "job.batches(loader):`), which matches its batches with the runtime's steps")
        return _IndexIterator(feed)

    def __len__(self):
        return self._job._micro_batches_per_epoch()


class _Batches:
    """The iterator job.batches(loader) returns: the batches of the current epoch, each the one
    the runtime planned for this trainer's current step (batches the loader fetched ahead for a
    world that changed since are dropped unused)."""

    def __init__(self, job, loader):
        self.job, self.loader = job, loader
        self.epoch = job._req["epoch"]
        self.feed = _Feed(job, self.epoch)
        self.it = None
        self.dropped = 0

    def __iter__(self):
        return self

    def _close(self):
        self.it = None
        if self.job._feed is self.feed:
            self.job._feed = None

    def __next__(self):
        job = self.job
        try:
            more = job._before_batch()
        except BaseException:
            self._close()
            raise
        if not more or job._req is None or job._req["epoch"] != self.epoch:
            self._close()
            raise StopIteration
        want = job._parts[job._delivered]
        if self.loader is None:
            batch = job._load(want)
        else:
            batch = self._from_loader(job, want)
        job._delivered += 1
        job._check_batch(batch, want)
        return batch

    def _from_loader(self, job, want):
        key = want.tobytes()
        feed = self.feed
        if key not in feed.queue and feed.next_key() != key:
            feed.rebase(job._req, job._delivered, job._parts)  # the world changed: a new plan
        job._feed = feed
        restarted = False
        while True:
            if self.it is None:
                self.it = iter(self.loader)
            try:
                batch = next(self.it)
            except StopIteration:
                # The loader ended (its sampler saw the epoch's planned end) while this step
                # still needs a batch: the plan changed near the end. Start it again from here.
                if restarted:
                    raise job._fatal("the DataLoader yields no batch for the indices the runtime "
                                     "planned; is its batch_sampler still job.batch_sampler()?")
                restarted = True
                feed.queue.clear()
                feed.rebase(job._req, job._delivered, job._parts)
                self.it = None
                continue
            if not feed.queue:
                raise job._fatal("the DataLoader delivered a batch its batch sampler did not "
                                 "draw: build it with batch_sampler=job.batch_sampler() and no "
                                 "sampler of its own")
            if feed.queue.popleft() == key:
                return batch
            self.dropped += 1


class Elastic:
    """An elastic training job over your own loop: see the module's docstring and
    docs/PYTORCH.md, "Your own loop".

    model, optimizer: a module or a list of modules, an optimizer or a list (their parameters,
      buffers and optimizer state are registered: synced to joiners, hashed, checkpointed).
    dataset: the map-style training set (len() and indexing); the runtime plans its indices.
    batch_size: per trainer and step (batch_policy "fixed-local") or in total ("fixed-global");
      with accumulate=k the step's batch is k micro-batches of about batch_size / k each.
    state: objects with state_dict() / load_state_dict() (LR schedulers, a GradScaler, ...) synced
      and checkpointed with the tensors; job.extra is a dict of picklable values that is too.
    lr_mode: "user" (the optimizers' lr is yours; job.lr_scale is the runtime's linear-scaling
      factor, global batch / base_batch, with the ramp after a re-form), "scaled" (yours times that
      factor while the optimizers step), "runtime" (the runtime sets it: lr at base_batch, lr_decay,
      warmup_epochs, milestones, as ElasticTrainer does).
    warm_up: fn(batch) -> loss; a joiner runs it once (forward and backward, state restored)
      before it reports ready, so that its first step in the job is not its slowest (default:
      for (input, ...) batches of one model, model(input) and a backward from its output).
    eval_set, eval_fn: fn(batch) -> (loss_sum, correct); the runtime then evaluates the eval set,
      sharded over the trainers, after every epoch (job.last_eval).
    labels: fn(batch) -> int tensor of class labels, for the sample log's fed-label check.
    """

    def __init__(self, model, optimizer, dataset, *, batch_size, batch_policy="fixed-local",
                 accumulate=1, state=(), seed=1, max_steps=0, lr_mode="user", lr=None,
                 base_batch=0, lr_decay="constant", warmup_epochs=0.0, milestones=(),
                 rescale_ramp_steps=0, checkpoint_dir="", checkpoint_steps=0, checkpoint_secs=0.0,
                 keep_checkpoints=3, warm_up=None, eval_set=None, eval_fn=None, eval_batch=256,
                 collate_fn=None, labels=None, check_batch_size=True, allow_unused=False,
                 exit_on_leave=True, extra_state_bytes=1 << 16, log_every=10, sample_log=None,
                 comm_timeout_s=300.0, generation_wait_s=120.0):
        self.info = _et.launch_info()  # a warm spare waits here until it becomes a trainer
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__") \
                or not hasattr(dataset, "__len__"):
            raise TypeError(
                "edl.torch.Elastic needs a map-style dataset (len() and indexing), not %s: the "
                "runtime hands each trainer the indices of its samples at every step, which is "
                "what keeps every epoch exactly once across resizes, and an iterable dataset "
                "yields samples in its own order. Index your records (a map-style Dataset whose "
                "__getitem__ loads record i)" % type(dataset).__name__)
        if len(dataset) == 0:
            raise ValueError("edl.torch.Elastic: the dataset is empty")
        if lr_mode not in _LR_MODES:
            raise ValueError("lr_mode must be one of %s, not %r" % (", ".join(_LR_MODES), lr_mode))
        if lr_mode == "scaled" and base_batch <= 0:
            raise ValueError("lr_mode='scaled' needs base_batch: the global batch at which the "
                             "optimizers' lr is right")
        if accumulate < 1 or batch_size < 1:
            raise ValueError("batch_size and accumulate must be >= 1")
        if (eval_set is None) != (eval_fn is None):
            raise ValueError("give eval_set and eval_fn together")
        self.models = _as_list(model, "model")
        self.optimizers = _as_list(optimizer, "optimizer")
        self.dataset, self.accumulate = dataset, accumulate
        self.exit_on_leave, self.log_every = exit_on_leave, log_every
        self.extra = {}
        self._objects = self._named_objects(state)
        self._warm_up_fn, self._eval_fn, self._labels_fn = warm_up, eval_fn, labels
        self._eval_set = eval_set
        self._collate = collate_fn or torch.utils.data.default_collate
        self._check_size, self._allow_unused = check_batch_size, allow_unused
        self._lr_mode = lr_mode
        self._register(extra_state_bytes)
        base_lr = self.optimizers[0].param_groups[0]["lr"] if lr is None else lr
        self._base_lr = float(base_lr)
        self._group_lr0 = [[g["lr"] for g in o.param_groups] for o in self.optimizers]
        o = edl.RunOptions()
        runtime_lr = lr_mode == "runtime"
        for name, value in dict(
                batch=batch_size * 1, batch_policy=batch_policy, seed=seed, max_steps=max_steps,
                lr=self._base_lr if runtime_lr else 1.0, base_batch=base_batch,
                lr_decay=lr_decay if runtime_lr else "constant",
                warmup_epochs=warmup_epochs if runtime_lr else 0.0,
                milestones=list(milestones) if runtime_lr else [],
                rescale_ramp_steps=rescale_ramp_steps, checkpoint_dir=checkpoint_dir,
                checkpoint_steps=checkpoint_steps, checkpoint_secs=checkpoint_secs,
                keep_checkpoints=keep_checkpoints, evaluate_each_epoch=eval_set is not None,
                eval_batch=eval_batch,
                sample_log=sample_log if sample_log is not None else os.environ.get(
                    "EDL_SAMPLE_LOG", ""),
                progress_every=max(1, min(log_every, 10)) if log_every > 0 else 10,
                comm_timeout_s=comm_timeout_s, generation_wait_s=generation_wait_s,
                start_micros=edl.START_MICROS).items():
            setattr(o, name, value)
        self._options = o
        self._checkpoint_dir = checkpoint_dir
        self._plan = edl.DataPlan(len(dataset), seed)
        self._max_steps = max_steps
        self._sampler = BatchSampler(self)
        # The loop's position in the runtime's protocol (python/src/own_loop.h).
        self._started = False
        self._epochs = 0.0
        self._req = None          # the current "train" request: the step being trained
        self._parts = []          # its micro-batches (index arrays)
        self._delivered = 0       # micro-batches of it job.batches() delivered
        self._stepped = False     # job.step() applied it (or saw it discarded)
        self._update_seq = None   # the "update" request job.step applied, answered at the commit
        self._save_next = False
        self._snapshot = None     # the synced state after a discarded step, put back at the park
        self._labels_seen = []
        self._feed = None
        self._failed = None
        self._writes_seen = -1
        self._yielded_seq = None
        self._lr_scale = 1.0
        self._rate = (time.monotonic(), 0)
        self.result = None
        self.left = False
        self._pid = os.getpid()
        atexit.register(self._at_exit)

    # ---- registration

    @staticmethod
    def _named_objects(state):
        items = state.items() if isinstance(state, dict) else \
            (("%d:%s" % (i, type(o).__name__), o) for i, o in enumerate(state))
        out = []
        for name, obj in items:
            if not (callable(getattr(obj, "state_dict", None)) and
                    callable(getattr(obj, "load_state_dict", None))):
                raise TypeError("state %s (%s) has no state_dict() / load_state_dict(): register "
                                "objects that have, or keep plain values in job.extra"
                                % (name, type(obj).__name__))
            out.append((str(name), obj))
        return out

    def _register(self, extra_state_bytes):
        multi = len(self.models) > 1
        params, names, seen = [], [], set()
        for i, m in enumerate(self.models):
            prefix = "model%d/" % i if multi else "model/"
            for n, t in list(m.named_parameters()) + list(m.named_buffers()):
                if t is not None and t.device.type != "cpu":
                    raise ValueError("%s%s is on %s: edl.torch trains CPU tensors (over Gloo)"
                                     % (prefix, n, t.device))
            for n, p in m.named_parameters():
                if p.requires_grad and id(p) not in seen:
                    if p.dtype != torch.float32:
                        raise ValueError("parameter %s%s is %s, not float32: the runtime "
                                         "all-reduces float32 gradients (autocast computes in "
                                         "bfloat16 over float32 parameters)" % (prefix, n, p.dtype))
                    seen.add(id(p))
                    params.append(p)
                    names.append(prefix + n)
        for o in self.optimizers:
            for g in o.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        raise ValueError("%s holds a parameter that is in none of the models (or "
                                         "does not require a gradient); give the optimizers the "
                                         "models' parameters" % type(o).__name__)
        self._params, self._param_names = params, names
        self._flat, self._views, self._count = _et.flatten_gradients(params)
        for o in self.optimizers:
            _et._materialize_optimizer_state(o, params)
        for p in params:
            p.grad = None
        self._rng = torch.get_rng_state().clone()
        self._extra_buf = torch.zeros(extra_state_bytes, dtype=torch.uint8)
        self._extra_len = 0
        name_of = dict(zip((id(p) for p in params), names))
        tensors = [(name_of[id(p)], p.data, False) for p in params]
        for i, m in enumerate(self.models):
            prefix = "model%d/" % i if multi else "model/"
            tensors += [(prefix + n, b, True) for n, b in m.named_buffers() if b is not None]
            tensors += [(prefix + n, p.data, False) for n, p in m.named_parameters()
                        if not p.requires_grad]
        self._opt_state = []
        for k, o in enumerate(self.optimizers):
            oname = "optimizer%d" % k if len(self.optimizers) > 1 else "optimizer"
            for g in o.param_groups:
                for p in g["params"]:
                    for key, value in sorted(o.state.get(p, {}).items()):
                        if value is None:
                            continue
                        if not torch.is_tensor(value):
                            raise ValueError("optimizer state '%s' of %s is a %s, not a tensor: "
                                             "edl carries tensor state only"
                                             % (key, name_of[id(p)], type(value).__name__))
                        tensors.append(("%s/%s/%s" % (oname, name_of[id(p)], key), value, False))
                        self._opt_state.append((o.state[p], key, value))
        tensors.append(("rng/torch_cpu", self._rng, True))
        tensors.append(("extra/state", self._extra_buf, False))
        for n, t, _ in tensors:
            if not t.is_contiguous():
                raise ValueError("state tensor %s is not contiguous" % n)
        self._tensors = tensors
        self._loop = edl.OwnLoop()
        self._loop.set_state([(n, t, t.data_ptr(), list(t.shape), str(t.dtype)[6:],
                               t.numel() * t.element_size(), per_rank)
                              for n, t, per_rank in tensors])
        self._loop.set_gradients(self._flat, self._flat.data_ptr(), self._count)
        self._loop.set_sizes(len(self.dataset),
                             len(self._eval_set) if self._eval_set is not None else 0)
        self._loop.set_fingerprint(self._fingerprint())
        self._registered = [([id(p) for p in m.parameters()], [id(b) for b in m.buffers()])
                            for m in self.models]
        self._ptrs = [(p, p.data_ptr(), p.shape) for p in params]
        self._checks = 0

    def _fingerprint(self):
        def layout(ts):
            text = ";".join("%s:%s:%s" % (n, str(t.dtype)[6:], list(t.shape)) for n, t, _ in ts)
            return hashlib.sha1(text.encode()).hexdigest()[:12]
        model_part = [t for t in self._tensors if t[0].startswith("model")]
        opt_part = [t for t in self._tensors if t[0].startswith("optimizer")]
        keys = sorted({n.rsplit("/", 1)[1] for n, _, _ in opt_part})
        return ("model %s [%d tensors, %d values, layout %s]; optimizer %s [state %s, %d tensors, "
                "layout %s]; own loop, extra state %d bytes, objects %s"
                % ("+".join(type(m).__name__ for m in self.models), len(model_part),
                   sum(t.numel() for _, t, _ in model_part), layout(model_part),
                   "+".join(type(o).__name__ for o in self.optimizers), ",".join(keys) or "none",
                   len(opt_part), layout(opt_part), self._extra_buf.numel(),
                   ",".join(n for n, _ in self._objects) or "none"))

    @property
    def fingerprint(self):
        return self._loop.fingerprint

    # ---- state that is not tensors: pickled into the registered extra/state tensor

    def _save_extras(self):
        blob = pickle.dumps({
            "objects": {n: o.state_dict() for n, o in self._objects},
            "groups": [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups]
                       for o in self.optimizers],
            "extra": self.extra,
        }, protocol=4)
        need = len(blob) + 8
        cap = self._extra_buf.numel()
        if need > cap:
            raise self._fatal("the state registered besides the tensors (state=..., job.extra, "
                              "the optimizers' hyper-parameters) pickles to %d bytes, more than "
                              "extra_state_bytes=%d; give edl.torch.Elastic a larger "
                              "extra_state_bytes" % (need, cap))
        buf = self._extra_buf.numpy()
        buf[:8] = np.frombuffer(np.int64(len(blob)).tobytes(), np.uint8)
        buf[8:need] = np.frombuffer(blob, np.uint8)
        if self._extra_len > need:
            buf[need:self._extra_len] = 0
        self._extra_len = need
        self._rng.copy_(torch.get_rng_state())

    def _load_extras(self):
        buf = self._extra_buf.numpy()
        n = int(np.frombuffer(buf[:8].tobytes(), np.int64)[0])
        torch.set_rng_state(self._rng)
        if n <= 0:
            return
        state = pickle.loads(buf[8:8 + n].tobytes())
        self._extra_len = n + 8
        objects = state.get("objects", {})
        for name, obj in self._objects:
            if name in objects:
                obj.load_state_dict(objects[name])
        for o, groups in zip(self.optimizers, state.get("groups", [])):
            for g, saved in zip(o.param_groups, groups):
                g.update(saved)
        self.extra.clear()
        self.extra.update(state.get("extra", {}))

    def _sync_from_runtime(self):
        """After a wait: what the runtime wrote into the registered state (a sync, a checkpoint
        load, a warm-up's restore) reaches the objects kept outside it."""
        writes = self._loop.state_writes
        if writes != self._writes_seen:
            self._writes_seen = writes
            self._load_extras()

    # ---- the protocol with the runtime thread

    def _where(self):
        r = self._req or {}
        return "rank %s of %s (trainer %s, generation %s), step %s" % (
            r.get("rank", "?"), r.get("world_size", "?"), self.info.get("trainer_id") or "-",
            r.get("generation", "?"), r.get("step", -1) + 1 if r else "?")

    def _fatal(self, message, cause=None):
        """Fails the job on this trainer: the runtime stops, this process should exit (non-zero),
        and the other trainers re-form without it. Returns the exception to raise."""
        text = "%s: %s" % (self._where(), message)
        if self._failed is None:
            self._failed = text
            _log("error: " + text)
            self._loop.abort("the training script failed: " + text)
            self._loop.join(60.0)
        err = edl.TrainingError(text)
        if cause is not None:
            err.__cause__ = cause
        return err

    def _check_alive(self):
        if self._failed is not None:
            raise edl.TrainingError("the job failed on this trainer earlier: " + self._failed)
        if not self._started:
            raise RuntimeError("call job.step() inside `for epoch in job.epochs(n):` and "
                               "`for batch in job.batches(loader):`")

    def _wait(self):
        """Parks until the runtime's next request for the loop (train, update or done), serving
        evaluations and warm-ups meanwhile."""
        try:
            while True:
                r = self._loop.wait()
                kind = r["kind"]
                if kind == "evaluate":
                    self._serve_eval(r)
                elif kind == "warm_up":
                    self._serve_warm_up(r)
                else:
                    break
        except KeyboardInterrupt:
            self._loop.abort("interrupted (SIGINT)")
            raise
        self._sync_from_runtime()
        if kind == "done":
            self._finish(r)
        return r

    def _default_warm_up(self, batch):
        """Without warm_up=: for (input, ...) batches of a single model, model(input) and a
        backward from its outputs (times zero: the kernels a step uses run, nothing is learnt)."""
        if len(self.models) != 1 or not isinstance(batch, (tuple, list)) or not batch or \
                not torch.is_tensor(batch[0]):
            raise TypeError("no warm_up function, and the batch is not (input, ...) of one model")
        out = self.models[0](batch[0])
        outs = [out] if torch.is_tensor(out) else list(out.values() if isinstance(out, dict)
                                                        else out)
        return sum(t.float().sum() for t in outs if torch.is_tensor(t) and t.requires_grad) * 0.0

    def _serve_warm_up(self, r):
        """A joiner's one forward and backward before it reports ready (the runtime then puts the
        state back): its first step in the job is then not its slowest."""
        t0 = time.monotonic()
        batch = self._load(r["indices"])
        modes = [m.training for m in self.models]
        for m in self.models:
            m.train()
        try:
            if self._warm_up_fn is not None:
                loss = self._warm_up_fn(batch)
            else:
                loss = self._default_warm_up(batch)
            if torch.is_tensor(loss) and loss.requires_grad:
                loss.backward()
            _log("joiner warm-up: %d samples in %.2f s"
                 % (len(r["indices"]), time.monotonic() - t0))
        except Exception as e:
            if self._warm_up_fn is not None:
                raise self._fatal("the warm_up function raised %s: %s" % (type(e).__name__, e), e)
            _log("joiner warm-up skipped (%s: %s); pass warm_up=fn(batch) -> loss"
                 % (type(e).__name__, e))
        finally:
            for m, mode in zip(self.models, modes):
                m.train(mode)
            for p in self._params:
                p.grad = None
        self._loop.answer(r["seq"])

    def _serve_eval(self, r):
        batch = self._load(r["indices"], self._eval_set)
        modes = [m.training for m in self.models]
        for m in self.models:
            m.eval()
        try:
            with torch.no_grad():
                loss_sum, correct = self._eval_fn(batch)
        except Exception as e:
            raise self._fatal("eval_fn raised %s: %s" % (type(e).__name__, e), e)
        finally:
            for m, mode in zip(self.models, modes):
                m.train(mode)
        self._loop.answer(r["seq"], float(loss_sum), int(correct), len(r["indices"]))

    def _finish(self, r):
        self._req, self._parts = None, []
        self.result = r
        self._loop.join(120.0)
        if not r["ok"]:
            raise self._fatal(r["error"])
        if r["left"]:
            self.left = True
            _log("left the job at generation %d after step %d (this trainer is not in the new "
                 "generation)" % (r["generation"], r["step"]))
            if self.exit_on_leave:
                raise SystemExit(0)
            return
        last = self._loop.last_step()
        if last is not None and last["rank"] == 0:
            ev = self._loop.last_eval()
            _log("finished at step %d, generation %d, world %d, last loss %.4f%s"
                 % (r["step"], r["generation"], last["world_size"], r["last_loss"],
                    "" if ev is None else ", eval accuracy %.2f%%" % (100 * ev["accuracy"])))

    def _new_request(self, r):
        """A "train" request: the step to train next (after a commit, a re-form or a discard)."""
        self._req = r
        self._parts = _split(r["indices"], self.accumulate)
        self._delivered = 0
        self._stepped = False
        self._labels_seen = []
        self._report()

    def _report(self):
        """Rank 0's progress line every log_every committed steps."""
        last = self._loop.last_step() if self.log_every > 0 else None
        if last is None or last["step"] % self.log_every != 0 or last["step"] == self._rate[1]:
            return
        now = time.monotonic()
        t0, step0 = self._rate
        if last["rank"] == 0:
            rate = ""
            if step0 > 0 and last["step"] > step0:
                rate = " steps/s %.2f" % ((last["step"] - step0) / max(1e-9, now - t0))
            _log("step %d epoch %.2f loss %.4f lr %s %.5g generation %d world %d%s"
                 % (last["step"], last["epochs_done"], last["loss"],
                    "" if self._lr_mode == "runtime" else "scale", last["lr"],
                    last["generation"], last["world_size"], rate))
        self._rate = (now, last["step"])

    def _commit(self):
        """Answers the applied step's update: the runtime commits it (and may re-form, evaluate,
        checkpoint), then hands over the next step, or ends."""
        self._save_extras()
        seq, self._update_seq = self._update_seq, None
        save, self._save_next = self._save_next, False
        self._loop.answer(seq, save=save)
        r = self._wait()
        if r["kind"] == "train":
            self._new_request(r)
        elif r["kind"] != "done":
            raise self._fatal("the runtime sent %r where a step was expected" % r["kind"])

    def _restore_snapshot(self):
        snap, self._snapshot = self._snapshot, None
        for (_, t, _), saved in zip(self._tensors, snap):
            t.copy_(saved)
        self._load_extras()

    def _step_ends_pass(self, req):
        """Whether the step `req` is the last of its epoch or of the run (as planned)."""
        e, c = self._plan.advance(req["epoch"], req["cursor"], req["batches"])
        if e != req["epoch"]:
            return True
        if self._plan.epoch_progress(e, c) >= self._epochs:
            return True
        return self._max_steps > 0 and req["step"] + 1 >= self._max_steps

    def _following(self, c, epoch):
        """The cursor after step `c` for the batch sampler's look-ahead (None past the epoch or
        the run)."""
        e, cur = self._plan.advance(c.epoch, c.cursor, c.batches)
        if e != epoch or self._plan.epoch_progress(e, cur) >= self._epochs:
            return None
        if self._max_steps > 0 and c.step + 1 >= self._max_steps:
            return None
        indices = self._plan.slice(e, cur, c.batches, c.rank)
        if len(indices) == 0:  # a short last step without samples here: the stand-in
            indices = next((s for s in self._plan.step(e, cur, c.batches) if len(s)), indices)
        return _Cursor(c.step + 1, e, cur, c.batches, c.rank, 0, _split(indices, self.accumulate))

    def _micro_batches_per_epoch(self):
        r = self._req
        if r is None:
            return 0
        total = sum(r["batches"])
        steps = -(-len(self.dataset) // max(1, total))
        return steps * len(self._parts or [None])

    def _before_batch(self):
        """Called before each batch job.batches() delivers. False when this epoch's pass is over
        (the update of its last step stays pending, so the loop's code after the pass still
        belongs to that step)."""
        self._check_alive()
        if self._snapshot is not None:
            self._restore_snapshot()
        if self._req is None:
            return False
        if self._delivered < len(self._parts):
            return True
        if not self._stepped:
            raise self._fatal(
                "the loop asked for the next batch, but job.step() was not called after the last "
                "batch of this step: call job.step(optimizer) once the step's backward is done%s"
                % ("" if self.accumulate == 1 else
                   " (with accumulate=%d: after every batch, or after the step's last one)"
                   % self.accumulate))
        if self._update_seq is None:  # discarded: the request is the next one already
            return True
        if self._step_ends_pass(self._req):
            return False
        self._commit()
        return self._req is not None

    # ---- the loop's side

    def batch_sampler(self):
        """The batch sampler to build your DataLoader with: DataLoader(dataset,
        batch_sampler=job.batch_sampler(), num_workers=..., collate_fn=...)."""
        return self._sampler

    def epochs(self, epochs):
        """Starts the runtime and yields the epoch of each pass the loop makes, from the job's
        data position (a joiner's or a resumed job's first one may be mid-epoch) until `epochs`
        epochs (fractional ones too) or max_steps steps are trained."""
        if self._started:
            raise RuntimeError("job.epochs() was called already: a job runs once")
        if not epochs > 0:
            raise ValueError("epochs must be > 0")
        self._started, self._epochs = True, float(epochs)
        self._options.epochs = float(epochs)
        _log("%s mode: %s; %s" % (self.info["mode"], _et._where(self.info), self.fingerprint))
        self._save_extras()
        self._writes_seen = self._loop.state_writes
        self._loop.start(self._options)
        r = self._wait()
        if r["kind"] == "train":
            self._new_request(r)
        elif r["kind"] != "done":
            raise self._fatal("the runtime sent %r where a step was expected" % r["kind"])
        while True:
            self._check_alive()
            if self._snapshot is not None:
                self._restore_snapshot()
            if self._req is None:
                return
            if 0 < self._delivered < len(self._parts) or (
                    self._delivered == len(self._parts) and not self._stepped):
                raise self._fatal(
                    "the pass over epoch %d ended in the middle of a step (%d of its %d batches "
                    "trained%s): iterate job.batches(...) to its end and call job.step() after "
                    "each step's last batch" % (
                        self._req["epoch"], self._delivered, len(self._parts),
                        "" if self._stepped else ", job.step() not called"))
            if self._update_seq is not None:
                self._commit()
                continue
            if self._req["seq"] == self._yielded_seq:
                raise self._fatal("an epoch's pass trained nothing: the body of `for epoch in "
                                  "job.epochs(...)` must iterate job.batches(loader)")
            self._yielded_seq = self._req["seq"]
            yield self._req["epoch"]

    def batches(self, loader=None):
        """The batches of the current epoch's pass, each the one the runtime planned for this
        trainer's step. `loader`: a DataLoader built with batch_sampler=job.batch_sampler() (its
        workers, collate_fn and pinning are yours); None loads from the dataset directly
        (a TensorDataset by indexing, others item by item through collate_fn)."""
        if self._req is None:
            raise RuntimeError("call job.batches() inside `for epoch in job.epochs(n):`")
        if loader is not None:
            sampler = getattr(loader, "batch_sampler", None)
            if sampler is not self._sampler:
                raise self._fatal(
                    "this DataLoader draws its own batches (its batch_sampler is %s), so it would "
                    "not load the samples the runtime planned for this trainer: build it with "
                    "DataLoader(dataset, batch_sampler=job.batch_sampler(), ...), without "
                    "batch_size, shuffle, sampler or drop_last" % type(sampler).__name__)
        return _Batches(self, loader)

    def no_sync(self):
        """Accepted for loops written for DDP (`with model.no_sync():` around the backward of all
        but the last micro-batch): here backward never communicates, job.step does."""
        return contextlib.nullcontext()

    def _load(self, indices, dataset=None):
        dataset = self.dataset if dataset is None else dataset
        if isinstance(dataset, TensorDataset):
            index = torch.from_numpy(np.ascontiguousarray(indices))
            return tuple(t[index] for t in dataset.tensors)
        return self._collate([dataset[int(i)] for i in indices])

    def _check_batch(self, batch, indices):
        if self._check_size:
            n = _leading_dim(batch)
            if n is not None and n != len(indices):
                raise self._fatal(
                    "the batch has %d samples, but the runtime gave this trainer %d indices for "
                    "it: the dataset or the collate_fn dropped or added samples, so this "
                    "trainer's gradient would be weighted wrong against the others'. Make "
                    "collate_fn return one sample per index (pass check_batch_size=False if "
                    "your batches are laid out otherwise, e.g. packed sequences)"
                    % (n, len(indices)))
        if self._labels_fn is not None:
            labels = self._labels_fn(batch)
            self._labels_seen.append(torch.as_tensor(labels).reshape(-1).to(torch.int32))

    def _check_registration(self):
        """Every step: each parameter keeps its storage (the runtime reads and writes it). Every
        16th step (a module walk costs ~0.3 ms for a ResNet-20): no parameter or buffer was
        added, removed or replaced."""
        self._checks += 1
        if self._checks % 16 == 1:
            self._check_structure()
        for p, ptr, shape in self._ptrs:
            if p.data_ptr() != ptr or p.shape != shape:
                raise self._fatal(
                    "a parameter of shape %s got new storage after edl.torch.Elastic registered it "
                    "(p.data = ... or a resize): change parameters in place (p.data.copy_(...), "
                    "with torch.no_grad(): p.mul_(...))" % (list(shape),))

    def _check_structure(self):
        for m, (pids, bids) in zip(self.models, self._registered):
            if [id(p) for p in m.parameters()] != pids or [id(b) for b in m.buffers()] != bids:
                raise self._fatal(
                    "%s changed after edl.torch.Elastic registered it (a parameter or buffer was "
                    "added, removed or replaced): the runtime syncs and checkpoints the tensors "
                    "it registered. Build the model completely before creating the job"
                    % type(m).__name__)

    def step(self, *optimizers, scaler=None, before_update=None, loss=None):
        """Ends the step whose batches the loop trained: all-reduces the gradients (each trainer's
        weighted by its share of the step's samples), runs `before_update` (a callable or a list:
        gradient clipping sees the global gradient), steps `optimizers` (default: all registered;
        through `scaler`, a GradScaler: unscale_, step, update) and returns True. The runtime
        commits the step when the loop asks for its next batch. Returns False without stepping when
        the step was discarded (a failure re-formed the job: the loop's code up to its next batch
        is undone, and the step is trained again), and, with accumulate=k, after all but the last
        micro-batch of a step. `loss`: the step's mean loss, for the progress reports."""
        self._check_alive()
        req = self._req
        if req is None or self._delivered == 0:
            raise self._fatal("job.step() before any batch of this step: call it after the "
                              "backward of the batches job.batches(...) yields")
        if self._stepped:
            raise self._fatal("job.step() was called twice for one step: call it once per step, "
                              "after its last batch's backward")
        if self._delivered < len(self._parts):
            return False  # accumulating: the gradients add up in .grad until the last micro-batch
        opts = list(optimizers) or self.optimizers
        for o in opts:
            if not any(o is r for r in self.optimizers):
                raise self._fatal("job.step() got a %s that was not registered with "
                                  "edl.torch.Elastic(...): its state would be neither synced nor "
                                  "checkpointed" % type(o).__name__)
        self._stepped = True
        self._check_registration()
        stand_in = req["stand_in"]
        samples = 0 if stand_in else len(req["indices"])
        if not stand_in:
            grads, missing = [], []
            for p, view, name in zip(self._params, self._views, self._param_names):
                g = p.grad
                if g is None:
                    if not self._allow_unused:
                        missing.append(name)
                    g = torch.zeros_like(view)
                grads.append(g.reshape(-1))
            if missing:
                self._check_structure()  # a replaced layer is the likelier cause: say so
                raise self._fatal(
                    "%s ha%s no gradient at job.step(): %s no part in this step's loss. Every "
                    "trainer all-reduces every registered parameter's gradient, so either freeze "
                    "such parameters (p.requires_grad_(False)) before creating the job, or pass "
                    "allow_unused=True to count their gradient as zero"
                    % (", ".join(missing[:5]) + (" and %d more" % (len(missing) - 5)
                                                 if len(missing) > 5 else ""),
                       "s" if len(missing) == 1 else "ve",
                       "it took" if len(missing) == 1 else "they took"))
            torch.cat(grads, out=self._flat[:self._count])
            bad_loss = loss is not None and not math.isfinite(float(loss))
            if scaler is None and (bad_loss or not self._gradients_finite()):
                bad = "a loss of %s" % float(loss) if loss is not None else "a non-finite gradient"
                raise self._fatal(
                    "%s on this trainer's samples (before the all-reduce, so the other trainers' "
                    "state is intact): its step is not applied and this trainer leaves the job, "
                    "which goes on without it. Fix: lower the learning rate, clip gradients "
                    "(before_update=...), check these samples (indices %s...), or pass a "
                    "GradScaler (scaler=...), which skips such steps on every trainer"
                    % (bad, req["indices"][:8].tolist()))
        for p in self._params:
            p.grad = None
        loss_sum = float(loss) * samples if loss is not None else 0.0
        label_hash = 0
        if self._labels_seen and not stand_in:
            label_hash = edl.label_hash(torch.cat(self._labels_seen).numpy())
        self._loop.answer(req["seq"], loss_sum, 0, samples, label_hash)
        r = self._wait()
        if r["kind"] == "done":
            return False
        if r["kind"] == "train":
            # The all-reduce failed (a peer died): the runtime re-formed and synced the state, and
            # asks for the step again (or the next one, if another trainer committed this one).
            self._snapshot = [t.clone() for _, t, _ in self._tensors]
            self._new_request(r)
            return False
        self._update_seq = r["seq"]
        lr = r["lr"]
        self._lr_scale = lr / self._base_lr if self._lr_mode == "runtime" else lr
        for p, view in zip(self._params, self._views):
            p.grad = view
        saved = [[g["lr"] for g in o.param_groups] for o in self.optimizers]
        if self._lr_mode == "runtime":
            for o, base in zip(self.optimizers, self._group_lr0):
                for g, g0 in zip(o.param_groups, base):
                    g["lr"] = g0 * self._lr_scale
        elif self._lr_mode == "scaled":
            for o in self.optimizers:
                for g in o.param_groups:
                    g["lr"] = g["lr"] * self._lr_scale
        try:
            hooks = before_update if isinstance(before_update, (list, tuple)) else \
                ([before_update] if before_update is not None else [])
            where = "scaler.unscale_()"
            if scaler is not None:
                for o in opts:
                    scaler.unscale_(o)
            where = "a before_update hook"
            for h in hooks:
                h()
            where = "the optimizer step"
            for o in opts:
                if scaler is not None:
                    scaler.step(o)
                else:
                    o.step()
            if scaler is not None:
                where = "scaler.update()"
                scaler.update()
        except Exception as e:
            raise self._fatal("%s raised %s during job.step(): %s. This trainer leaves the job, "
                              "which goes on without it; fix the code that raised"
                              % (where, type(e).__name__, e), e)
        finally:
            if self._lr_mode == "scaled":
                for o, lrs in zip(self.optimizers, saved):
                    for g, v in zip(o.param_groups, lrs):
                        g["lr"] = v
        for state, key, tensor in self._opt_state:
            if state.get(key) is not tensor:
                raise self._fatal("the optimizer replaced its state tensor '%s' instead of "
                                  "updating it in place; edl.torch needs in-place optimizer state"
                                  % key)
        for p in self._params:
            p.grad = None
        return True

    def _gradients_finite(self):
        """Whether the flat gradient holds no NaN or inf: a sum propagates them (~0.03 ms for a
        ResNet-20's gradient, where torch.isfinite(...).all() takes over 1 ms); only a sum that
        overflowed from finite values needs the element-wise check."""
        g = self._flat[:self._count]
        return math.isfinite(float(g.sum())) or bool(torch.isfinite(g).all())

    def save(self):
        """Rank 0 checkpoints the job right after the current step is committed (the runtime
        also checkpoints every checkpoint_steps / checkpoint_secs)."""
        if not self._checkpoint_dir:
            raise ValueError("job.save() needs a checkpoint store: edl.torch.Elastic(..., "
                             "checkpoint_dir=...)")
        self._save_next = True

    # ---- what the loop may read

    @property
    def rank(self):
        """This trainer's rank in the current generation (of the step being trained)."""
        return self._req["rank"] if self._req else (self._loop.last_step() or {}).get("rank", 0)

    @property
    def world_size(self):
        if self._req:
            return self._req["world_size"]
        return (self._loop.last_step() or {}).get("world_size", 1)

    @property
    def generation(self):
        return self._req["generation"] if self._req else 0

    @property
    def steps_done(self):
        """Steps the job committed before the one being trained."""
        if self._req:
            return self._req["step"]
        return self.result["step"] if self.result else 0

    @property
    def micro_batches(self):
        """How many micro-batches the step being trained has (accumulate, or fewer in a short last
        step of an epoch)."""
        return len(self._parts)

    @property
    def micro_weight(self):
        """The share of the step's samples in the batch job.batches() delivered last: scale its
        loss by it, `(loss * job.micro_weight).backward()`, and the accumulated gradient is that of
        the mean over the whole step (1.0 without accumulation)."""
        if not self._parts or self._delivered == 0:
            return 1.0
        return len(self._parts[self._delivered - 1]) / sum(len(p) for p in self._parts)

    @property
    def lr_scale(self):
        """The runtime's linear-scaling factor of the last applied step: global batch /
        base_batch (1 without base_batch), with the ramp after a re-form; under
        lr_mode="runtime", the runtime's rate over lr."""
        return self._lr_scale

    @property
    def epoch_progress(self):
        """Fractional epochs the job completed before the step being trained."""
        r = self._req
        if r is None:
            return self._epochs
        return self._plan.epoch_progress(r["epoch"], r["cursor"])

    @property
    def last_step(self):
        """The last committed step as the whole job saw it (loss, lr, world size...), or None."""
        return self._loop.last_step()

    @property
    def last_eval(self):
        return self._loop.last_eval()

    def _at_exit(self):
        """At interpreter exit: a job still running here ends (the others re-form without this
        trainer). A script that raised exits 1 already; one that left the loop early is made to."""
        if os.getpid() != self._pid or not self._started:
            return
        if self.result is not None or self._failed is not None:
            self._loop.join(60.0)
            return
        exc = getattr(sys, "last_value", None)
        if exc is not None:
            self._loop.abort("the training script raised %s: %s" % (type(exc).__name__, exc))
            self._loop.join(60.0)
            return
        _log("error: %s: the script ended before the job did (it left `for epoch in "
             "job.epochs(...)` early); this trainer leaves as failed" % self._where())
        self._loop.abort("the training script ended before the job finished")
        self._loop.join(60.0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
