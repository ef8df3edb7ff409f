#!/bin/bash
# bench/trainer_cpu.sh: `edl train` on CPU (oneDNN) next to PyTorch 1.13 (Debian python3-torch) with
# the same model, batch, threads and recipe, in one invocation.
#   images/s: ResNet-20 on Fashion-MNIST (batch 128) and ResNet-50 224x224 synthetic (batch 8)
#   test accuracy: ResNet-20 on Fashion-MNIST after 1 and 3 epochs (lr 0.1, cosine, wd 5e-4)
# Takes ~2 min with QUICK=1 (throughput + 1 epoch), ~15 min in full on 2 cores.
# Knobs: THREADS (default 2), EDL (default build/edl), QUICK=1 skips the 3-epoch runs.
set -euo pipefail
cd "$(dirname "$0")/.."
EDL=${EDL:-build/edl}
THREADS=${THREADS:-2}
PY=/usr/bin/python3
REF=bench/pytorch_reference.py

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
# Last progress line's images/s (steady state: the first window includes primitive creation).
edl_ips() { "$EDL" train --threads "$THREADS" --eval false "$@" | grep -o 'images/s [0-9.]*' | tail -1 | awk '{print $2}'; }
edl_acc() { "$EDL" train --threads "$THREADS" --log_every 0 "$@" | grep -o 'test_acc [0-9.]*' | tail -1 | awk '{print $2}'; }

ours=$(edl_ips --model resnet20 --data fashion-mnist --batch_size 128 --max_steps 60 --log_every 30)
ref=$($PY $REF throughput --model resnet20 --data fashion-mnist --batch 128 --threads "$THREADS" --steps 30 | awk '{print $2}')
echo "RESULT resnet20_fmnist_b128_t${THREADS}_images_per_s ours=${ours}img/s ref=${ref}img/s ratio=$(ratio "$ours" "$ref")"

ours=$(edl_ips --model resnet50 --data synthetic --image_size 224 --batch_size 8 --max_steps 12 --log_every 6 --synthetic_train 96)
ref=$($PY $REF throughput --model resnet50 --data synthetic --image_size 224 --batch 8 --threads "$THREADS" --steps 6 --warmup 2 | awk '{print $2}')
echo "RESULT resnet50_224_synthetic_b8_t${THREADS}_images_per_s ours=${ours}img/s ref=${ref}img/s ratio=$(ratio "$ours" "$ref")"

epochs_list="1 3"
[ "${QUICK:-0}" = 1 ] && epochs_list="1"
for e in $epochs_list; do
  ours=$(edl_acc --model resnet20 --data fashion-mnist --batch_size 128 --epochs "$e" --lr 0.1 --base_batch 128 --lr_decay cosine --weight_decay 5e-4)
  ref=$($PY $REF accuracy --model resnet20 --batch 128 --threads "$THREADS" --epochs "$e" | awk '{print $2}')
  echo "RESULT resnet20_fmnist_test_acc_${e}ep ours=${ours}% ref=${ref}% ratio=$(ratio "$ours" "$ref")"
done
