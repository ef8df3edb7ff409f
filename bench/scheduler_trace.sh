#!/usr/bin/env bash
# Cluster scheduling policies on measured workloads, simulated (docs/SCHEDULING.md): replays the
# Pollux study's 8 workloads (160 jobs each, from Microsoft's Philly trace) on 16 nodes x 4 GPUs
# with jobs whose progress follows measured step times and statistical efficiency
# (build/edl_sched_replay; tools/sched_sim/replay.h, data in tools/sched_sim/data/pollux), under:
#   goodput_edl  EDL's cluster policy, --policy goodput, re-forms costing EDL's measured stall
#                (1.22 steps to grow or move, 0.93 to shrink: docs/BENCHMARKS.md, bench/rescale.sh)
#   goodput_30s  the same policy, each reallocation costing 30 s (the study's restart cost)
#   tiresias     two-queue discretised least-attained-service at the users' GPUs and batch (the
#                replay's fidelity check against the study's published Tiresias results)
#   easy         FIFO with EASY backfill at the users' GPUs and batch, exact run times
#   fair_edl     EDL's cluster policy as it is by default (max-min on trainer counts), elastic
#                1..the user's GPUs at the user's batch
# Every job start (or resume) costs 30 s in every variant. Prints, per workload and as the mean
# over the workloads, average JCT, p99 JCT, makespan and GPU-hours of each variant and of the
# study's published Pollux, Tiresias and Optimus+Oracle results; then RESULT lines, every variant
# against Pollux's published figures (ratio = ref / ours: > 1 is ahead), our Tiresias against the
# published Tiresias, and GPU-hours against our Tiresias replay (none are published).
# Deterministic: the same numbers on every machine; about 20 s of one core.
# Knobs (environment): WORKLOADS=1,2,3,4,5,6,7,8 VARIANTS (default all) EXTRA (more flags for
# edl_sched_replay, e.g. "--fairness_power=0"; see build/edl_sched_replay --help);
# SYNTHETIC=1 also runs the earlier synthetic-trace comparison (build/edl_sched_trace: 200 jobs on
# 64 x 8 slots, n^0.9 throughput, tools/sched_sim.h; its knobs SEED SEEDS JOBS NODES SLOTS GAP_S
# INTERVAL_S ALPHA START_S REFORM_S as before).
# Usage: bench/scheduler_trace.sh [BUILD_DIR] (default build).
set -euo pipefail
BUILD=${1:-build}
SIM=$BUILD/edl_sched_replay
[[ -x $SIM ]] || { echo "build first: cmake --build $BUILD --target edl_sched_replay" >&2; exit 1; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
load() { echo "$(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"; }
echo "machine load at the start: $(load)"
t0=$(date +%s%N)
args=(--data "$here/tools/sched_sim/data/pollux" --workloads "${WORKLOADS:-1,2,3,4,5,6,7,8}")
[[ -n ${VARIANTS:-} ]] && args+=(--variants "$VARIANTS")
# shellcheck disable=SC2206  # EXTRA is a list of flags
[[ -n ${EXTRA:-} ]] && args+=(${EXTRA})
"$SIM" "${args[@]}"
t1=$(date +%s%N)
echo "replayed in $(((t1 - t0) / 1000000)) ms wall; machine load at the end: $(load)"
if [[ ${SYNTHETIC:-0} == 1 ]]; then
  TRACE=$BUILD/edl_sched_trace
  [[ -x $TRACE ]] || { echo "build first: cmake --build $BUILD --target edl_sched_trace" >&2; exit 1; }
  "$TRACE" --seed "${SEED:-13}" --seeds "${SEEDS:-5}" --jobs "${JOBS:-200}" --nodes "${NODES:-64}" \
    --slots "${SLOTS:-8}" --mean_interarrival_s "${GAP_S:-60}" \
    --min_change_interval_s "${INTERVAL_S:-120}" --alpha "${ALPHA:-0.9}" \
    --start_s "${START_S:-30}" --reform_s "${REFORM_S:-30}"
fi
