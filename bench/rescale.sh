#!/usr/bin/env bash
# Rescale stall of in-place elastic training vs the stop-resume baseline, CPU / Gloo, loopback.
#
# Runs a real `edl server` + two `edl client`s (2 slots each) training ResNet-20 on a Fashion-MNIST
# subset, with a scaling script that cycles shrink (4->3), grow (3->4) and failure (kill 1, then
# grow back) CYCLES times, so each kind yields >= CYCLES survivor stall events (each survivor
# reports one). Then the stop-resume baseline, as PaddlePaddle EDL did: the script's `kill all`
# SIGKILLs every trainer in one step, the job restarts them and they resume from the latest
# checkpoint; its stall is the wall time from the last step before the kill to the first step after
# the restart (from the sample log). Steady step time: median time between consecutive steps of an
# unchanged generation.
# Then the steady-state overhead of the runtime: images/s of 4 trainers at a fixed size under the
# server and clients (the full elastic runtime) vs `edl launch -n 4 -- edl train --plain_allreduce`
# (a plain all-reduce loop, same model, data, batches and threads), and the runtime under the same
# `edl launch` (static membership: the loop's own cost, same harness), OVERHEAD_RUNS runs of each,
# interleaved, median; images/s from the sample log between step 6 and the last step. On a shared,
# busy machine wall time is noisy, so the trainers' CPU seconds per 1000 images (user + system,
# start-up included, from --usage_log) plus the CPU of the control-plane processes of that run
# (`edl server` and both `edl client`s for the runtime; `edl launch` for the launch runs; user +
# system from /proc, sampled while they run) are reported too. The machine's load average is
# printed at the start and the end, next to the figures.
# Then the real reference, torchrun restarting every worker after a kill (bench/torchrun_restart.py;
# needs python3-torch, TORCHRUN_KILLS=0 skips it), twice: with torchrun's defaults (monitor
# interval 5 s in torch 1.13, c10d last_call_timeout 30 s) and tuned (TORCHRUN_MONITOR_S, default
# 0.5 s; last_call_timeout 1 s): RESULT stall_<kind>_vs_torchrun_{tuned,default}_s lines. Only the
# failure rows are like for like (a kill against a kill); torchrun has no planned resize, so for
# shrink and grow its restart after a kill stands in for what a change of size costs there. Each kind
# also prints the median of each phase of its stall (docs/ARCHITECTURE.md, "The stall and its
# phases").
# Takes ~10 min for CYCLES=10 on 2 cores. Usage: bench/rescale.sh [BUILD_DIR] (default build).
set -euo pipefail
BUILD=${1:-build}
EDL=$(realpath "$BUILD/edl")
CYCLES=${CYCLES:-10}
OVERHEAD_RUNS=${OVERHEAD_RUNS:-3}
OVERHEAD_STEPS=${OVERHEAD_STEPS:-100}
TRAIN_FLAGS=(--model resnet20 --train_samples 2048 --batch_size 16 --base_batch 64 --lr_decay constant
             --threads 1 --eval false --log_every 0)
WORK=$(mktemp -d /tmp/edl-rescale-XXXXXX)
PIDS=()
# Control-plane CPU: every 0.2 s, each process in PIDS writes its own user+system seconds (not its
# children's: trainer CPU comes from --usage_log) to $1/cp_cpu.<pid>; the last sample of each is
# its total to within 0.2 s.
CLK_TCK=$(getconf CLK_TCK)
sample_cp_cpu() {
  local p v
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] || continue
    v=$(awk -v hz="$CLK_TCK" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$p/stat" 2>/dev/null) || continue
    [ -n "$v" ] && echo "$v" > "$1/cp_cpu.$p"
  done
}
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores" >&2; }
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM -- "-$p" 2>/dev/null || true; done; sleep 1;
            for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
head -c 32 /dev/urandom | base64 > "$WORK/secret"; chmod 600 "$WORK/secret"

# Runs one job until it finishes, or, with STOP_GENS / STOP_AFTER_S set, until the events log holds
# STOP_GENS generation records or STOP_AFTER_S seconds passed; then stops all of it by pid.
run_job() {  # $1 name, $2 script, $3 trainers, $4 epochs, extra train flags...
  local name=$1 script=$2 trainers=$3 epochs=$4; shift 4
  local d="$WORK/$name"; mkdir -p "$d"; printf "%b" "$script" > "$d/scale.script"
  setsid "$EDL" server --server_port 0 --bind 127.0.0.1 --port_file "$d/port" --secret_file "$WORK/secret" \
    --job_id bench --min_trainers 1 --trainers "$trainers" --scale_script "$d/scale.script" \
    --events_dir "$d/events" --join_timeout_s 60 --backoff_min_s 1 --backoff_max_s 1 \
    > "$d/server.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do [ -s "$d/port" ] && break; sleep 0.1; done
  local port; port=$(cat "$d/port")
  for n in n1 n2; do
    setsid "$EDL" client --server "127.0.0.1:$port" --secret_file "$WORK/secret" --node_name $n --slots 2 \
      --mode inplace --socket_path "$d/$n.sock" --log_dir "$d/logs" --leave_grace_s 30 --stop_grace_s 2 \
      --trainer_timeout_s 10 --exit_when_done -- "$EDL" train "${TRAIN_FLAGS[@]}" --epochs "$epochs" \
      --sample_log "$d/samples.jsonl" "$@" > "$d/$n.log" 2>&1 & PIDS+=($!)
  done
  local ev="$d/events/bench.events.jsonl" deadline=$((SECONDS + ${STOP_AFTER_S:-600})) n
  while [ $SECONDS -lt $deadline ]; do
    grep -q '"type":"finished"' "$ev" 2>/dev/null && break
    if [ -n "${STOP_GENS:-}" ]; then
      n=$(grep -c '"type":"generation"' "$ev" 2>/dev/null || true)
      [ "${n:-0}" -ge "$STOP_GENS" ] && { sleep 3; break; }
    fi
    sleep 0.2
    sample_cp_cpu "$d"
  done
  sample_cp_cpu "$d"
  cleanup; PIDS=()
}

# A cycle is 20 s: the grow-back after the kill (1 s backoff, then a joiner that loads the data and
# builds the model) must be committed before the next `set 3`, or that shrink only cancels it.
script=""; t=5
for _ in $(seq "$CYCLES"); do
  script+="$t set 3\n"; t=$((t + 5)); script+="$t set 4\n"; t=$((t + 6)); script+="$t kill 1\n"; t=$((t + 9))
done
load
echo "elastic run: $CYCLES cycles, ~${t} s" >&2
# Stop once every scripted change happened (1 + 4 x CYCLES generations: shrink, grow, failure and
# grow-back per cycle) or well after the script's end (the epoch budget is deliberately large).
STOP_GENS=$((1 + 4 * CYCLES)) STOP_AFTER_S=$((t + 90)) run_job elastic "0 set 4\n$script" 4 1000

echo "stop-resume baseline" >&2
sr=""; t=15
for _ in $(seq 3); do sr+="$t kill all\n"; t=$((t + 35)); done
run_job stopresume "0 set 4\n$sr" 4 24 --checkpoint_dir "$WORK/ckpt" --checkpoint_steps 5

# The real reference: what users would otherwise run. The same model, data subset, global batch
# (4 x 16) and threads under Debian's torchrun, checkpoint every 5 steps, a worker SIGKILLed
# TORCHRUN_KILLS times; torchrun restarts every worker (bench/torchrun_restart.py).
if [ "${TORCHRUN_KILLS:-3}" -gt 0 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  # name, monitor interval (0: torchrun's default), last_call_timeout (30 s: c10d's default)
  for cfg in "tuned ${TORCHRUN_MONITOR_S:-0.5} 1" "default 0 30"; do
    read -r name monitor last_call <<<"$cfg"
    shown=$monitor; [ "$monitor" = 0 ] && shown="torchrun's default"
    echo "torchrun restart-all reference, $name (monitor_interval $shown, last_call_timeout" \
         "$last_call s): ${TORCHRUN_KILLS:-3} kills" >&2
    mkdir -p "$WORK/torchrun_$name"
    /usr/bin/python3 "$(dirname "$0")/torchrun_restart.py" --work "$WORK/torchrun_$name" \
      --out "$WORK/torchrun_$name/result.json" --script "$(dirname "$0")/../examples/pytorch/train_ddp.py" \
      --kills "${TORCHRUN_KILLS:-3}" --monitor_interval "$monitor" --last_call_s "$last_call" -- \
      --train_samples 2048 --batch_size 64 --lr_decay constant --threads 1 --test_samples 0 \
      --steps 100000 --checkpoint_every 5 \
      || echo "torchrun reference ($name) failed: $(tail -5 "$WORK/torchrun_$name/torchrun.log" 2>/dev/null)" >&2
  done
else
  echo "torchrun reference skipped (TORCHRUN_KILLS=0 or no python3-torch)" >&2
fi

echo "overhead: $OVERHEAD_RUNS x (runtime at fixed size 4, plain all-reduce under edl launch)" >&2
for i in $(seq "$OVERHEAD_RUNS"); do
  run_job "rt$i" "0 set 4\n" 4 1000 --max_steps "$OVERHEAD_STEPS" --usage_log "$WORK/rt$i/usage.jsonl"
  for mode in plain:true rtl:false; do  # rtl: the runtime under edl launch (static membership)
    d="$WORK/${mode%%:*}$i"; mkdir -p "$d"
    setsid "$EDL" launch -n 4 --log_dir "$d/logs" -- "$EDL" train "${TRAIN_FLAGS[@]}" --epochs 1000 \
      --max_steps "$OVERHEAD_STEPS" --plain_allreduce "${mode#*:}" --sample_log "$d/samples.jsonl" \
      --usage_log "$d/usage.jsonl" > "$d/launch.log" 2>&1 & PIDS+=($!)
    while kill -0 "${PIDS[-1]}" 2>/dev/null; do sample_cp_cpu "$d"; sleep 0.2; done
    wait "${PIDS[-1]}" || echo "$mode run $i failed: $(tail -3 "$d/launch.log")" >&2
    PIDS=()
  done
done

load
/usr/bin/python3 - "$WORK" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def lines(p):
    out = []
    try:
        for l in open(p):
            try: out.append(json.loads(l))
            except ValueError: pass
    except FileNotFoundError: pass
    return out
ev = lines(f"{work}/elastic/events/bench.events.jsonl")
stalls = {"shrink": [], "grow": [], "failure": []}
reforms = {"shrink": set(), "grow": set(), "failure": set()}  # generations: re-form events
for e in ev:
    if e.get("type") == "trainer_event" and e.get("event") == "stall":
        kind = "failure" if e["failure"] else ("shrink" if e["world_after"] < e["world_before"] else "grow")
        stalls[kind].append(e["stall_s"])
        reforms[kind].add(e["generation"])
steps = {}
for s in lines(f"{work}/elastic/samples.jsonl"):
    steps.setdefault(s["step"], (s["time"], s["generation"]))
seq = sorted(steps.items())
gen_gaps = [(b[1][1], b[1][0] - a[1][0]) for a, b in zip(seq, seq[1:])
            if a[1][1] == b[1][1] and b[0] == a[0] + 1]  # (generation, step time)
gaps = [g for _, g in gen_gaps]
step_s = statistics.median(gaps) if gaps else float("nan")
# The steady step by world size (2 cores: 4 single-threaded trainers step slower than 3), for
# reading a stall against the step of the world it re-formed into; the targets use step_s.
gen_world = {e["generation"]: e["world_size"] for e in ev
             if e.get("type") == "trainer_event" and e.get("event") == "sync"}
by_world = {}
for gen, g in gen_gaps:
    if gen in gen_world:
        by_world.setdefault(gen_world[gen], []).append(g)
print("# steady step by world size: " + ", ".join(
    f"{w} trainers {statistics.median(v):.4f} s ({len(v)} steps)" for w, v in sorted(by_world.items())))
built = [e["build_s"] for e in ev if e.get("type") == "trainer_event" and e.get("event") == "prepared"]
if built:
    print(f"# communicators built ahead (make-before-break, off the stall): {len(built)}, median "
          f"{statistics.median(built):.4f} s, max {max(built):.4f} s")
# Stop-resume: for each kill-all, last step time before the restart to first step after it (the
# job only changes generation at a kill-all: the empty failure generation, then the restart).
sr = lines(f"{work}/stopresume/samples.jsonl")
first = {}  # (generation, step) -> first time any rank logged it
for s in sr:
    k = (s["generation"], s["step"])
    first[k] = min(first.get(k, s["time"]), s["time"])
order = sorted((t, k[0], k[1]) for k, t in first.items())
resume = [b[0] - a[0] for a, b in zip(order, order[1:]) if b[1] != a[1]]
redone = [a[2] - b[2] + 1 for a, b in zip(order, order[1:]) if b[1] != a[1]]
# The server's failure backoff (fixed at 1 s here: --backoff_min_s = --backoff_max_s = 1, so that
# ten failures within minutes still grow back) delays each restart; a deliberate stop-resume needs
# none, so the baseline leaves it out (conservative: a lower ref).
sev = lines(f"{work}/stopresume/events/bench.events.jsonl")
gtime = {e["generation"]: e["time"] for e in sev if e.get("type") == "generation"}
backoff = {g: gtime[g + 1] - t for g, t in gtime.items()
           if g + 1 in gtime and any(e.get("type") == "generation" and e["generation"] == g and
                                     e["world_size_after"] == 0 for e in sev)}
# Transition a -> b goes through the empty generation b[1] - 1.
adj = [r - backoff.get(b[1] - 1, 0.0) for r, (a, b) in
       zip(resume, [(a, b) for a, b in zip(order, order[1:]) if b[1] != a[1]])]
print(f"stop-resume incl. backoff: median {statistics.median(resume) if resume else float('nan'):.2f} s; "
      f"backoffs {[round(x, 2) for x in backoff.values()]}")
resume = adj
base = statistics.median(resume) if resume else float("nan")
print(f"steady step {step_s:.4f} s; stop-resume events without backoff {len(resume)}: "
      f"{[round(r, 2) for r in resume]} (steps redone after the checkpoint: {redone})")
tref = {}  # "tuned" / "default": median restart-all stall of that torchrun configuration
for name in ("tuned", "default"):
    try:
        tr = json.load(open(f"{work}/torchrun_{name}/result.json"))
    except (FileNotFoundError, ValueError):
        tr = {"stalls": []}
    tref[name] = statistics.median(tr["stalls"]) if tr["stalls"] else float("nan")
    if tr["stalls"]:
        print(f"torchrun {tr['torch']} ({name}) restart-all stalls {[round(x, 2) for x in tr['stalls']]} s, "
              f"median {tref[name]:.2f} s; its steady step {tr['steady_step_s']:.4f} s; worker start to "
              f"first step {[round(x, 2) for x in tr['start_to_first_step_s']]} s; monitor_interval "
              f"{tr['monitor_interval_s']}, rendezvous last_call_timeout {tr.get('last_call_s')} s")
# The breakdown (docs/ARCHITECTURE.md, "The stall and its phases"): the trainer's additive phases,
# plus detection (failure: the server's `kill` to its failure generation record) and decision and
# push (the generation record to the trainer's seen_time), joined on the generation number.
gtime_el = {e["generation"]: e["time"] for e in ev if e.get("type") == "generation"}
kills = sorted(e["time"] for e in ev if e.get("type") == "kill")
PHASES = ["detection_s", "decision_push_s", "wait_switch_s", "lost_s", "wait_generation_s", "agree_s",
          "reform_s", "sync_s", "first_step_s"]
phases = {k: {p: [] for p in PHASES} for k in stalls}
for e in ev:
    if e.get("type") != "trainer_event" or e.get("event") != "stall" or "reform_s" not in e:
        continue
    kind = "failure" if e["failure"] else ("shrink" if e["world_after"] < e["world_before"] else "grow")
    g = gtime_el.get(e["generation"])
    for p in PHASES[2:]:
        phases[kind][p].append(e[p])
    if g is not None:
        phases[kind]["decision_push_s"].append(e["seen_time"] - g)
        before = [k for k in kills if k <= g]
        if e["failure"] and before:
            phases[kind]["detection_s"].append(g - before[-1])
for kind in ("shrink", "grow", "failure"):
    v = stalls[kind]
    if not v:
        print(f"RESULT stall_{kind}_s ours=nan ref={base:.3f}s ratio=nan"); continue
    m = statistics.median(v)
    target = {"shrink": 1.2, "grow": 1.5, "failure": 2.5}[kind]
    print(f"# {kind}: {len(reforms[kind])} re-forms, {len(v)} survivor stalls, median {m:.3f} s = "
          f"{m / step_s:.2f} steady steps (target <= {target} steps), max {max(v):.3f} s")
    med = {p: statistics.median(x) for p, x in phases[kind].items() if x}
    print(f"# {kind} phases, median s (the last six add up to the stall; the first three precede it): " +
          " ".join(f"{p[:-2]}={med[p]:.4f}" for p in PHASES if p in med))
    print(f"RESULT stall_{kind}_s ours={m:.3f}s ref={base:.3f}s ratio={base / m:.1f}")
    print(f"RESULT stall_{kind}_steps ours={m / step_s:.2f}steps ref={base / step_s:.2f}steps ratio={base / m:.1f}")
    like = ("like for like: a kill against a kill" if kind == "failure" else
            "not like for like: a planned change against torchrun's restart after a kill, "
            "torchrun having no planned resize")
    for name in ("tuned", "default"):
        print(f"RESULT stall_{kind}_vs_torchrun_{name}_s ours={m:.3f}s ref={tref[name]:.3f}s "
              f"ratio={tref[name] / m:.1f} ({like})")

def images_per_s(path, first_step=6):
    t = {}
    for s in lines(path):
        t[s["step"]] = min(t.get(s["step"], s["time"]), s["time"])
    if not t or max(t) <= first_step: return float("nan")
    last = max(t)
    return (last - first_step) * 64 / (t[last] - t[first_step])  # global batch 4 x 16
import glob, os
rt = [images_per_s(f"{work}/rt{i}/samples.jsonl") for i in range(1, 100) if os.path.isdir(f"{work}/rt{i}")]
pl = [images_per_s(f"{work}/plain{i}/samples.jsonl") for i in range(1, 100) if os.path.isdir(f"{work}/plain{i}")]
rl = [images_per_s(f"{work}/rtl{i}/samples.jsonl") for i in range(1, 100) if os.path.isdir(f"{work}/rtl{i}")]
print(f"# runtime under edl launch images/s {[round(x, 1) for x in rl]}")
print(f"# overhead: runtime images/s {[round(x, 1) for x in rt]}, plain all-reduce {[round(x, 1) for x in pl]}")
def control_plane_cpu(d):
    return sum(float(open(p).read() or 0) for p in glob.glob(f"{d}/cp_cpu.*"))
def cpu_per_kimg(d):  # trainers (usage log) + the run's control-plane processes
    u = lines(f"{d}/usage.jsonl")
    if not u: return float("nan")
    return 1000 * (sum(x["cpu_s"] for x in u) + control_plane_cpu(d)) / (max(x["steps"] for x in u) * 64)
rc = [cpu_per_kimg(f"{work}/rt{i}") for i in range(1, len(rt) + 1)]
pc = [cpu_per_kimg(f"{work}/plain{i}") for i in range(1, len(pl) + 1)]
lc = [cpu_per_kimg(f"{work}/rtl{i}") for i in range(1, len(rl) + 1)]
print(f"# control-plane CPU s: runtime {[round(control_plane_cpu(f'{work}/rt{i}'), 2) for i in range(1, len(rt) + 1)]}"
      f", launch {[round(control_plane_cpu(f'{work}/plain{i}'), 2) for i in range(1, len(pl) + 1)]}")
print(f"# CPU s per 1000 images, runtime under edl launch: {[round(x, 2) for x in lc]}")
print(f"# CPU s per 1000 images: runtime {[round(x, 2) for x in rc]}, plain {[round(x, 2) for x in pc]}")
if rc and pc:
    a, b = statistics.median(rc), statistics.median(pc)
    print(f"# runtime CPU overhead {100 * (a - b) / b:.1f} %")
    print(f"RESULT steady_cpu_s_per_kimg ours={a:.3f}s ref={b:.3f}s ratio={b / a:.3f}")
if rt and pl:
    r, p = statistics.median(rt), statistics.median(pl)
    print(f"# runtime overhead {100 * (p - r) / p:.1f} % (target <= 2 %)")
    print(f"RESULT steady_images_per_s ours={r:.1f}img/s ref={p:.1f}img/s ratio={r / p:.3f}")
if rl and pl:
    r, p = statistics.median(rl), statistics.median(pl)
    print(f"# runtime (static, under edl launch) overhead {100 * (p - r) / p:.1f} %")
    print(f"RESULT steady_images_per_s_launch ours={r:.1f}img/s ref={p:.1f}img/s ratio={r / p:.3f}")
if lc and pc:
    a, b = statistics.median(lc), statistics.median(pc)
    print(f"RESULT steady_cpu_s_per_kimg_launch ours={a:.3f}s ref={b:.3f}s ratio={b / a:.3f}")
PY
