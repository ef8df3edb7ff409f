#!/bin/bash
# bench/input_pipeline.sh: the ImageFolder input pipeline (JPEG decode with DCT-domain scaling,
# RandomResizedCrop 224 + flip + normalise, batching, prefetch) against torchvision's ImageFolder +
# DataLoader with the same transforms (bench/input_pipeline_reference.py; Debian python3-torchvision,
# PIL), in the same run, on a generated set of ~500x375 quality-90 JPEGs (scripts/make_imagefolder.sh):
#   input_pipeline_t{1,2}: images/s per core at 1 and 2 decode threads (ours: --data_threads,
#     theirs: DataLoader num_workers), per core = images/s / threads.
#   resnet50_cpu_imagefolder: ResNet-50 (batch 8, CPU) end to end on the same set vs synthetic
#     tensors: what the pipeline costs a CPU trainer (ratio 1.0 = nothing).
# Prints the load average with the figures (the machine may be shared). Takes ~3 min on 2 cores.
# Knobs: BUILD (default build), SET (default /tmp/edl-input-bench: generated once, reused),
# THREADS (compute threads of the ResNet-50 runs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SET=${SET:-/tmp/edl-input-bench}
THREADS=${THREADS:-2}
PY=/usr/bin/python3

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
per() { awk -v a="$1" -v t="$2" 'BEGIN { printf "%.1f", a / t }'; }
field() { awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }'; }
load() { echo "load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"; }

if [ ! -f "$SET/manifest.txt" ]; then
  scripts/make_imagefolder.sh "$SET" --classes 10 --train_per_class 60 --val_per_class 4 \
    --size 500x375 --quality 90 --broken no
fi

for t in 1 2; do
  ours=$("$BUILD/edl_input_bench" --data_dir "$SET" --data_threads "$t" --batch_size 32 \
           --warmup 2 --batches 15 | field images/s)
  ref=$($PY bench/input_pipeline_reference.py --data_dir "$SET" --workers "$t" --batch_size 32 \
          --warmup 2 --batches 15 | field images/s)
  echo "input pipeline, $t thread(s): ours $ours images/s, torchvision $ref images/s ($(load))"
  echo "RESULT input_pipeline_t${t}_images_per_s_per_core ours=$(per "$ours" "$t")img/s ref=$(per "$ref" "$t")img/s ratio=$(ratio "$ours" "$ref")"
done

# images/s of the progress line at step WARM+STEPS, which covers steps WARM+1..WARM+STEPS.
edl_ips() {  # $1 warm-up steps, $2 timed steps, train flags...
  local warm=$1 steps=$2; shift 2
  "$BUILD/edl" train --model resnet50 --threads "$THREADS" --eval false --batch_size 8 \
    --max_steps $((warm + steps)) --log_every "$steps" "$@" |
    awk -v s=$((warm + steps)) '$1 == "epoch" && $4 == s { for (i = 1; i < NF; i++) if ($i == "images/s") print $(i + 1) }'
}
real=$(edl_ips 4 8 --data imagefolder --data_dir "$SET" --image_size 224 --data_threads 1)
synth=$(edl_ips 4 8 --data synthetic --image_size 224 --synthetic_train 96)
echo "ResNet-50 CPU batch 8, $THREADS threads: imagefolder $real images/s, synthetic $synth images/s ($(load))"
echo "RESULT resnet50_cpu_imagefolder_vs_synthetic ours=${real}img/s ref=${synth}img/s ratio=$(ratio "$real" "$synth")"
