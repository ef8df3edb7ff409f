#!/usr/bin/env bash
# Checkpoint store benchmark (~1 minute). ResNet-50-sized state (25.6M params fp32 + momentum +
# BN running stats = 204.7 MB, 428 tensors):
#  - save and load through the RocksDB store vs a raw sequential write+fsync and read of the same
#    bytes in the same run (page cache dropped before every read when root), for each save method
#    (SST ingest = the default; one synced WriteBatch; WriteBatch with BlobDB) — median of 3;
#  - the training stall of an async save: median step time of a CPU-bound step loop (a fixed
#    single-threaded FMA kernel stands in for compute, ~100 ms/step) with a save in flight vs
#    without.
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
run stall --steps 40
rm -rf "$SCRATCH"
