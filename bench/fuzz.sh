#!/usr/bin/env bash
# Fuzzing run (~10-30 minutes on 2 cores): every libFuzzer harness of tests/fuzz (wire frames,
# message decoders, scaling script, --config INI, checkpoint metadata, image files, HTTP request
# heads, and the job server's decode and dispatch of type-mutated peer messages) under ASan+UBSan,
# starting from its seed corpus, until TOTAL executions have run across them, JOBS harnesses at a time. Each
# harness gets a share of TOTAL (percent, SHARES below) so that they take similar times: the config
# harness goes through Boost.Program_options and a file per input, ~20x slower than the others.
# A crash, leak, sanitizer report or timeout is saved as build-asan/fuzz/crashes/<harness>-<kind>-<sha1>
# (add it to tests/fuzz/corpus/<harness>/ once fixed, so ctest replays it) and the harness resumes
# with the corpus grown so far, at most MAX_CRASHES times per harness.
# Prints the executions done (TOTAL by construction: a budget, not a result), a RESULT line for the
# coverage fuzzing reached against what the seed corpus alone reaches, measured in the same run
# (libFuzzer's "cov:" edges after loading the corpus, INITED, and at the end; summed over the
# harnesses), and one for the crashes (target 0).
# Usage: bench/fuzz.sh [TOTAL]   env: JOBS (default nproc), ASAN_DIR (default build-asan),
#        BUILD=0 (use the harnesses already built there instead of `make asan`), ONLY (below)
set -euo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-10000000}
JOBS=${JOBS:-$(nproc)}
ASAN_DIR=${ASAN_DIR:-build-asan}
MAX_CRASHES=${MAX_CRASHES:-3}
HARNESSES=(frame messages scaling config ckpt_meta image http_request server_dispatch)
SHARES=(20 14 20 3 11 8 8 16)
# ONLY="h1 h2": these harnesses only, TOTAL shared equally (e.g. ONLY=server_dispatch).
if [ -n "${ONLY:-}" ]; then
  read -r -a HARNESSES <<<"$ONLY"
  SHARES=()
  for h in "${HARNESSES[@]}"; do
    [ -f "tests/fuzz/${h}_fuzzer.cc" ] || { echo "fuzz.sh: no harness '$h' (tests/fuzz/${h}_fuzzer.cc)" >&2; exit 2; }
    SHARES+=($(( 100 / ${#HARNESSES[@]} )))
  done
fi

targets=""
for h in "${HARNESSES[@]}"; do targets="$targets fuzz_$h"; done
if [ "${BUILD:-1}" != 0 ]; then
  make --no-print-directory asan ASAN_DIR="$ASAN_DIR" ASAN_TARGETS="${targets# }" JOBS="$JOBS" >/dev/null
fi

OUT="$ASAN_DIR/fuzz"
rm -rf "$OUT/work" "$OUT/logs"
mkdir -p "$OUT/work" "$OUT/logs" "$OUT/crashes"
# One harness: libFuzzer runs until `per` executions are done; after a crash it resumes with the
# corpus grown so far. Writes "<executions> <crashes>" to logs/<h>.result.
fuzz_one() {
  local h=$1 per=$2 done_runs=0 crashes=0 log n
  mkdir -p "$OUT/work/$h"
  cp tests/fuzz/corpus/"$h"/* "$OUT/work/$h/"
  while (( done_runs < per )); do
    log="$OUT/logs/$h.$crashes.log"
    if "$OUT/fuzz_$h" "$OUT/work/$h" -runs=$(( per - done_runs )) -max_len=4096 -timeout=10 \
         -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$OUT/crashes/$h-" \
         >"$log" 2>&1; then
      n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
      done_runs=$(( done_runs + ${n:-0} ))
      break
    fi
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    done_runs=$(( done_runs + ${n:-0} ))
    crashes=$(( crashes + 1 ))
    echo "fuzz: $h: crash $crashes after $done_runs executions; see $log" >&2
    grep -m1 -E 'ERROR: |FUZZ_CHECK|runtime error|==[0-9]+==' "$log" >&2 || true
    (( crashes < MAX_CRASHES )) || break
  done
  echo "$done_runs $crashes" >"$OUT/logs/$h.result"
  echo "fuzz: $h: $done_runs executions, $crashes crashes, corpus $(ls "$OUT/work/$h" | wc -l) inputs" >&2
}
export -f fuzz_one
export OUT MAX_CRASHES

start=$(date +%s)
for i in "${!HARNESSES[@]}"; do
  echo "${HARNESSES[$i]} $(( (TOTAL * SHARES[i] + 99) / 100 ))"
done | xargs -P "$JOBS" -L1 bash -c 'fuzz_one "$0" "$1"'
secs=$(( $(date +%s) - start ))

execs=0
crashes=0
cov_seed=0
cov_end=0
for h in "${HARNESSES[@]}"; do
  read -r n c <"$OUT/logs/$h.result"
  execs=$(( execs + n ))
  crashes=$(( crashes + c ))
  # The first run's INITED line is the seed corpus's coverage; the last run's last "cov:" the end's.
  s=$(sed -n 's/.*INITED cov: \([0-9]*\).*/\1/p' "$OUT/logs/$h.0.log" | head -1)
  e=$(grep -ho 'cov: [0-9]*' "$OUT/logs/$h.$(( c > 0 ? c - 1 : 0 )).log" "$OUT/logs/$h.$c.log" 2>/dev/null \
      | tail -1 | cut -d' ' -f2)
  echo "fuzz: $h: coverage ${s:-?} edges from the seed corpus, ${e:-?} after fuzzing"
  cov_seed=$(( cov_seed + ${s:-0} ))
  cov_end=$(( cov_end + ${e:-0} ))
done
echo "fuzz: $execs executions (the budget, TOTAL) in $secs s with $JOBS jobs; load: $(uptime)"
echo "RESULT fuzz_coverage ours=${cov_end}edges ref=${cov_seed}edges ratio=$(awk -v a="$cov_end" -v b="$cov_seed" \
  'BEGIN { printf "%.3f", b > 0 ? a / b : 0 }')"
echo "RESULT fuzz_crashes ours=${crashes}crashes ref=0crashes"
