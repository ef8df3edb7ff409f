#!/usr/bin/python3
"""The restart-all reference of bench/rescale.sh: examples/pytorch/train_ddp.py (ResNet-20, the
same data subset, global batch and threads as the EDL run) under Debian's own torchrun
(`python3 -m torch.distributed.run`, c10d rendezvous, one agent with 4 workers, --nnodes 1:4,
its last-call wait lowered to --last_call_s),
checkpointing every --checkpoint_every steps. Once the workers of a start have trained --warm_steps
steps, it SIGKILLs one worker (rank 1, by the pid of its "start" metrics line); torchrun notices,
stops every worker and restarts them all, which resume from the checkpoint. Repeated --kills times.

Stall of a restart: from rank 0's last logged step of start r to its first logged step of start
r+1 (the metrics file's "step" lines carry the wall time). Writes one JSON object to --out:
{"stalls": [...], "steady_step_s": median gap between consecutive steps of one start,
 "start_to_first_step_s": [...] (a worker's "start" line to the first step of that start),
 "monitor_interval_s": ..., "torch": version}. Exits 1 with the reason if a phase times out.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def metrics(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
    except FileNotFoundError:
        pass
    return out


def wait_for(pred, timeout_s, what, proc):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        if proc.poll() is not None:
            sys.exit("torchrun exited (%s) while waiting for %s" % (proc.returncode, what))
        time.sleep(0.05)
    sys.exit("timed out after %d s waiting for %s" % (timeout_s, what))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="directory for logs, checkpoint and metrics")
    p.add_argument("--out", required=True)
    p.add_argument("--script", required=True, help="examples/pytorch/train_ddp.py")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--warm_steps", type=int, default=15, help="steps of a start before a kill")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--monitor_interval", type=float, default=0,
                   help="torchrun --monitor_interval (0: torchrun's default)")
    p.add_argument("--last_call_s", type=float, default=1,
                   help="c10d rendezvous last_call_timeout: how long a (re)start with fewer than "
                        "--nnodes' maximum of 4 agents waits for more (torchrun's default, 30 s, "
                        "would add 30 s to every restart here: the default keeps the reference low)")
    p.add_argument("--timeout_s", type=float, default=300, help="bound on each phase")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train_ddp.py's flags")
    a = p.parse_args()
    import torch  # only for its version; the workers import it themselves
    os.makedirs(a.work + "/logs", exist_ok=True)
    mpath = a.work + "/metrics.jsonl"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:4", "--nproc_per_node",
           str(a.workers), "--max_restarts", str(a.kills + 2), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id", "edl-bench",
           "--rdzv_conf", "last_call_timeout=%g" % a.last_call_s,
           # Debian's torch 1.13 on Python 3.11 fails at launch without non-zero single values.
           "--redirects", "1", "--tee", "1", "--log_dir", a.work + "/logs"]
    if a.monitor_interval > 0:
        cmd += ["--monitor_interval", str(a.monitor_interval)]
    train = [x for x in a.train_args if x != "--"]
    cmd += [a.script, "--metrics_file", mpath, "--checkpoint_dir", a.work + "/ckpt",
            "--log_every", "1"] + train
    log = open(a.work + "/torchrun.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for r in range(a.kills):
            def warmed():
                return sum(1 for m in metrics(mpath)
                           if m.get("event") == "step" and m.get("restart_count") == r) >= a.warm_steps
            wait_for(warmed, a.timeout_s, "%d steps of start %d" % (a.warm_steps, r), proc)
            victim = [m["pid"] for m in metrics(mpath)
                      if m.get("event") == "start" and m.get("restart_count") == r and m.get("rank") == 1]
            if not victim:
                sys.exit("no start line of rank 1 in start %d" % r)
            os.kill(victim[-1], signal.SIGKILL)
            wait_for(lambda: any(m.get("event") == "step" and m.get("restart_count") == r + 1
                                 for m in metrics(mpath)),
                     a.timeout_s, "the first step after restart %d" % (r + 1), proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    ms = metrics(mpath)
    steps = [m for m in ms if m.get("event") == "step" and "time" in m]
    by_start = {}
    for m in steps:
        by_start.setdefault(m["restart_count"], []).append(m["time"])
    stalls, gaps, start_to_step = [], [], []
    for r in sorted(by_start):
        t = sorted(by_start[r])
        gaps += [b - a_ for a_, b in zip(t, t[1:])]
        if r + 1 in by_start:
            stalls.append(min(by_start[r + 1]) - max(t))
        starts = [m["wall_time"] for m in ms
                  if m.get("event") == "start" and m.get("restart_count") == r and "wall_time" in m]
        if starts and r > 0:
            start_to_step.append(min(t) - min(starts))
    json.dump({"stalls": stalls, "steady_step_s": statistics.median(gaps) if gaps else None,
               "start_to_first_step_s": start_to_step,
               "monitor_interval_s": a.monitor_interval or "default", "last_call_s": a.last_call_s,
               "torch": torch.__version__},
              open(a.out, "w"))


if __name__ == "__main__":
    main()
