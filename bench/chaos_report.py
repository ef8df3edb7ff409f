"""The figures of bench/chaos.sh from its runs' records (WORK/chaos and WORK/ref; with PAIRS=N also
WORK/chaos2 and WORK/ref2 up to WORK/chaosN and WORK/refN).

Usage: chaos_report.py WORK DURATION_S TRAIN_SAMPLES LOAD [TRAINERS (the full size, default 4)
[PAIRS (REPEAT, default 1)]]. Each run directory holds the trainers'
sample log (samples.jsonl), the job's events log (events/chaos.events.jsonl), the chaos driver's
actions (chaos.jsonl: wall time and what it did) and edl_chaos_check's verdict (check.json).
Goodput: the samples of the steps in the job's final history (check.json "samples": a step redone
after a rollback counts once) over the run's wall window (the driver's start to its end). Where the
time went: every gap between consecutive committed steps longer than 2.5 steady steps, minus one
steady step, attributed to the latest chaos action before it (or to the evaluation when the gap
starts a new epoch), plus the trainers' stall records per re-form.
"""
import json
import math
import statistics
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchrun_restart import metrics as lines  # JSON lines, skipping one cut by a SIGKILLed writer

work, duration, n_train, load = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
FULL = int(sys.argv[5]) if len(sys.argv) > 5 else 4  # the job's full size, the reference's fixed one
# The sample log's times are the trainers' steady clock (CLOCK_MONOTONIC); the driver's and the
# events log's are wall clock: one offset, taken now on the same machine, converts them.
MONO_TO_WALL = time.time() - time.monotonic()
BATCH = 128  # the script's fixed-global batch
STEPS_PER_EPOCH = math.ceil(n_train / BATCH)


def load_run(name):
    d = f"{work}/{name}"
    r = {"events": lines(f"{d}/events/chaos.events.jsonl"), "actions": lines(f"{d}/chaos.jsonl")}
    try:
        r["check"] = json.load(open(f"{d}/check.json"))
    except (FileNotFoundError, ValueError):
        r["check"] = {"samples": 0, "data_error": "edl_chaos_check gave no verdict", "state_error": ""}
    t = [a["time"] for a in r["actions"] if a["action"] in ("start", "end")]
    r["window"] = max(t) - min(t) if len(t) >= 2 else duration
    # The final history: per step, the newest generation that logged it; its earliest log time.
    final, logged = {}, []
    for s in lines(f"{d}/samples.jsonl"):
        logged.append((s["step"], s["generation"]))
        s["time"] += MONO_TO_WALL
        g, t0, w = final.get(s["step"], (-1, 0.0, 0))
        if s["generation"] > g:
            final[s["step"]] = (s["generation"], s["time"], s["world"])
        elif s["generation"] == g and s["time"] < t0:
            final[s["step"]] = (g, s["time"], w)
    r["steps"] = final
    r["redone"] = len({(st, g) for st, g in logged if final[st][0] > g})
    acc = {}  # step -> (generation, accuracy)
    for e in r["events"]:
        if e.get("type") == "trainer_event" and e.get("event") == "eval":
            if e["generation"] >= acc.get(e["step"], (-1, 0))[0]:
                acc[e["step"]] = (e["generation"], e["accuracy"])
    r["acc"] = {st: a for st, (g, a) in acc.items()}
    # /proc/stat's "cpu" line at the window's start and end (chaos.sh): (busy, idle, steal) seconds,
    # all cores together; None when the run has no such record.
    r["cpu"] = None
    try:
        ticks = [[int(v) for v in line.split()[1:]] for line in open(f"{d}/cpu.txt") if line.startswith("cpu ")]
    except FileNotFoundError:
        ticks = []
    if len(ticks) == 2:
        hz = os.sysconf("SC_CLK_TCK")
        delta = [(b - a) / hz for a, b in zip(*ticks)]
        # user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
        r["cpu"] = (sum(delta[0:3]) + delta[5] + delta[6], delta[3] + delta[4], delta[7])
    return r


# The pairs: (chaos, ref), then (chaos2, ref2), ... (REPEAT=N). The breakdown is the first pair's.
PAIRS = int(sys.argv[6]) if len(sys.argv) > 6 else 1
names = [(f"chaos{i}", f"ref{i}") if i > 1 else ("chaos", "ref") for i in range(1, PAIRS + 1)]
runs = {n: load_run(n) for pair in names for n in pair}
chaos, ref = runs["chaos"], runs["ref"]
failed = []  # runs whose records failed the exactly-once or identical-state check
for name, r in runs.items():
    c = r["check"]
    ok = not c.get("data_error") and not c.get("state_error")
    if not ok:
        failed.append(name)
    print(f"# {name}: {c.get('steps', 0)} committed steps, {c.get('samples', 0)} samples in "
          f"{r['window']:.1f} s, {c.get('complete_epochs', 0)} complete epochs checked exactly-once, "
          f"{c.get('generations_checked', 0)} generations with identical state on every member, "
          f"{c.get('unconfirmed_steps', 0)} steps not confirmed by every rank: "
          + ("OK" if ok else f"FAILED data: {c.get('data_error')!r} state: {c.get('state_error')!r}"))
    if r["cpu"]:
        busy, idle, steal = r["cpu"]
        per = f", {1000 * busy / c['samples']:.2f} CPU-s per 1000 images" if c.get("samples") else ""
        print(f"#   {name}: the machine's CPU over the window: busy {busy:.0f} s, idle {idle:.0f} s, "
              f"stolen by the hypervisor {steal:.1f} s{per}")

# Steady step at the full size, from the reference: median gap between consecutive steps.
def gaps(r):
    seq = sorted(r["steps"].items())
    return [(a[0], b[0], b[1][1] - a[1][1], b[1][2]) for a, b in zip(seq, seq[1:]) if b[0] == a[0] + 1]


def steady_of(r):
    """A reference run's steady step at the full size: the median gap between consecutive steps."""
    g = [x for _, _, x, w in gaps(r) if w == FULL]
    return statistics.median(g) if g else float("nan")


steady = steady_of(ref)
print(f"# steady step at world {FULL} (reference median): {steady:.3f} s")
# The same median in the chaos run (gaps of a re-form left out): two runs of one job on a small shared
# machine can differ here by a few % with no chaos involved, which moves the goodput ratio as much.
chaos_steady = [g for _, _, g, w in gaps(chaos) if w == FULL and g <= 2.5 * steady]
if chaos_steady:
    m = statistics.median(chaos_steady)
    print(f"# steady step at world {FULL} in the chaos run (median, re-form gaps left out): {m:.3f} s, "
          f"{100 * (m / steady - 1):+.1f} % against the reference")

ev = chaos["events"]
kinds = {}
for e in ev:
    if e.get("type") in ("generation", "restored", "recovered", "trainer_exit", "kill", "stale_trainers",
                         "node_lost", "node_disconnected", "prepare_aborted"):
        kinds[e["type"]] = kinds.get(e["type"], 0) + 1
    if e.get("type") == "trainer_event" and e.get("event") == "cold_start":
        kinds["cold_start"] = kinds.get("cold_start", 0) + 1
acts = {}
for a in chaos["actions"]:
    acts[a["action"]] = acts.get(a["action"], 0) + 1
print(f"# chaos actions: {json.dumps(acts, sort_keys=True)}")
print(f"# server records: {json.dumps(kinds, sort_keys=True)}; steps redone after a rollback: {chaos['redone']}")

# The SIGSTOPped trainer: its id (from its sync records), the client's report of its exit, and the
# first failure generation after it.
stop = [a for a in chaos["actions"] if a["action"] == "stop_trainer"]
if stop:
    pid, t_stop = stop[0]["pid"], stop[0]["time"]
    ids = {e["trainer"] for e in ev if e.get("type") == "trainer_event" and e.get("pid") == pid}
    exits = [e for e in ev if e.get("type") == "trainer_exit" and e.get("trainer_id") in ids and e["time"] >= t_stop]
    gens = [e for e in ev if e.get("type") == "generation" and e["time"] >= (exits[0]["time"] if exits else 1e18)]
    if exits and gens:
        print(f"# SIGSTOPped trainer {sorted(ids)} (pid {pid}): dropped, exit reported "
              f"{exits[0]['time'] - t_stop:.1f} s after the stop ({exits[0].get('how')}), generation "
              f"{gens[0]['generation']} without it {gens[0]['time'] - t_stop:.1f} s after the stop")
    else:
        print(f"# SIGSTOPped trainer {sorted(ids)} (pid {pid}): NOT DROPPED (no exit record or no generation after it)")

PHASES = ("lost_s", "wait_generation_s", "agree_s", "reform_s", "sync_s", "eval_s", "first_step_s")
TAIL_S = 1.0  # every gap and every stall longer than this is named with its context (the long tails)


def analyze(c, steady):
    """One chaos run's breakdown against its reference's steady step: where the time went (gaps
    by the chaos action before them), time at each world size, each re-form's stall (the stall
    records), the grow-backs after lone trainer kills, and the long tails."""
    out = {"lost": {}, "where": {}, "at_world": {}, "tails": []}
    lost, where = out["lost"], out["where"]
    actions = [a for a in c["actions"] if a["action"] not in ("start", "end")]
    cause_times = sorted((a["time"], a["action"]) for a in actions)
    for prev, step, gap, w in gaps(c):
        if not gap > 2.5 * steady:
            continue
        end = c["steps"][step][1]
        inside = [x for t, x in cause_times if end - gap <= t <= end]
        before = [x for t, x in cause_times if t <= end]
        if not inside and (step - 1) % STEPS_PER_EPOCH == 0:
            cause = "epoch end (evaluation)"
        else:
            cause = (inside or before or ["start"])[-1]
            cause = cause.rstrip("_n0123456789").replace("start_", "restart_")
        lost[cause] = lost.get(cause, 0.0) + gap - steady
        where[cause] = where.get(cause, 0) + 1
    seq = sorted(c["steps"].items())
    t0 = min((a["time"] for a in c["actions"] if a["action"] == "start"), default=None)
    if seq and t0 is not None:
        lost["start-up (to the first step)"] = seq[0][1][1] - t0
        where["start-up (to the first step)"] = 1
    for prev, step, gap, w in gaps(c):
        out["at_world"][w] = out["at_world"].get(w, 0.0) + gap
    # A re-form's stall less its evaluation work: an evaluation (or the part of a cut one a
    # survivor kept) is work the fixed run does too, not time the re-form cost
    # (docs/ARCHITECTURE.md "The stall and its phases"). Per generation: the longest survivor stall
    # less the longest survivor eval_s. The slowest evaluator is the evaluation's critical path, in
    # the fixed run as here; a survivor that evaluated less waited for it (in the fixed run, in the
    # evaluation's all-reduce).
    raw, evals, longest = {}, {}, {}
    for e in c["events"]:
        if e.get("type") == "trainer_event" and e.get("event") == "stall":
            kind = "failure" if e.get("failure") else ("shrink" if e["world_after"] < e["world_before"] else "grow")
            r = raw.setdefault(kind, {})
            if e["stall_s"] >= r.get(e["generation"], -1.0):
                longest[e["generation"]] = e
            r[e["generation"]] = max(r.get(e["generation"], 0.0), e["stall_s"])
            x = evals.setdefault(kind, {})
            x[e["generation"]] = max(x.get(e["generation"], 0.0), e.get("eval_s", 0.0))
    out["raw"] = raw
    out["stalls"] = {kind: {n: max(0.0, v - evals[kind][n]) for n, v in g.items()} for kind, g in raw.items()}
    # Grow-back after a trainer kill at the full size: from the kill to the first step logged by a
    # newer generation at the full size again (a warm spare admitted in the failure's own re-form,
    # or a later grow). A kill that landed within 3 s of a client or server kill (or before the
    # grow-back, one came) is listed but left out of the figures: with every slot in use, the job
    # regrows only once that client is back.
    by_time = sorted(c["steps"].values(), key=lambda v: v[1])  # (generation, time, world)
    others = [a["time"] for a in actions if a["action"] != "kill_trainer" and not a["action"].startswith("start")]
    out["growback"], out["mixed"] = [], []
    for a in actions:
        if a["action"] != "kill_trainer":
            continue
        before = [v for v in by_time if v[1] <= a["time"]]
        if not before or before[-1][2] != FULL:
            continue  # below its size already: no grow-back of this kill alone
        later = [v for v in by_time if v[1] > a["time"] and v[0] > before[-1][0] and v[2] == FULL]
        if later:
            g = later[0][1] - a["time"]
            alone = not any(a["time"] - 3 <= t <= a["time"] + g for t in others)
            (out["growback"] if alone else out["mixed"]).append(g)
    out["growback"].sort()

    # The long tails: every gap between committed steps and every re-form stall (less its
    # evaluation work) over TAIL_S, named with its generation, the phases of its longest survivor
    # stall, and the chaos actions from 5 s before it to its end (time in the run, from its start).
    def around(t_from, t_to):
        near = [a for a in actions if t_from - 5 <= a["time"] <= t_to]
        return ", ".join(f"{a['action']} at {a['time'] - t0:.1f} s" for a in near) or "no chaos action"

    def phases(e):
        if e is None:
            return "no stall record"
        parts = [f"{k[:-2]} {e[k]:.2f}" for k in PHASES if isinstance(e.get(k), (int, float)) and e[k] >= 0]
        return f"stall {e['stall_s']:.2f} s of {e.get('trainer', '?')}: " + (", ".join(parts) or "no phases")

    t0 = t0 if t0 is not None else 0.0
    stall_end = {n: e["time"] for n, e in longest.items()}
    for prev, step, gap, w in gaps(c):
        if gap <= TAIL_S:
            continue
        gen, end, _ = c["steps"][step]
        out["tails"].append(
            f"gap {gap:.2f} s ({gap / steady:.1f} steady steps) from step {prev} to {step} at "
            f"{end - gap - t0:.1f}-{end - t0:.1f} s, generation {gen} at world {w}; "
            f"{phases(longest.get(gen))}; {around(end - gap, end)}")
    for kind, g in sorted(out["stalls"].items()):
        for n, cost in sorted(g.items()):
            if cost > TAIL_S:
                e = longest[n]
                out["tails"].append(
                    f"{kind} stall {cost:.2f} s less evaluation ({cost / steady:.1f} steady steps), generation "
                    f"{n} (world {e['world_before']} -> {e['world_after']}) ending at {e['time'] - t0:.1f} s; "
                    f"{phases(e)}; {around(e['time'] - e['stall_s'], e['time'])}")
    return out


steadies = {c_name: steady_of(runs[r_name]) for c_name, r_name in names}
analyses = {c_name: analyze(runs[c_name], steadies[c_name]) for c_name, _ in names}
first = analyses["chaos"]
lost, where, at_world, stalls, raw = first["lost"], first["where"], first["at_world"], first["stalls"], first["raw"]
print("# time without a committed step (gap minus one steady step), by the chaos action before it: " +
      "; ".join(f"{c}: {lost[c]:.1f} s over {where[c]} gaps" for c in sorted(lost, key=lambda c: -lost[c])))
print("# time in steps at each world size: " + ", ".join(f"{w}: {t:.1f} s" for w, t in sorted(at_world.items())))
for kind, g in sorted(stalls.items()):
    v = list(g.values())
    print(f"# stall records, {kind}: {len(v)} re-forms, longest survivor stall less the longest evaluation work: "
          f"median {statistics.median(v):.2f} s, max {max(v):.2f} s, sum {sum(v):.1f} s; with it: max "
          f"{max(raw[kind].values()):.2f} s")
# The long tails of every chaos run, each with its context: none may hide behind a median.
for c_name, _ in names:
    tails = analyses[c_name]["tails"]
    print(f"# {c_name}: {len(tails)} gaps or stalls over {TAIL_S:.0f} s" + (":" if tails else ""))
    for t in tails:
        print(f"#   {t}")

print(f"# load average (1/5/15 min) at the end: {load}")
if failed:
    # Goodput counts committed samples: with a run that consumed some twice or lost some, or whose
    # members diverged, there is no goodput to report, and the benchmark fails.
    print(f"# NO RESULT: the {' and '.join(failed)} run failed its exactly-once / identical-state check "
          "(above); goodput and accuracy are not reported")
    sys.exit(1)
# REPEAT=N: N pairs, each in the opposite order of the one before. The goodput is all pairs'
# committed samples over all pairs' windows; each pair's ratio and their spread say how far one
# pair can be trusted on this machine.
pairs = [(runs[c], runs[r]) for c, r in names]
per_pair = []
for i, (c, r) in enumerate(pairs, 1):
    o, t = c["check"].get("samples", 0) / c["window"], r["check"].get("samples", 0) / r["window"]
    per_pair.append(o / t if t > 0 else float("nan"))
    if len(pairs) > 1:
        print(f"# pair {i}: chaos {o:.1f} vs reference {t:.1f} images/s ({c['window']:.1f} vs "
              f"{r['window']:.1f} s): {per_pair[-1]:.3f}")
if len(pairs) >= 2:
    m, sd = statistics.mean(per_pair), statistics.stdev(per_pair)
    print(f"# the {len(pairs)} pairs' ratios: mean {m:.3f}, standard deviation {sd:.3f}, standard error of the "
          f"mean {sd / math.sqrt(len(pairs)):.3f}, min {min(per_pair):.3f}, max {max(per_pair):.3f}")
ours = sum(c["check"].get("samples", 0) for c, _ in pairs) / sum(c["window"] for c, _ in pairs)
theirs = sum(r["check"].get("samples", 0) for _, r in pairs) / sum(r["window"] for _, r in pairs)
print(f"RESULT chaos_goodput ours={ours:.1f}img/s ref={theirs:.1f}img/s "
      f"ratio={ours / theirs if theirs > 0 else float('nan'):.3f}" + (f" ({len(pairs)} pairs)" if len(pairs) > 1 else ""))
# The machine's CPU per committed image, all pairs: the trainers are CPU-bound on a busy machine,
# so what chaos costs in CPU (redone steps, re-forms, state sync, spares' preparation) shows here
# apart from how much CPU the machine lent each run; idle CPU is where the job waited.
if all(c["cpu"] and r["cpu"] for c, r in pairs):
    def cpu_per(side):
        return sum(x["cpu"][0] for x in side) / sum(x["check"].get("samples", 0) for x in side)
    o, t = cpu_per([c for c, _ in pairs]), cpu_per([r for _, r in pairs])
    print(f"RESULT chaos_cpu_per_image ours={1000 * o:.2f}ms ref={1000 * t:.2f}ms ratio={t / o:.3f} "
          f"(the machine's busy CPU time over committed images)")

def ratio(ref_v, ours_v):
    return f"{ref_v / ours_v:.3f}" if ours_v > 0 else "inf"


# The breakdown, measured against the reference's steady step (the floor of any re-form: the
# step that carries the change). ratio = steady / ours, above 1 when a chaos action cost less
# than one steady step. Each figure is taken in every chaos run against its own pair's reference;
# its targets hold in every run, so the RESULT line is the worst run's, and lists every run's.
def worst(label, per_run, unit_note):
    """per_run: [(run, value, steady)] for the runs that have the figure; prints its RESULT line."""
    if not per_run:
        return
    run, v, st = max(per_run, key=lambda x: x[1])
    each = (f"; worst of {len(per_run)} runs: " + ", ".join(f"{r} {x:.2f}" for r, x, _ in per_run)
            if len(per_run) > 1 else "")
    print(f"RESULT {label} ours={v:.2f}s ref={st:.2f}s ratio={ratio(st, v)} ({unit_note(run, v, st)}{each})")


# Gap per chaos action: the time without a committed step after each kind (the kill and the
# restart of a client or the server are one action), over the number of such actions.
per_action = {
    "trainer_kill": (("kill_trainer",), "kill_trainer"),
    "client_restart": (("kill_client", "restart_client"), "kill_client_n"),
    "server_restart": (("kill_server", "restart_server", "restart_standby"), "kill_server"),
    "trainer_stop": (("stop_trainer",), "stop_trainer"),
    "node_loss": (("lose_node",), "lose_node"),
    "evaluation": (("epoch end (evaluation)",), None),
}
for name, (causes, action) in per_action.items():
    per_run, counts = [], {}
    for c_name, _ in names:
        a = analyses[c_name]
        run_acts = {}
        for x in runs[c_name]["actions"]:
            run_acts[x["action"]] = run_acts.get(x["action"], 0) + 1
        n = (sum(v for k, v in run_acts.items() if k.startswith(action)) if action
             else sum(a["where"].get(c, 0) for c in causes))
        if n == 0:
            continue
        counts[c_name] = n
        per_run.append((c_name, sum(a["lost"].get(c, 0.0) for c in causes) / n, steadies[c_name]))
    worst(f"chaos_gap_per_{name}", per_run,
          lambda run, v, st: f"{counts[run]} actions in {run}; time without a committed step after them, "
                             "minus one steady step each")
# Failure stalls: the longest survivor stall of each failure re-form (the stall events), less the
# longest evaluation work a survivor kept (above).
def pct(v, q):  # nearest rank of sorted v
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


fails = {c: sorted(analyses[c]["stalls"].get("failure", {}).values()) for c, _ in names}
for label, q in (("p50", 0.50), ("p99", 0.99), ("max", 1.0)):
    worst(f"chaos_failure_stall_{label}", [(c, pct(f, q), steadies[c]) for c, f in fails.items() if f],
          lambda run, v, st: f"{len(fails[run])} failure re-forms in {run}")
# Grow-back after a trainer kill at the full size (analyze). The target: at most 2 steady
# steps at the median, 5 at most.
gb = first["growback"]
if gb or first["mixed"]:
    print("# grow-back after each kill at the full size (s): alone " + " ".join(f"{v:.2f}" for v in gb) +
          "; with a client or server kill " + (" ".join(f"{v:.2f}" for v in first["mixed"]) or "none"))
gbs = {c: analyses[c]["growback"] for c, _ in names}
for label, f, target in (("p50", statistics.median, 2), ("max", max, 5)):
    worst(f"chaos_growback_after_trainer_kill_{label}", [(c, f(g), steadies[c]) for c, g in gbs.items() if g],
          lambda run, v, st: f"{len(gbs[run])} kills alone at the full size in {run}; kill to the first "
                             f"full-size step of a newer generation: {v / st:.1f} steady steps, target <= {target}")
# Time at each world size: the fixed run spends the window at full size. At full size more is
# better (ratio ours/ref); below it less is (ratio ref/ours, 0 when the reference spent none).
ref_world = {}
for prev, step, gap, w in gaps(ref):
    ref_world[w] = ref_world.get(w, 0.0) + gap
for w in sorted(set(at_world) | set(ref_world)):
    o, r = at_world.get(w, 0.0), ref_world.get(w, 0.0)
    rt = (o / r if r > 0 else float("nan")) if w == FULL else (r / o if o > 0 else float("inf"))
    print(f"RESULT chaos_time_at_world_{w} ours={o:.1f}s ref={r:.1f}s ratio={rt:.3f}")
common = sorted(set(chaos["acc"]) & set(ref["acc"]))
print("# accuracy after each epoch, chaos | reference: " + ", ".join(
    f"ep{s // STEPS_PER_EPOCH} {100 * chaos['acc'][s]:.2f} | {100 * ref['acc'][s]:.2f}" for s in common))
for name, r in (("chaos", chaos), ("reference", ref)):
    if r["acc"]:
        s = max(r["acc"])
        print(f"# {name}: last evaluation after epoch {s // STEPS_PER_EPOCH} (step {s}): {100 * r['acc'][s]:.2f} %")
if common:
    s = common[-1]
    a, b = 100 * chaos["acc"][s], 100 * ref["acc"][s]
    print(f"RESULT chaos_accuracy ours={a:.2f}% ref={b:.2f}% ratio={a / b:.3f} "
          f"(after epoch {s // STEPS_PER_EPOCH} of both runs; difference {a - b:+.2f} points)")
else:
    print("RESULT chaos_accuracy ours=nan ref=nan ratio=nan (no epoch evaluated in both runs)")
