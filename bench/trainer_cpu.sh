#!/bin/bash
# bench/trainer_cpu.sh: `edl train` on CPU (oneDNN) next to PyTorch 1.13 (Debian python3-torch) with
# the same model, batch, threads and data, in one invocation: images/s over the same steady window
# on both sides (steps W+1..W+S after W warm-up steps; ours is the progress line that closes that
# window, never the whole-run summary), against PyTorch as the reference scripts write it (eager)
# and against PyTorch with its best CPU settings (channels_last + TorchScript, labelled "best").
#   ResNet-20 on Fashion-MNIST (batch 128) and ResNet-50 224x224 synthetic (batch 8).
# Accuracy (several seeds, two recipes) is bench/accuracy.sh.
# Takes ~3 min on 2 cores. Knobs: THREADS (default 2), EDL (default build/edl).
set -euo pipefail
cd "$(dirname "$0")/.."
EDL=${EDL:-build/edl}
THREADS=${THREADS:-2}
PY=/usr/bin/python3
REF=bench/pytorch_reference.py

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores"
# images/s of the progress line at step WARM+STEPS, which covers steps WARM+1..WARM+STEPS.
edl_ips() {  # $1 warm-up steps, $2 timed steps, train flags...
  local warm=$1 steps=$2; shift 2
  "$EDL" train --threads "$THREADS" --eval false --max_steps $((warm + steps)) --log_every "$steps" "$@" |
    awk -v s=$((warm + steps)) '$1 == "epoch" && $4 == s { for (i = 1; i < NF; i++) if ($i == "images/s") print $(i + 1) }'
}
ref_ips() { $PY $REF throughput --threads "$THREADS" "$@" | awk '{print $2}'; }
report() {  # $1 name, $2 ours, $3 ref eager, $4 ref best
  echo "RESULT $1 ours=$2img/s ref=$3img/s ratio=$(ratio "$2" "$3")"
  echo "RESULT ${1}_vs_pytorch_best ours=$2img/s ref=$4img/s ratio=$(ratio "$2" "$4")"
}

args=(--model resnet20 --data fashion-mnist)
ours=$(edl_ips 30 30 "${args[@]}" --batch_size 128)
ref=$(ref_ips "${args[@]}" --batch 128 --warmup 30 --steps 30)
best=$(ref_ips "${args[@]}" --batch 128 --warmup 30 --steps 30 --best)
report "resnet20_fmnist_b128_t${THREADS}_images_per_s" "$ours" "$ref" "$best"

args=(--model resnet50 --data synthetic --image_size 224)
ours=$(edl_ips 6 6 "${args[@]}" --batch_size 8 --synthetic_train 96)
ref=$(ref_ips "${args[@]}" --batch 8 --warmup 6 --steps 6)
best=$(ref_ips "${args[@]}" --batch 8 --warmup 6 --steps 6 --best)
report "resnet50_224_synthetic_b8_t${THREADS}_images_per_s" "$ours" "$ref" "$best"
