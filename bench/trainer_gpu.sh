#!/bin/bash
# bench/trainer_gpu.sh: `edl train --device cuda` next to PyTorch eager on the same GPU, in one
# invocation: ResNet-50, 224x224 synthetic images, bf16 compute (ours: --precision bf16 with fp32
# master weights; PyTorch: torchvision resnet50, channels_last, torch.autocast(bfloat16), SGD
# momentum), the largest batch <= 256 that fits for both. Prints images/s and the per-step
# breakdown in GPU time from CUDA events (EDL_CUDA_PHASE_TIMES=1 for edl, torch.cuda.Event for
# PyTorch): h2d (~0 here), forward, backward, allreduce (ours: the in-band write, the all-reduce at
# world size 1 and the read-back; PyTorch has none), update and idle (the GPU waiting for the host
# between steps). On each side the phases tile the step, from one step's first event to the next
# step's, so they sum to the step time: `RESULT ..._phase_sum_of_step` shows each side's sum as a
# fraction of its step (1.000 when the breakdown is complete).
#
# Both sides time the same steady window on device-resident data:
#   - data: one batch made once and kept on the device (ours: --resident_batch, which loads and
#     uploads the first batch once and feeds it every step; PyTorch: tensors created on the GPU
#     once), so neither side generates or uploads images inside the window;
#   - window: steps WARMUP+1 .. WARMUP+STEPS. The WARMUP steps before it hold cuDNN's algorithm
#     search (ours on the first step of each shape; PyTorch's cudnn.benchmark) and the allocator's
#     growth. Ours is the progress line printed at step WARMUP+STEPS (--log_every STEPS, WARMUP a
#     multiple of STEPS, so that line covers exactly the window), never the whole-run summary.
#
# Takes ~3-5 min on an H100 (the batch probe runs each side a few steps per candidate).
# Without a visible GPU it prints one SKIP line and exits 0.
# Knobs: EDL (default build/edl, or the wrapper of scripts/build_gpu_bundle.sh), PYTHON (a python
# with CUDA PyTorch + torchvision, default python3), STEPS (timed steps, default 40), WARMUP
# (default STEPS; must be a multiple of STEPS), BATCHES (candidates, default "256 192 128 96 64 32";
# a single one is used without probing).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
EDL=${EDL:-build/edl}
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-$STEPS}
BATCHES=${BATCHES:-"256 192 128 96 64 32"}
if [ $((WARMUP % STEPS)) -ne 0 ] || [ "$WARMUP" -lt "$STEPS" ]; then
  echo "WARMUP ($WARMUP) must be a positive multiple of STEPS ($STEPS): the progress line at step WARMUP+STEPS then covers exactly the timed window" >&2
  exit 2
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -eq 0 ]; then
  echo "SKIP trainer_gpu: no GPU visible (nvidia-smi -L lists none); run on a GPU host, see scripts/build_gpu_bundle.sh"
  exit 0
fi
if [ ! -x "$EDL" ]; then
  echo "SKIP trainer_gpu: $EDL not found; build it (make) or set EDL=" ; exit 0
fi
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
echo "# GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader -i 0)"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (a > 0 && b > 0 ? a / b : 0) }'; }

# edl run: WARMUP warm-up steps, then `steps` timed ones on the one device-resident batch; prints
# every progress line (stdout). edl_window_ips picks the one that closes the timed window.
edl_run() {  # batch steps [env...]
  local b=$1 steps=$2
  shift 2
  env "$@" "$EDL" train --device cuda --precision bf16 --model resnet50 --data synthetic \
    --image_size 224 --channels 3 --batch_size "$b" --synthetic_train "$b" --resident_batch true \
    --epochs 1000000 --max_steps $((steps + WARMUP)) --log_every "$steps" --eval false --lr 0.1 \
    --base_batch 256 --lr_decay constant 2>/tmp/edl_gpu_bench.err
}
# images/s of the progress line at step WARMUP+steps (it covers steps WARMUP+1 .. WARMUP+steps).
edl_window_ips() {  # steps (reads edl_run's stdout)
  awk -v s=$((WARMUP + $1)) '$1 == "epoch" && $4 == s { for (i = 1; i < NF; i++) if ($i == "images/s") print $(i + 1) }'
}

# ---- PyTorch reference (same model, batch, recipe; one batch created on the GPU once)
read -r -d '' PYREF <<'EOF'
import sys, time, torch, torchvision
b, steps, warmup = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
model = torchvision.models.resnet50(num_classes=10).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
lossf = torch.nn.CrossEntropyLoss()
x_dev = torch.randn(b, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
y_dev = torch.randint(0, 10, (b,), device=dev)
def events():
    return [torch.cuda.Event(enable_timing=True) for _ in range(5)]
def step(ev=None):
    if ev: ev[0].record()
    x, y = x_dev, y_dev  # device-resident, as ours (--resident_batch): no h2d in the window
    if ev: ev[1].record()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = lossf(model(x), y)
    if ev: ev[2].record()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if ev: ev[3].record()
    opt.step()
    if ev: ev[4].record()
try:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    ips = b * steps / (time.perf_counter() - t0)
    # Breakdown: 10 steps back to back (no synchronisation between them, as in the timed window);
    # each step ends where the next one's first event is, so the phases sum to the step.
    evs = [events() for _ in range(11)]
    for ev in evs:
        step(ev)
    torch.cuda.synchronize()
    ph = dict(step=0.0, h2d=0.0, forward=0.0, backward=0.0, update=0.0, idle=0.0)
    for k in range(10):
        e, nxt = evs[k], evs[k + 1][0]
        ph["h2d"] += e[0].elapsed_time(e[1])
        ph["forward"] += e[1].elapsed_time(e[2])
        ph["backward"] += e[2].elapsed_time(e[3])
        ph["update"] += e[3].elapsed_time(e[4])
        ph["idle"] += e[4].elapsed_time(nxt)
        ph["step"] += e[0].elapsed_time(nxt)
    print("ips %.1f " % ips + " ".join("%s_ms %.3f" % (k, v / 10) for k, v in ph.items()) +
          " allreduce_ms 0.000")
except torch.cuda.OutOfMemoryError:
    print("oom")
EOF

# ---- largest batch that fits both (one candidate: taken as given, no probe runs)
batch=""
# shellcheck disable=SC2086  # a list
set -- $BATCHES
[ $# -eq 1 ] && batch=$1
for b in $([ -z "$batch" ] && echo "$BATCHES"); do
  if edl_run "$b" 2 >/dev/null && ref=$($PYTHON -c "$PYREF" "$b" 2 2 2>/dev/null) && [[ "$ref" != oom* ]] && [ -n "$ref" ]; then
    batch=$b
    break
  fi
  echo "# batch $b does not fit (edl: $(tail -1 /tmp/edl_gpu_bench.err 2>/dev/null))"
done
if [ -z "$batch" ]; then
  echo "SKIP trainer_gpu: no batch in ($BATCHES) ran for both edl and PyTorch; see /tmp/edl_gpu_bench.err"
  exit 0
fi
echo "# batch $batch, $STEPS timed steps after $WARMUP warm-up"

# ---- throughput (no event timing), then the breakdown run
ours=$(edl_run "$batch" "$STEPS" | edl_window_ips "$STEPS")  # the window's line, never the summary
ref_line=$($PYTHON -c "$PYREF" "$batch" "$STEPS" "$WARMUP")
ref=$(echo "$ref_line" | awk '{print $2}')
echo "RESULT resnet50_224_bf16_b${batch}_images_per_s ours=${ours}img/s ref=${ref}img/s ratio=$(ratio "$ours" "$ref")"

edl_run "$batch" "$STEPS" EDL_CUDA_PHASE_TIMES=1 >/dev/null
phases=$(grep EDL_CUDA_PHASE_TIMES /tmp/edl_gpu_bench.err | tail -1)
echo "# edl phases (GPU ms per step): $phases"
echo "# PyTorch phases (GPU ms per step): $ref_line"
ours_sum=0
ref_sum=0
for p in h2d forward backward allreduce update idle; do
  o=$(echo "$phases" | grep -o "${p}_ms=[0-9.]*" | cut -d= -f2)
  r=$(echo "$ref_line" | grep -o "${p}_ms [0-9.]*" | awk '{print $2}')
  ours_sum=$(awk -v a="$ours_sum" -v b="${o:-0}" 'BEGIN { printf "%.3f", a + b }')
  ref_sum=$(awk -v a="$ref_sum" -v b="${r:-0}" 'BEGIN { printf "%.3f", a + b }')
  echo "RESULT resnet50_224_bf16_b${batch}_${p}_ms ours=${o:-0}ms ref=${r:-0}ms ratio=$(ratio "${r:-0}" "${o:-0}")"
done
o_step=$(echo "$phases" | grep -o "step_ms=[0-9.]*" | cut -d= -f2)
r_step=$(echo "$ref_line" | grep -o "step_ms [0-9.]*" | awk '{print $2}')
echo "RESULT resnet50_224_bf16_b${batch}_step_ms ours=${o_step:-0}ms ref=${r_step:-0}ms ratio=$(ratio "${r_step:-0}" "${o_step:-0}")"
# The breakdown is complete when the phases sum to the step on each side (1.000 of it).
o_frac=$(ratio "$ours_sum" "${o_step:-0}")
r_frac=$(ratio "$ref_sum" "${r_step:-0}")
echo "RESULT resnet50_224_bf16_b${batch}_phase_sum_of_step ours=${o_frac} ref=${r_frac} ratio=$(ratio "$o_frac" "$r_frac")"
