#!/bin/bash
# bench/trainer_gpu.sh: `edl train --device cuda` next to PyTorch eager on the same GPU, in one
# invocation: ResNet-50, 224x224 synthetic images, bf16 compute (ours: --precision bf16 with fp32
# master weights; PyTorch: torchvision resnet50, channels_last, torch.autocast(bfloat16), SGD
# momentum), the largest batch <= 256 that fits for both. Prints images/s and the per-step
# breakdown (forward, backward, update, and h2d, ~0 here; GPU time from CUDA events:
# EDL_CUDA_PHASE_TIMES=1 for edl, torch.cuda.Event for PyTorch).
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
# (default STEPS; must be a multiple of STEPS), BATCHES (candidates, default "256 192 128 96 64 32").
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
ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
phase = [0.0] * 4
def step(timed):
    ev[0].record()
    x, y = x_dev, y_dev  # device-resident, as ours (--resident_batch): no h2d in the window
    ev[1].record()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = lossf(model(x), y)
    ev[2].record()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    ev[3].record()
    opt.step()
    ev[4].record()
    if timed:
        torch.cuda.synchronize()
        for i in range(4):
            phase[i] += ev[i].elapsed_time(ev[i + 1])
try:
    for _ in range(warmup):
        step(False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(False)
    torch.cuda.synchronize()
    ips = b * steps / (time.perf_counter() - t0)
    for _ in range(10):
        step(True)
    print("ips %.1f h2d_ms %.3f forward_ms %.3f backward_ms %.3f update_ms %.3f" %
          (ips, phase[0] / 10, phase[1] / 10, phase[2] / 10, phase[3] / 10))
except torch.cuda.OutOfMemoryError:
    print("oom")
EOF

# ---- largest batch that fits both
batch=""
for b in $BATCHES; do
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
for p in h2d forward backward update; do
  o=$(echo "$phases" | grep -o "${p}_ms=[0-9.]*" | cut -d= -f2)
  r=$(echo "$ref_line" | grep -o "${p}_ms [0-9.]*" | awk '{print $2}')
  echo "RESULT resnet50_224_bf16_b${batch}_${p}_ms ours=${o:-0}ms ref=${r:-0}ms ratio=$(ratio "${r:-0}" "${o:-0}")"
done
