#!/usr/bin/env bash
# gpu_check.sh: one call that proves EDL's GPU path on a host with one NVIDIA GPU, a driver and a
# CUDA 13 PyTorch (its wheels carry cuDNN, cuBLAS and NCCL) and nothing else. `make gpu-check`
# packs it with the edl bundle, the GPU test binaries and a Fashion-MNIST subset into
# build/gpu-check.tar.gz; on the GPU host:
#
#   tar xzf gpu-check.tar.gz && gpu-check/gpu_check.sh OUT_DIR
#
# prints one PASS/FAIL line per check, the RESULT lines of the measurements, and writes
# OUT_DIR/report.txt (those lines, the host, the GPU, the versions), OUT_DIR/checkN.log (each
# check's whole output) and OUT_DIR/logs.tar.gz (every log of the run, for hosts that hand back
# only a few files). Exit status 0 only when every check passed. Checks 1-7 took about 6 min on
# an H100 (2026-11-26, two partial runs; EDL_NCCL_TEST_CYCLES=20 shortens check 1 by ~80 s).
#
#   1  the CUDA ops and parity tests, the NCCL communicator tests (100 abort/re-init cycles with
#      the device memory before and after; a host-argument collective aborted while its stream is
#      blocked returns within 2 s), the NVML GPU-utilisation test: no failure and no skip
#   2  `edl train --device cuda --comm nccl` at world size 1 on Fashion-MNIST, fp32 and bf16, each
#      within 1 point of test accuracy of the CPU run of the same recipe
#   3  an elastic job of 4 CUDA trainers sharing the GPU over --comm gloo (`scripts/demo.sh
#      --short`: server + 2 clients on loopback) through a shrink, a grow and a SIGKILL: identical
#      state on every member after every re-form and exactly-once data (edl_chaos_check), falling
#      loss
#   4  bench/trainer_gpu.sh: ResNet-50 224 px bf16 batch 256 against the host's PyTorch
#   5  `edl teacher --device cuda` answering a student: its answers pick the same classes as the
#      CPU backend's teacher on the same checkpoint (teacher_top1 within 0.5 points)
#   6  `--data imagefolder --device cuda` images/s against `--data synthetic`: whether the decode
#      pool keeps the GPU fed (the ratio is reported, not judged)
#   7  `edl ctl status` of a cluster server shows a measured GPU-UTILS while a CUDA trainer runs
#
# --dry_run runs the same script on a CPU host with every GPU step replaced by its CPU twin
# (--device cpu, --comm gloo, smaller runs, the benchmark's no-GPU path), so the script cannot rot
# between device runs; the ctest case gpu_check_dry_run runs it from the source tree.
#
#   gpu_check.sh [--dry_run] [--checks 1,2,...] OUT_DIR
#
# Paths, from the environment (defaults: the bundle next to this script, else the source tree's
# build/): GPU_CHECK_EDL (the edl binary or bundle wrapper), GPU_CHECK_TESTS (directory of the
# test binaries), GPU_CHECK_CHAOS (edl_chaos_check), GPU_CHECK_DATA (Fashion-MNIST idx files),
# GPU_CHECK_TRAIN_SAMPLES (their training samples used), GPU_CHECK_IMAGES (an image folder),
# EDL_PYTHON (the python with CUDA PyTorch, default python3).
set -uo pipefail

DRY=0
CHECKS="1,2,3,4,5,6,7"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry_run) DRY=1 ;;
    --checks) CHECKS=$2; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 1 ] || { echo "usage: gpu_check.sh [--dry_run] [--checks 1,2,...] OUT_DIR" >&2; exit 2; }
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)

# The bundle (gpu-check/: edl-gpu/, data/, scripts/, bench/, config/) or the source tree.
if [ -d "$HERE/edl-gpu" ]; then
  ROOT=$HERE
  EDL=${GPU_CHECK_EDL:-$ROOT/edl-gpu/edl}
  TESTS=${GPU_CHECK_TESTS:-$ROOT/edl-gpu/tests}
  CHAOS=${GPU_CHECK_CHAOS:-$ROOT/edl-gpu/tests/edl_chaos_check}
  DATA=${GPU_CHECK_DATA:-$ROOT/data/fashion-mnist}
  IMAGES=${GPU_CHECK_IMAGES:-$ROOT/data/imagefolder}
  PATH="$ROOT/edl-gpu/tools:$PATH"  # jq for scripts/demo.sh (GPU hosts often lack it)
else
  ROOT=$(dirname "$HERE")
  EDL=${GPU_CHECK_EDL:-$ROOT/build/edl}
  TESTS=${GPU_CHECK_TESTS:-$ROOT/build/tests}
  CHAOS=${GPU_CHECK_CHAOS:-$ROOT/build/edl_chaos_check}
  DATA=${GPU_CHECK_DATA:-/usr/share/datasets/fashion-mnist}
  IMAGES=${GPU_CHECK_IMAGES:-}
fi
# Test binaries and edl_chaos_check run with the bundle's libraries (edl-gpu/run sets
# LD_LIBRARY_PATH as the edl wrapper does): their RUNPATH names this build tree, which a GPU host
# does not have. In the source tree they find them by their RUNPATH.
RUN=()
[ -x "$ROOT/edl-gpu/run" ] && RUN=("$ROOT/edl-gpu/run")
TRAIN_SAMPLES=${GPU_CHECK_TRAIN_SAMPLES:-12000}
if [ "$DRY" = 1 ] && [ -z "${GPU_CHECK_DATA:-}" ]; then
  # The CPU twins train briefly and evaluate on a small test set: a subset of this host's copy.
  TRAIN_SAMPLES=${GPU_CHECK_TRAIN_SAMPLES:-1200}
  python3 "$ROOT/scripts/fashion_subset.py" "$DATA" "$OUT/fashion-subset" "$TRAIN_SAMPLES" 500 || exit 2
  DATA="$OUT/fashion-subset"
fi
PY=${EDL_PYTHON:-python3}
export EDL_PYTHON=$PY
if [ "$DRY" = 1 ]; then DEVICE=cpu COMM=gloo; else DEVICE=cuda COMM=nccl; fi
REPORT=$OUT/report.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

# ---- processes: every one started here is stopped by pid at exit
PIDS=()
start_bg() {  # LOG CMD...: starts CMD in the background; its pid in BG_PID
  local log=$1
  shift
  "$@" >"$log" 2>&1 </dev/null &
  BG_PID=$!
  PIDS+=("$BG_PID")
}
stop_pids() {
  local p i
  for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
  for ((i = 0; i < 50; i++)); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "$@"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  return 0
}
trap 'stop_pids "${PIDS[@]}"' EXIT
wait_file() {  # FILE SECONDS: until FILE is non-empty
  local i
  for ((i = 0; i < $2 * 10; i++)); do [ -s "$1" ] && return 0; sleep 0.1; done
  return 1
}

ensure_secret() {
  [ -s "$OUT/secret" ] && return 0
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$OUT/secret")
}
# The last "acc NN.NN%" of an `edl train` output (its final evaluation).
final_acc() { grep -o 'acc [0-9.]*%' "$1" | tail -1 | tr -dc '0-9.'; }
# images/s of the last progress line.
last_ips() { grep -o 'images/s [0-9.]*' "$1" | tail -1 | awk '{print $2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (a > 0 && b > 0 ? a / b : 0) }'; }
within() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { x = a - b; if (x < 0) x = -x; exit !(a != "" && b != "" && x <= d) }'; }
train() {  # LOG FLAGS...: edl train on the Fashion-MNIST subset
  local log=$1
  shift
  timeout 300 "$EDL" train --model resnet20 --data fashion-mnist --data_dir "$DATA" \
    --train_samples "$TRAIN_SAMPLES" --seed 1 --log_every 20 "$@" >"$log" 2>&1
}

# ---- checks; each runs in a subshell with its output in checkN.log; the last line it prints
# before failing is the reason on the FAIL line.

check1() {  # tests
  local bins filter ok=0
  if [ "$DRY" = 1 ]; then
    bins="nccl_communicator_test resnet50_cuda_parity_test resnet50_ops_test:*/0 jobclient_test:GpuUtilizationTest.*"
  else
    bins="nccl_communicator_test resnet50_cuda_parity_test resnet50_ops_test jobclient_test:GpuUtilizationTest.*"
  fi
  for b in $bins; do
    filter="${b#*:}"
    [ "$filter" = "$b" ] && filter='*'
    b="${b%%:*}"
    local exe
    exe=$(find "$TESTS" -name "$b" -type f -perm -u+x 2>/dev/null | head -1)
    [ -n "$exe" ] || { echo "test binary $b not found under $TESTS"; return 1; }
    echo "== $b --gtest_filter=$filter"
    local rc=0
    timeout 600 "${RUN[@]}" "$exe" --gtest_filter="$filter" >"$OUT/check1-$b.log" 2>&1 || rc=$?
    grep -E '^\[ *(PASSED|SKIPPED|FAILED) *\]|^  [a-z]' "$OUT/check1-$b.log" | head -40
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then ok=1; echo "$b failed (exit $rc): see $OUT/check1-$b.log"; fi
    # On a GPU host nothing may skip.
    local skipped
    skipped=$(sed -n 's/^\[  SKIPPED \] \([^ ]*\) ([0-9]* ms)$/\1/p' "$OUT/check1-$b.log")
    if [ "$DRY" = 0 ] && [ -n "$skipped" ]; then
      ok=1
      echo "$b skipped on a GPU host: $(echo "$skipped" | tr '\n' ' ')"
    fi
  done
  local cyc
  cyc=$(grep -o 'lost [-0-9.]* MiB' "$OUT/check1-nccl_communicator_test.log" | awk '{print $2}')
  [ -n "$cyc" ] && echo "RESULT nccl_100_abort_reinit_lost_mib ours=${cyc}MiB ref=0MiB ratio=1"
  local took
  took=$(grep -o 'returned [0-9.e-]* s after Abort' "$OUT/check1-nccl_communicator_test.log" | awk '{print $2}')
  [ -n "$took" ] && echo "RESULT nccl_blocked_host_arg_abort_s ours=${took}s ref=2s ratio=$(ratio 2 "$took")"
  [ "$ok" = 0 ] || { echo "a test binary failed or skipped (logs: $OUT/check1-*.log)"; return 1; }
}

check2() {  # world-size-1 training on GPU vs the CPU run of the same recipe
  local epochs=2 precs="fp32 bf16" ok=0 short=()
  # The twin: the same recipe as the CPU run, briefly (equal results).
  [ "$DRY" = 1 ] && epochs=1 precs="fp32" short=(--max_steps 6)
  train "$OUT/check2-cpu.log" --device cpu --comm gloo --epochs "$epochs" --batch_size 128 "${short[@]}" \
    --checkpoint_dir "$OUT/ckpt-cpu" || { echo "CPU run failed: $(tail -1 "$OUT/check2-cpu.log")"; return 1; }
  local ref
  ref=$(final_acc "$OUT/check2-cpu.log")
  for p in $precs; do
    local log="$OUT/check2-$DEVICE-$p.log" ours
    train "$log" --device "$DEVICE" --comm "$COMM" --precision "$p" --epochs "$epochs" --batch_size 128 "${short[@]}" ||
      { echo "$DEVICE $p run failed: $(tail -1 "$log")"; ok=1; continue; }
    ours=$(final_acc "$log")
    echo "RESULT fashion_resnet20_${p}_test_accuracy ours=${ours}% ref=${ref}% ratio=$(ratio "$ours" "$ref")"
    within "$ours" "$ref" 1.0 || { echo "$p: accuracy $ours% is not within 1 point of the CPU's $ref%"; ok=1; }
  done
  return "$ok"
}

check3() {  # elastic job of 4 trainers through shrink, grow, SIGKILL
  local dir="$OUT/check3" samples=$TRAIN_SAMPLES epochs=4
  [ "$DRY" = 1 ] && epochs=2
  rm -rf "$dir"
  mkdir -p "$dir"
  EDL_BIN="$EDL" EDL_DEMO_DIR="$dir" EDL_DEMO_TRAIN_SAMPLES="$samples" EDL_DEMO_EPOCHS="$epochs" \
    EDL_DEMO_TRAINER_FLAGS="--device $DEVICE --comm gloo --data_dir $DATA --sample_log $dir/samples.jsonl" \
    timeout 400 bash "$ROOT/scripts/demo.sh" --short || { echo "the elastic job did not finish (see $dir/logs)"; return 1; }
  local ev="$dir/events/demo.events.jsonl"
  "$PY" - "$ev" "$dir/samples.jsonl" "$DRY" <<'PY' || return 1
import json, sys
ev, samples, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def lines(p):
    for l in open(p):
        try:
            yield json.loads(l)
        except ValueError:
            pass  # a line cut by a SIGKILLed writer
gens = [e for e in lines(ev) if e.get("type") == "generation" and e.get("generation", 0) > 1]
kinds = set()
for g in gens:
    if g.get("failure"): kinds.add("failure")
    elif g["world_size_after"] < g["world_size_before"]: kinds.add("shrink")
    elif g["world_size_after"] > g["world_size_before"]: kinds.add("grow")
print("re-forms:", len(gens), "kinds:", sorted(kinds))
steps = {}
for s in lines(samples):
    if s.get("loss") is not None: steps.setdefault(s["step"], s["loss"])
order = [steps[k] for k in sorted(steps)]
n = max(1, min(20, len(order) // 4))
first, last = sum(order[:n]) / n, sum(order[-n:]) / n
print("RESULT elastic_4_trainers_loss_last_over_first ours=%.4f ref=1 ratio=%.3f" % (last / first, first / last))
missing = {"shrink", "grow", "failure"} - kinds
if missing and not dry:
    print("the job went through no", " and no ".join(sorted(missing)), "(training ended first? raise the epochs)")
    sys.exit(1)
if not last < first:
    print("the loss did not fall: first steps %.4f, last steps %.4f" % (first, last))
    sys.exit(1)
PY
  "${RUN[@]}" "$CHAOS" --sample_log "$dir/samples.jsonl" --events "$ev" \
    --labels "$DATA/train-labels-idx1-ubyte.gz" --train_samples "$samples" >"$dir/check.json" \
    2>"$dir/check.err" ||
    { echo "exactly-once data or identical state failed: $(tail -c 600 "$dir/check.json" | tr '\n' ' ') $(tail -3 "$dir/check.err" | tr '\n' ' ')"; return 1; }
  cat "$dir/check.json"
}

check4() {  # the GPU benchmark
  if [ "$DRY" = 1 ]; then  # its CPU twin: the no-GPU path must say SKIP and exit 0
    local out
    out=$(EDL="$EDL" PYTHON="$PY" bash "$ROOT/bench/trainer_gpu.sh" 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    echo "$out" | grep -q '^SKIP trainer_gpu: no GPU' || { echo "no SKIP line without a GPU"; return 1; }
    return 0
  fi
  EDL="$EDL" PYTHON="$PY" BATCHES=256 STEPS=20 WARMUP=20 timeout 420 bash "$ROOT/bench/trainer_gpu.sh" \
    | tee "$OUT/check4-bench.txt" || { echo "bench/trainer_gpu.sh failed"; return 1; }
  grep -q 'images_per_s ours=[0-9][0-9.]*img/s ref=[0-9][0-9.]*img/s' "$OUT/check4-bench.txt" ||
    { echo "no images/s for both sides (edl: $(tail -1 /tmp/edl_gpu_bench.err 2>/dev/null))"; return 1; }
}

check5() {  # teacher on the GPU vs the CPU backend's answers
  ensure_secret
  [ -d "$OUT/ckpt-cpu" ] || train "$OUT/check5-ckpt.log" --device cpu --comm gloo --epochs 1 \
    --checkpoint_dir "$OUT/ckpt-cpu" || { echo "no checkpoint to serve"; return 1; }
  local top cpu_top="" gpu_top="" steps=20
  [ "$DRY" = 1 ] && steps=4
  for tdev in cpu "$DEVICE"; do
    rm -f "$OUT/teacher.port"
    start_bg "$OUT/check5-teacher-$tdev.log" "$EDL" teacher --service kd --name "t-$tdev" --model resnet20 \
      --checkpoint_dir "$OUT/ckpt-cpu" --data fashion-mnist --data_dir "$DATA" --device "$tdev" \
      --bind 127.0.0.1 --port 0 --port_file "$OUT/teacher.port" --secret_file "$OUT/secret"
    local tpid=$BG_PID
    wait_file "$OUT/teacher.port" 120 || { tail -3 "$OUT/check5-teacher-$tdev.log"; echo "teacher ($tdev) did not start"; stop_pids "$tpid"; return 1; }
    train "$OUT/check5-student-$tdev.log" --device "$DEVICE" --comm "$COMM" --max_steps "$steps" --batch_size 128 \
      --eval false --distill kd --distill_teachers "127.0.0.1:$(cat "$OUT/teacher.port")" \
      --secret_file "$OUT/secret"
    local rc=$?
    stop_pids "$tpid"
    [ "$rc" = 0 ] || { tail -2 "$OUT/check5-student-$tdev.log"; echo "student of the $tdev teacher failed"; return 1; }
    grep 'distill' "$OUT/check5-student-$tdev.log" | tail -1
    top=$(grep -o 'teacher_top1=[0-9.]*' "$OUT/check5-student-$tdev.log" | tail -1 | cut -d= -f2)
    if [ "$tdev" = cpu ]; then cpu_top=$top; fi
    gpu_top=$top
  done
  echo "RESULT teacher_${DEVICE}_top1_vs_cpu ours=${gpu_top}% ref=${cpu_top}% ratio=$(ratio "$gpu_top" "$cpu_top")"
  within "$gpu_top" "$cpu_top" 0.5 || { echo "the $DEVICE teacher's answers differ from the CPU's"; return 1; }
}

check6() {  # decode pool vs synthetic data
  local images=$IMAGES model=resnet50 prec=bf16 batch=128 steps=40 every=20 size=224
  if [ "$DRY" = 1 ]; then model=resnet18 prec=fp32 batch=4 steps=4 every=2 size=64; fi
  if [ -z "$images" ]; then
    images="$OUT/imagefolder"
    bash "$ROOT/scripts/make_imagefolder.sh" "$images" --train_per_class 8 --val_per_class 1 \
      --broken no >/dev/null || { echo "could not make an image folder"; return 1; }
  fi
  local common=(--model "$model" --device "$DEVICE" --precision "$prec" --batch_size "$batch"
    --max_steps "$steps" --log_every "$every" --eval false --epochs 1000 --image_size "$size")
  timeout 300 "$EDL" train "${common[@]}" --data imagefolder --data_dir "$images" >"$OUT/check6-imagefolder.log" 2>&1 ||
    { tail -2 "$OUT/check6-imagefolder.log"; echo "imagefolder run failed"; return 1; }
  timeout 300 "$EDL" train "${common[@]}" --data synthetic --channels 3 >"$OUT/check6-synthetic.log" 2>&1 ||
    { tail -2 "$OUT/check6-synthetic.log"; echo "synthetic run failed"; return 1; }
  local a b
  a=$(last_ips "$OUT/check6-imagefolder.log")
  b=$(last_ips "$OUT/check6-synthetic.log")
  echo "RESULT ${model}_${size}px_${prec}_imagefolder_vs_synthetic_images_per_s ours=${a}img/s ref=${b}img/s ratio=$(ratio "$a" "$b")"
  [ -n "$a" ] && [ -n "$b" ] || { echo "no images/s in the logs"; return 1; }
}

check7() {  # GPU-UTILS in `edl ctl status`
  ensure_secret
  local dir="$OUT/check7"
  rm -rf "$dir"
  mkdir -p "$dir/events" "$dir/logs"
  local slots="gpus = 0"
  [ "$DRY" = 1 ] && slots="slots = 1"
  cat >"$dir/client.ini" <<EOF
$slots
node_name = gpu-check
advertise_addr = 127.0.0.1
log_dir = $dir/logs
job_type = gpu = $EDL train --model resnet20 --data fashion-mnist --data_dir $DATA --device $DEVICE --comm $COMM --train_samples $TRAIN_SAMPLES --log_every 10 --eval false
job_flags = gpu = epochs
EOF
  printf 'name = g\ntype = gpu\nmin = 1\nmax = 1\npriority = 1\nmode = elastic\n[flags]\nepochs = 50\n' >"$dir/job.ini"
  start_bg "$dir/server.log" "$EDL" server --cluster --bind 127.0.0.1 --server_port 0 \
    --port_file "$dir/server.port" --secret_file "$OUT/secret" --events_dir "$dir/events"
  local spid=$BG_PID
  wait_file "$dir/server.port" 30 || { tail -3 "$dir/server.log"; echo "server did not start"; return 1; }
  local server="127.0.0.1:$(cat "$dir/server.port")"
  start_bg "$dir/client.log" "$EDL" client --config "$dir/client.ini" --server "$server" --secret_file "$OUT/secret"
  local cpid=$BG_PID
  local ctl=("$EDL" ctl --server "$server" --secret_file "$OUT/secret")
  # A job type is known once the client offering it has registered: retry the submission until then.
  local i submitted=1
  for ((i = 0; i < 60; i++)); do
    if "${ctl[@]}" submit "$dir/job.ini" >"$dir/submit.txt" 2>&1; then submitted=0; break; fi
    sleep 0.5
  done
  [ "$submitted" = 0 ] || { cat "$dir/submit.txt"; echo "submit failed"; stop_pids "$cpid" "$spid"; return 1; }
  local line="" found=1
  for ((i = 0; i < 120; i++)); do
    "${ctl[@]}" status >"$dir/status.txt" 2>&1
    line=$(awk '/GPU-UTILS/ { getline; print; exit }' "$dir/status.txt")
    if grep -q '^g .*running' "$dir/status.txt" && grep -q 'images/s' "$dir/logs/"*.log 2>/dev/null; then
      local gpu
      gpu=$(echo "$line" | awk '{print $5}')
      if [ "$DRY" = 1 ] || [[ "$gpu" == *% ]]; then found=0; break; fi
    fi
    sleep 1
  done
  cat "$dir/status.txt"
  "${ctl[@]}" cancel g >/dev/null 2>&1
  stop_pids "$cpid" "$spid"
  [ "$found" = 0 ] || { echo "no measured GPU-UTILS while the trainer ran (last: ${line:-none})"; return 1; }
  echo "RESULT ctl_status_gpu_utils ours=$(echo "$line" | awk '{print $5}') ref=n/a ratio=1"
}

# ---- preflight and the run
{
  echo "gpu_check $(date -u +%FT%TZ) on $(hostname) $([ "$DRY" = 1 ] && echo '(dry run: CPU twins)')"
  echo "edl: $EDL"
  if [ "$DRY" = 0 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | sed 's/^/python: /'
  fi
} | tee -a "$REPORT"
if [ "$DRY" = 0 ]; then
  if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    say "FAIL preflight: no NVIDIA GPU visible (nvidia-smi -L lists none): install the driver (>= 580 for CUDA 13) or run gpu_check.sh --dry_run"
    exit 1
  fi
  if [ -x "$ROOT/edl-gpu/edl" ] && ! "$ROOT/edl-gpu/edl" --bundle-check >"$OUT/bundle-check.log" 2>&1; then
    say "FAIL preflight: the bundle's libraries do not all resolve ($(tail -1 "$OUT/bundle-check.log")); install a CUDA 13 PyTorch (cu130 wheels) for $PY or set EDL_CUDA_LIB_DIRS (see $OUT/bundle-check.log)"
    exit 1
  fi
fi

NAMES=([1]="tests" [2]="train world 1 vs CPU" [3]="elastic job of 4 trainers" [4]="ResNet-50 benchmark"
  [5]="teacher vs CPU" [6]="imagefolder vs synthetic" [7]="GPU-UTILS in ctl status")
failed=0
for n in 1 2 3 4 5 6 7; do
  case ",$CHECKS," in *",$n,"*) ;; *) continue ;; esac
  t0=$SECONDS
  (set +e; "check$n") >"$OUT/check$n.log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then
    say "PASS check $n: ${NAMES[$n]} (${took} s)"
  else
    failed=1
    say "FAIL check $n: ${NAMES[$n]} (${took} s): $(grep -v '^RESULT ' "$OUT/check$n.log" | tail -1)"
  fi
  grep '^RESULT ' "$OUT/check$n.log" | tee -a "$REPORT"
done
# Every log in one archive as well: some GPU hosts hand back only a few files of a run.
tar czf "$OUT/logs.tar.gz" -C "$OUT" --exclude=logs.tar.gz --exclude='ckpt*' --exclude=secret . 2>/dev/null
say "gpu_check: $([ "$failed" = 0 ] && echo "every check passed" || echo "FAILED") in ${SECONDS} s; report $REPORT, every log in $OUT/logs.tar.gz"
exit "$failed"
