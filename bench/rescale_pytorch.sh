#!/usr/bin/env bash
# The PyTorch rows of the rescale benchmark (bench/rescale.sh's sibling), all in one run, CPU / Gloo,
# loopback, Debian's python3-torch:
#   1. in place: examples/pytorch/train_inplace.py (edl.torch over the C++ runtime) under a real
#      `edl server` + two `edl client`s (2 slots each), a scaling script cycling shrink (4->3), grow
#      (3->4) and failure (kill 1, then grow back) CYCLES times; each survivor's `stall` event
#      (end of its last step before the change to the end of its first step after) by kind, in
#      seconds and in steady steps (median gap between consecutive steps of one generation);
#   2. restart mode: examples/pytorch/train_ddp.py (plain DDP) under the same server and clients
#      in `--mode restart`, the same script RESTART_CYCLES times; its stall is rank 0's last step
#      before a change to its first step after (from train_ddp.py's metrics), by the kind of the
#      generation that change made;
#   3. torchrun restart-all: bench/torchrun_restart.py (train_ddp.py under Debian's torchrun, a
#      worker SIGKILLed TORCHRUN_KILLS times), as in bench/rescale.sh;
#   4. steady throughput: train_inplace.py vs train_ddp.py, each under `edl launch -n 4` (a fixed
#      world: the runtime's loop against DDP's), same model, global batch (4 x 16), threads (1)
#      and data, STEADY_RUNS runs of each, interleaved, median; images/s from step 10 to the last
#      (train_ddp.py logs, and all-reduces its loss for the log, every 10th step);
#   5. the own-loop API: examples/pytorch/resnet20_elastic.py (the script's loop and DataLoader,
#      OWN_WORKERS worker processes, edl.torch.Elastic) through the same cycles as 1, its
#      survivors' stalls in steady steps;
#   6. own-loop steady throughput: resnet20_elastic.py vs bench/resnet20_ddp_loop.py (the same
#      loop and DataLoader under DDP with a DistributedSampler), each under `edl launch -n 4`, 16
#      per trainer and step, STEADY_RUNS runs of each, interleaved, median images/s from step 10.
# Targets: shrink and grow <= 2 steady steps, failure <= 3, each >= 20x shorter than
# torchrun's; steady images/s >= 0.97 of DDP; the own loop: shrink <= 1.2, grow <= 1.5,
# failure <= 2.5 steady steps, steady images/s >= 0.97 of DDP with the same loop. The machine's
# load average is printed at the start and the end. Takes ~20 min with the defaults on 2 cores
# (loaded). Knobs: CYCLES, RESTART_CYCLES, TORCHRUN_KILLS, STEADY_RUNS, STEADY_STEPS, OWN_WORKERS,
# PARTS (a subset of "inplace restart torchrun steady ownloop ownloop_steady").
# Usage: bench/rescale_pytorch.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
EDL=$(realpath "$BUILD/edl")
PY=/usr/bin/python3
export PYTHONPATH; PYTHONPATH=$(realpath "$BUILD/python")
CYCLES=${CYCLES:-5}
RESTART_CYCLES=${RESTART_CYCLES:-2}
TORCHRUN_KILLS=${TORCHRUN_KILLS:-3}
STEADY_RUNS=${STEADY_RUNS:-3}
STEADY_STEPS=${STEADY_STEPS:-100}
OWN_WORKERS=${OWN_WORKERS:-1}  # DataLoader worker processes of the own loop's stall run (5.)
PARTS=${PARTS:-"inplace restart torchrun steady ownloop ownloop_steady"}  # which of 1-6 (others: nan)
part() { [[ " $PARTS " == *" $1 "* ]]; }
HERE=$(realpath "$(dirname "$0")")
EX="$HERE/../examples/pytorch"
COMMON=(--train_samples 2048 --lr_decay constant --threads 1 --test_samples 0)
INPLACE=("$PY" "$EX/train_inplace.py" "${COMMON[@]}" --batch_size 16 --log_every 0 --workers 1)
DDP=("$PY" "$EX/train_ddp.py" "${COMMON[@]}" --batch_size 64)  # + --log_every: 1 (stalls), 10
OWN_COMMON=(--train_samples 2048 --lr_decay constant --threads 1 --batch_size 16 --log_every 0)
OWN=("$PY" "$EX/resnet20_elastic.py" "${OWN_COMMON[@]}")
OWN_DDP=("$PY" "$HERE/resnet20_ddp_loop.py" "${OWN_COMMON[@]}" --workers 0)
"$PY" -c 'import torch, edl.torch' || { echo "needs python3-torch and the edl module in $PYTHONPATH" >&2; exit 1; }
WORK=$(mktemp -d /tmp/edl-rescale-pytorch-XXXXXX)
PIDS=()
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores" >&2; }
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM -- "-$p" 2>/dev/null || true; done; sleep 1;
            for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
head -c 32 /dev/urandom | base64 > "$WORK/secret"; chmod 600 "$WORK/secret"

# Runs one job under a server and two clients until the events log holds STOP_GENS generation
# records and the file $4 has a line matching $5 (with "@" replaced by that number and "%" by one
# less: a step of the last generation), or STOP_AFTER_S passed; then stops all of it by pid.
run_job() {  # $1 name, $2 client mode, $3 script, $4 step file, $5 pattern, then the trainer command
  local name=$1 mode=$2 script=$3 steps=$4 pattern=${5//@/$STOP_GENS}; shift 5
  export EDL_SAMPLE_LOG="$WORK/$name/samples.jsonl"  # read by edl.torch.Elastic (own loop)
  pattern=${pattern//%/$((STOP_GENS - 1))}
  local d="$WORK/$name"; mkdir -p "$d"; printf "%b" "$script" > "$d/scale.script"
  setsid "$EDL" server --server_port 0 --bind 127.0.0.1 --port_file "$d/port" --secret_file "$WORK/secret" \
    --job_id bench --min_trainers 1 --trainers 4 --scale_script "$d/scale.script" \
    --events_dir "$d/events" --join_timeout_s 120 --backoff_min_s 1 --backoff_max_s 1 \
    > "$d/server.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do [ -s "$d/port" ] && break; sleep 0.1; done
  local port; port=$(cat "$d/port")
  for n in n1 n2; do
    setsid "$EDL" client --server "127.0.0.1:$port" --secret_file "$WORK/secret" --node_name $n --slots 2 \
      --mode "$mode" --socket_path "$d/$n.sock" --log_dir "$d/logs" --leave_grace_s 60 --stop_grace_s 2 \
      --trainer_timeout_s 30 -- "$@" > "$d/$n.log" 2>&1 & PIDS+=($!)
  done
  local ev="$d/events/bench.events.jsonl" deadline=$((SECONDS + STOP_AFTER_S)) n
  while [ $SECONDS -lt $deadline ]; do
    n=$(grep -c '"type":"generation"' "$ev" 2>/dev/null || true)
    [ "${n:-0}" -ge "$STOP_GENS" ] && grep -q "$pattern" "$steps" 2>/dev/null && break
    sleep 0.5
  done
  cleanup; PIDS=()
}

# A cycle is 30 s: each joiner imports torch and loads the data before it is ready (~5-10 s here).
cycles() {
  local s="" t=10
  for _ in $(seq "$1"); do s+="$t set 3\n"; t=$((t + 8)); s+="$t set 4\n"; t=$((t + 10)); s+="$t kill 1\n"; t=$((t + 12)); done
  echo "$s"; echo "$t" > "$WORK/script_end"
}
load
if part inplace; then
script=$(cycles "$CYCLES")
echo "in place: $CYCLES cycles, ~$(cat "$WORK/script_end") s" >&2
STOP_GENS=$((1 + 4 * CYCLES)) STOP_AFTER_S=$(($(cat "$WORK/script_end") + 120)) \
  run_job inplace inplace "0 set 4\n$script" "$WORK/inplace/samples.jsonl" '"generation":@,' \
  "${INPLACE[@]}" --epochs 1000 --sample_log "$WORK/inplace/samples.jsonl"

fi

if part restart; then
script=$(cycles "$RESTART_CYCLES")
echo "restart mode: $RESTART_CYCLES cycles, ~$(cat "$WORK/script_end") s" >&2
STOP_GENS=$((1 + 4 * RESTART_CYCLES)) STOP_AFTER_S=$(($(cat "$WORK/script_end") + 120)) \
  run_job restart restart "0 set 4\n$script" "$WORK/restart/metrics.jsonl" '"restart_count": %,' \
  "${DDP[@]}" --log_every 1 --steps 100000 --checkpoint_dir "$WORK/restart/ckpt" \
  --checkpoint_every 5 --metrics_file "$WORK/restart/metrics.jsonl" --peer_failure_wait_s 60
fi

if part torchrun && [ "$TORCHRUN_KILLS" -gt 0 ]; then
  echo "torchrun restart-all reference: $TORCHRUN_KILLS kills" >&2
  mkdir -p "$WORK/torchrun"
  "$PY" "$HERE/torchrun_restart.py" --work "$WORK/torchrun" --out "$WORK/torchrun/result.json" \
    --script "$EX/train_ddp.py" --kills "$TORCHRUN_KILLS" -- "${COMMON[@]}" --batch_size 64 \
    --steps 100000 --checkpoint_every 5 \
    || echo "torchrun reference failed: $(tail -5 "$WORK/torchrun/torchrun.log" 2>/dev/null)" >&2
fi

if part ownloop; then
script=$(cycles "$CYCLES")
echo "own loop: $CYCLES cycles, ~$(cat "$WORK/script_end") s" >&2
STOP_GENS=$((1 + 4 * CYCLES)) STOP_AFTER_S=$(($(cat "$WORK/script_end") + 120)) \
  run_job ownloop inplace "0 set 4\n$script" "$WORK/ownloop/samples.jsonl" '"generation":@,' \
  "${OWN[@]}" --epochs 1000 --workers "$OWN_WORKERS"
fi

if part ownloop_steady; then
echo "own-loop steady: $STEADY_RUNS x (resnet20_elastic.py, resnet20_ddp_loop.py) under edl launch -n 4, $STEADY_STEPS steps" >&2
for i in $(seq "$STEADY_RUNS"); do
  for side in own ddp; do
    d="$WORK/ownsteady-$side$i"; mkdir -p "$d"
    if [ $side = own ]; then
      # --epochs: STEADY_STEPS steps of 4 x 16 out of 2048 samples
      cmd=(env EDL_SAMPLE_LOG="$d/samples.jsonl" "${OWN[@]}" --workers 0
           --epochs "$(echo "$STEADY_STEPS * 64 / 2048" | bc -l)")
    else
      cmd=("${OWN_DDP[@]}" --steps "$STEADY_STEPS" --metrics_file "$d/metrics.jsonl")
    fi
    setsid "$EDL" launch -n 4 --log_dir "$d/logs" -- "${cmd[@]}" > "$d/launch.log" 2>&1 & PIDS+=($!)
    wait "${PIDS[-1]}" || echo "own-loop $side run $i failed: $(tail -3 "$d/launch.log")" >&2
    PIDS=()
  done
done
fi

if part steady; then
echo "steady: $STEADY_RUNS x (train_inplace.py, train_ddp.py) under edl launch -n 4, $STEADY_STEPS steps" >&2
for i in $(seq "$STEADY_RUNS"); do
  for side in inplace ddp; do
    d="$WORK/steady-$side$i"; mkdir -p "$d"
    if [ $side = inplace ]; then
      cmd=("${INPLACE[@]}" --steps "$STEADY_STEPS" --sample_log "$d/samples.jsonl")
    else
      cmd=("${DDP[@]}" --log_every 10 --steps "$STEADY_STEPS" --metrics_file "$d/metrics.jsonl")
    fi
    # Each trainer's CPU seconds (user + system, start-up included) from bash's `times`.
    setsid "$EDL" launch -n 4 --log_dir "$d/logs" -- bash -c \
      'rc=0; "$@" || rc=$?; times > "$0/cpu.$$"; exit $rc' "$d" "${cmd[@]}" \
      > "$d/launch.log" 2>&1 & PIDS+=($!)
    wait "${PIDS[-1]}" || echo "$side run $i failed: $(tail -3 "$d/launch.log")" >&2
    PIDS=()
  done
done
fi
load

"$PY" - "$WORK" "$STEADY_STEPS" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
def lines(p):
    out = []
    try:
        for l in open(p):
            try: out.append(json.loads(l))
            except ValueError: pass
    except FileNotFoundError: pass
    return out
def med(v): return statistics.median(v) if v else float("nan")
def kind_of(g): return "failure" if g.get("failure") else ("shrink" if g["world_size_after"] < g["world_size_before"] else "grow")

# 1. in place: the survivors' stall events; the steady step from the sample log.
ev = lines(f"{work}/inplace/events/bench.events.jsonl")
stalls = {"shrink": [], "grow": [], "failure": []}
for e in ev:
    if e.get("type") == "trainer_event" and e.get("event") == "stall":
        k = "failure" if e["failure"] else ("shrink" if e["world_after"] < e["world_before"] else "grow")
        stalls[k].append(e["stall_s"])
steps = {}
for s in lines(f"{work}/inplace/samples.jsonl"):
    steps.setdefault(s["step"], (s["time"], s["generation"]))
seq = sorted(steps.items())
gaps = [b[1][0] - a[1][0] for a, b in zip(seq, seq[1:]) if a[1][1] == b[1][1] and b[0] == a[0] + 1]
step_s = med(gaps)
print(f"# in place: steady step {step_s:.4f} s ({len(gaps)} steps); stalls per kind: "
      + ", ".join(f"{k} {len(v)}" for k, v in stalls.items()))

# 2. restart mode: rank 0's steps by restart count (= generation - 1 under a client).
rev = lines(f"{work}/restart/events/bench.events.jsonl")
gens = {e["generation"]: e for e in rev if e.get("type") == "generation"}
by_start = {}
for m in lines(f"{work}/restart/metrics.jsonl"):
    if m.get("event") == "step":
        by_start.setdefault(m["restart_count"], []).append(m["time"])
restart = {"shrink": [], "grow": [], "failure": []}
starts = sorted(by_start)
for a, b in zip(starts, starts[1:]):
    # The change after start a: the first generation after a's (its kind), whatever came next.
    g = gens.get(a + 2)
    if g is None: continue
    restart[kind_of(g)].append(min(by_start[b]) - max(by_start[a]))
rgaps = [y - x for t in by_start.values() for x, y in zip(sorted(t), sorted(t)[1:])]
print(f"# restart mode (train_ddp.py): steady step {med(rgaps):.4f} s; stalls "
      + ", ".join(f"{k} {[round(x, 2) for x in v]}" for k, v in restart.items()))

# 3. torchrun
try:
    tr = json.load(open(f"{work}/torchrun/result.json"))
except (FileNotFoundError, ValueError):
    tr = {"stalls": []}
tref = med(tr["stalls"])
if tr["stalls"]:
    print(f"# torchrun {tr['torch']} restart-all stalls {[round(x, 2) for x in tr['stalls']]} s, median {tref:.2f} s")

targets = {"shrink": 2, "grow": 2, "failure": 3}
for k in ("shrink", "grow", "failure"):
    m = med(stalls[k])
    print(f"# {k}: {len(stalls[k])} survivor stalls, median {m:.3f} s = {m / step_s:.2f} steady steps "
          f"(target <= {targets[k]}), max {max(stalls[k]) if stalls[k] else float('nan'):.3f} s")
    print(f"RESULT pytorch_stall_{k}_steps ours={m / step_s:.2f}steps ref={targets[k]}steps ratio={targets[k] * step_s / m:.2f}")
    r = med(restart[k])
    print(f"RESULT pytorch_stall_{k}_vs_restart_mode_s ours={m:.3f}s ref={r:.3f}s ratio={r / m:.1f}")
    print(f"RESULT pytorch_stall_{k}_vs_torchrun_s ours={m:.3f}s ref={tref:.3f}s ratio={tref / m:.1f} (target >= 20)")

# 4. steady images/s from step 10 to the last (global batch 64): DDP logs (and reduces its loss)
# every 10th step only, as a DDP program would, so both sides are timed at those steps.
def rate(times):
    if 10 not in times or max(times) <= 10: return float("nan")
    last = max(times)
    return (last - 10) * 64 / (times[last] - times[10])
ours, ref = [], []
for d in sorted(glob.glob(f"{work}/steady-inplace*")):
    t = {}
    for s in lines(f"{d}/samples.jsonl"):
        t[s["step"]] = min(t.get(s["step"], s["time"]), s["time"])
    ours.append(rate(t))
for d in sorted(glob.glob(f"{work}/steady-ddp*")):
    t = {m["step"]: m["time"] for m in lines(f"{d}/metrics.jsonl") if m.get("event") == "step"}
    ref.append(rate(t))
print(f"# steady images/s: in place {[round(x, 1) for x in ours]}, DDP {[round(x, 1) for x in ref]}")
# CPU seconds per 1000 images, all 4 trainers, start-up included: robust to a busy machine.
def cpu_per_kimg(d, steps):
    total = 0.0
    for f in glob.glob(f"{d}/cpu.*"):
        for field in open(f).read().splitlines()[-1].split():  # children: "1m2.345s 0m0.456s"
            m, sec = field.rstrip("s").split("m")
            total += 60 * float(m) + float(sec)
    return 1000 * total / (steps * 64) if total else float("nan")
steps_run = int(sys.argv[2])
cpu_ours = [cpu_per_kimg(d, steps_run) for d in sorted(glob.glob(f"{work}/steady-inplace*"))]
cpu_ref = [cpu_per_kimg(d, steps_run) for d in sorted(glob.glob(f"{work}/steady-ddp*"))]
print(f"# CPU s per 1000 images: in place {[round(x, 2) for x in cpu_ours]}, DDP {[round(x, 2) for x in cpu_ref]}")
print(f"RESULT pytorch_steady_cpu_s_per_kimg ours={med(cpu_ours):.3f}s ref={med(cpu_ref):.3f}s "
      f"ratio={med(cpu_ref) / med(cpu_ours):.3f}")
print(f"RESULT pytorch_steady_images_per_s ours={med(ours):.1f}img/s ref={med(ref):.1f}img/s "
      f"ratio={med(ours) / med(ref):.3f} (target >= 0.97)")

# 5. the own loop: the survivors' stall events; the steady step from its sample log.
oev = lines(f"{work}/ownloop/events/bench.events.jsonl")
ostalls = {"shrink": [], "grow": [], "failure": []}
for e in oev:
    if e.get("type") == "trainer_event" and e.get("event") == "stall":
        k = "failure" if e["failure"] else ("shrink" if e["world_after"] < e["world_before"] else "grow")
        ostalls[k].append(e["stall_s"])
osteps = {}
for s in lines(f"{work}/ownloop/samples.jsonl"):
    osteps.setdefault(s["step"], (s["time"], s["generation"]))
oseq = sorted(osteps.items())
ogaps = [b[1][0] - a[1][0] for a, b in zip(oseq, oseq[1:]) if a[1][1] == b[1][1] and b[0] == a[0] + 1]
ostep_s = med(ogaps)
print(f"# own loop: steady step {ostep_s:.4f} s ({len(ogaps)} steps); stalls per kind: "
      + ", ".join(f"{k} {len(v)}" for k, v in ostalls.items()))
otargets = {"shrink": 1.2, "grow": 1.5, "failure": 2.5}
for k in ("shrink", "grow", "failure"):
    m = med(ostalls[k])
    print(f"# own loop {k}: {len(ostalls[k])} survivor stalls, median {m:.3f} s = {m / ostep_s:.2f} "
          f"steady steps (target <= {otargets[k]}), max {max(ostalls[k]) if ostalls[k] else float('nan'):.3f} s")
    print(f"RESULT pytorch_own_loop_stall_{k}_steps ours={m / ostep_s:.2f}steps ref={otargets[k]}steps "
          f"ratio={otargets[k] * ostep_s / m:.2f}")

# 6. own-loop steady images/s (64 per step) against DDP with the same loop.
oown, oref = [], []
for d in sorted(glob.glob(f"{work}/ownsteady-own*")):
    t = {}
    for s in lines(f"{d}/samples.jsonl"):
        t[s["step"]] = min(t.get(s["step"], s["time"]), s["time"])
    oown.append(rate(t))
for d in sorted(glob.glob(f"{work}/ownsteady-ddp*")):
    t = {m["step"]: m["time"] for m in lines(f"{d}/metrics.jsonl")}
    oref.append(rate(t))
print(f"# own-loop steady images/s: own loop {[round(x, 1) for x in oown]}, DDP same loop {[round(x, 1) for x in oref]}")
print(f"RESULT pytorch_own_loop_steady_images_per_s ours={med(oown):.1f}img/s ref={med(oref):.1f}img/s "
      f"ratio={med(oown) / med(oref):.3f} (target >= 0.97)")
PY
