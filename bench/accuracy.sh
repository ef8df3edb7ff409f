#!/bin/bash
# bench/accuracy.sh: test accuracy of `edl train` vs PyTorch 1.13 (bench/pytorch_reference.py) on
# Fashion-MNIST with ResNet-20, batch 128, after every epoch, over several seeds per side, for two
# recipes:
#   cosine:   lr 0.1 cosine-decayed per step, weight decay 5e-4 on conv/fc weights, 28 px;
#   constant: lr 0.1, no decay, weight decay 5e-4 on every parameter (BN and bias too), 32 px, where
#             epoch-1 accuracy is sensitive to initialisation and BN running statistics.
# Prints per epoch mean ± half the min-max spread for each side, and one RESULT per recipe and epoch
# (ratio of the means). Each run is one process at a time with THREADS threads.
# Takes ~45 min on 2 idle cores for the defaults. Knobs: SEEDS ("1 2 3"), EPOCHS (3),
# RECIPES ("cosine constant"), THREADS (2), EDL (build/edl), KEEP (a directory that keeps each run's
# per-epoch accuracies; default: a temporary one, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
EDL=${EDL:-build/edl}
THREADS=${THREADS:-2}
SEEDS=${SEEDS:-1 2 3}
EPOCHS=${EPOCHS:-3}
RECIPES=${RECIPES:-cosine constant}
PY=/usr/bin/python3
if [ -n "${KEEP:-}" ]; then
  OUT=$KEEP; mkdir -p "$OUT"
else
  OUT=$(mktemp -d /tmp/edl-accuracy-XXXXXX); trap 'rm -rf "$OUT"' EXIT
fi
# Nothing here is timed, so OpenMP threads sleep rather than spin while they wait: on a shared,
# loaded machine spinning threads of both sides (GNU OpenMP) slow every run several-fold.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores"

edl_flags() {  # $1 recipe
  case $1 in
    cosine) echo "--lr_decay cosine --image_size 28 --decay_bn_and_bias false" ;;
    constant) echo "--lr_decay constant --image_size 32 --decay_bn_and_bias true" ;;
  esac
}
for recipe in $RECIPES; do
  for seed in $SEEDS; do
    # shellcheck disable=SC2046
    "$EDL" train --threads "$THREADS" --log_every 0 --model resnet20 --data fashion-mnist \
      --batch_size 128 --base_batch 128 --lr 0.1 --weight_decay 5e-4 --epochs "$EPOCHS" --seed "$seed" \
      $(edl_flags "$recipe") | awk '$1 == "eval" { for (i = 1; i < NF; ++i) if ($i == "acc") { a = $(i + 1); sub("%", "", a); print $3, a } }' \
      > "$OUT/edl.$recipe.$seed"
    size=28; [ "$recipe" = constant ] && size=32
    $PY bench/pytorch_reference.py accuracy --model resnet20 --batch 128 --threads "$THREADS" \
      --epochs "$EPOCHS" --seed "$seed" --recipe "$recipe" --image_size "$size" |
      awk '$1 == "epoch" { print $2, $4 }' > "$OUT/ref.$recipe.$seed"
    echo "$recipe seed $seed: edl $(awk '{printf "%s ", $2}' "$OUT/edl.$recipe.$seed")| pytorch $(awk '{printf "%s ", $2}' "$OUT/ref.$recipe.$seed")"
  done
done
$PY - "$OUT" "$RECIPES" "$EPOCHS" <<'PY'
import glob, statistics, sys
out, recipes, epochs = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def per_epoch(side, recipe):
    acc = {}
    for f in glob.glob(f"{out}/{side}.{recipe}.*"):
        for line in open(f):
            e, a = line.split()
            acc.setdefault(int(e), []).append(float(a))
    return acc
for r in recipes:
    ours, ref = per_epoch("edl", r), per_epoch("ref", r)
    for e in range(1, epochs + 1):
        o, p = ours.get(e, []), ref.get(e, [])
        if not o or not p:
            print(f"RESULT resnet20_fmnist_{r}_test_acc_ep{e} ours=nan ref=nan ratio=nan"); continue
        mo, mp = statistics.mean(o), statistics.mean(p)
        so, sp = (max(o) - min(o)) / 2, (max(p) - min(p)) / 2
        print(f"# {r} epoch {e}: edl {mo:.2f} ± {so:.2f} % (n={len(o)}) vs pytorch {mp:.2f} ± {sp:.2f} % (n={len(p)})")
        print(f"RESULT resnet20_fmnist_{r}_test_acc_ep{e} ours={mo:.2f}% ref={mp:.2f}% ratio={mo / mp:.3f}")
PY
