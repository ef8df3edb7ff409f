#!/usr/bin/env bash
# Checkpoint store benchmark (~1 minute). ResNet-50-sized state (25.6M params fp32 + momentum +
# BN running stats = 204.7 MB, 428 tensors):
#  - save and load through the RocksDB store vs a raw sequential write+fsync and read of the same
#    bytes in the same run (page cache dropped before every read when root), for each save method
#    (SST ingest = the default; one synced WriteBatch; WriteBatch with BlobDB) — median of 3;
#  - the whole cost of async saves to the training thread: mean step time, timed from the step
#    boundary (so the synchronous snapshot copy counts) to the end of the step, of a loop whose
#    compute uses every core (an FMA kernel thread per core, ~100 ms/step) with a save due every
#    10 steps, against the same loop without saves, interleaved in one run. The step keeps every
#    core busy, so the background write competes with compute as it does in real training; every
#    save's write falls inside the timed steps (one still running after the last is waited for and
#    charged to the saves).
# Usage: bench/checkpoint.sh [BUILD_DIR] [SCRATCH_DIR]   (builds ckpt_bench if needed)
set -euo pipefail
BUILD=${1:-build}
SCRATCH=${2:-${TMPDIR:-/tmp}/edl-ckpt-bench}
cmake --build "$BUILD" -j2 --target ckpt_bench >/dev/null
BENCH=$(find "$BUILD" -name ckpt_bench -type f -perm -u+x | head -1)
run() { rm -rf "$SCRATCH"; "$BENCH" "$@" --dir "$SCRATCH" 2>/dev/null; }
for method in writebatch blob; do
  echo "== save method: $method"
  run save-load --method "$method" --repeats 3 | sed -e "s/^RESULT ckpt_/RESULT ckpt_${method}_/"
done
echo "== save method: sst (default)"
run save-load --method sst --repeats 3
echo "== stall"
run stall --steps 80 --every 10
rm -rf "$SCRATCH"
