#!/usr/bin/env bash
# Knowledge distillation with elastic teacher services (docs/DISTILLATION.md), CPU.
#
# A ResNet-56 teacher is trained once on Fashion-MNIST (TEACHER_EPOCHS, checkpoint kept in
# $WORK/teacher), then a ResNet-20 student is trained with the same seed, epochs and data three
# ways, SEEDS times each:
#   (a) alone (labels only);
#   (b) distilled from N_TEACHERS `edl teacher` services registered with an `edl server`;
#   (c) distilled from the same teacher run inside the student's process (--distill_local), the
#       original's "teacher and student on the same GPUs" row.
# Students are pinned to STUDENT_CPUS and teachers to TEACHER_CPUS (taskset), so (b) measures
# "teachers on spare capacity": the teachers' cores are not the student's. (a) runs on
# STUDENT_CPUS too; (c), whose process holds the teacher, gets both sets (and threads for both):
# the same cores as (b)'s student and teachers together. Prints test accuracy and student
# images/s for each run, then
#   RESULT distill_accuracy      (b) vs (a) mean test accuracy (ratio > 1: distillation helps)
#   RESULT distill_images_per_s  (b) vs (a) student images/s (target >= 0.9)
#   RESULT distill_vs_same_proc  (b) vs (c) student images/s
# then student images/s of (b) with 1, 2 and 4 teachers (first seed), and a run of (b) with 2
# teachers where one is SIGKILLed mid-epoch and a new one started: its student must complete every
# step (steps lost: 0) and prints how many samples fell back to labels.
# The machine's load average is printed at the start and the end.
#
# The defaults are the regime where a teacher has something to teach on this machine: a ResNet-56
# teacher trained 3 epochs on all 60000 images (~88 %), students on the first 1024 (batch 64, 16
# epochs: 256 steps), where a student alone ends ~8 points below the teacher. A student trained
# long on many samples (8 epochs of 8192) overtakes that teacher, and then no distillation helps.
# Takes ~60 min on 2 idle cores (teacher ~18 min, each seed's three students ~9 min), ~40 min with
# a KEEP directory that already holds the teacher.
# A short run (~15 min): TRAIN_SAMPLES=4096 TEACHER_EPOCHS=2 EPOCHS=1 SEEDS="1" bench/distill.sh
# Knobs: BUILD (build), SEEDS ("1 2 3"), EPOCHS (16), TEACHER_EPOCHS (3), TEACHER_TRAIN_SAMPLES (the
# teacher's own training set: 0 = all 60000; the students of (a), (b) and (c) always share
# TRAIN_SAMPLES, and teachers serve the students' samples), TRAIN_SAMPLES (1024; 0 = all 60000),
# BATCH (64, the students'), TEACHER_BATCH (128), STUDENT_CPUS (0), TEACHER_CPUS (1), N_TEACHERS (1),
# TEACHER_COUNTS ("1 2 4"), T (4), ALPHA (0.5), TEACHER_MODEL (resnet56), KEEP (a directory to keep
# the teacher and the logs in), ONLY_KILL (set: only the teacher-kill run).
# A ResNet-56 forward costs about what a ResNet-20 forward + backward does, so one teacher core
# keeps up with one student core only just: give the teachers more cores than the students (or a
# smaller TEACHER_MODEL) for teacher answers to arrive ahead of every step.
set -euo pipefail
cd "$(dirname "$0")/.."
EDL=$(realpath "${BUILD:-build}/edl")
SEEDS=${SEEDS:-1 2 3}
EPOCHS=${EPOCHS:-16}
TEACHER_EPOCHS=${TEACHER_EPOCHS:-3}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-1024}
TEACHER_TRAIN_SAMPLES=${TEACHER_TRAIN_SAMPLES:-0}
BATCH=${BATCH:-64}
TEACHER_BATCH=${TEACHER_BATCH:-128}
STUDENT_CPUS=${STUDENT_CPUS:-0}
TEACHER_CPUS=${TEACHER_CPUS:-1}
N_TEACHERS=${N_TEACHERS:-1}
TEACHER_COUNTS=${TEACHER_COUNTS:-1 2 4}
T=${T:-4}
ALPHA=${ALPHA:-0.5}
TEACHER_MODEL=${TEACHER_MODEL:-resnet56}
if [ -n "${KEEP:-}" ]; then
  WORK=$(realpath -m "$KEEP"); mkdir -p "$WORK"
else
  WORK=$(mktemp -d /tmp/edl-distill-XXXXXX)
fi
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
n_student_cpus=$(taskset -c "$STUDENT_CPUS" nproc)
n_teacher_cpus=$(taskset -c "$TEACHER_CPUS" nproc)
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores; students on" \
     "cpus $STUDENT_CPUS, teachers on cpus $TEACHER_CPUS"
SECRET=$WORK/secret
[ -f "$SECRET" ] || { head -c 32 /dev/urandom | base64 > "$SECRET"; }
chmod 600 "$SECRET"
DATA=(--data fashion-mnist --train_samples "$TRAIN_SAMPLES")
STUDENT=(--model resnet20 "${DATA[@]}" --batch_size "$BATCH" --epochs "$EPOCHS")

# ---- the teacher (trained once; kept with KEEP)
if [ ! -d "$WORK/teacher" ]; then
  echo "training the $TEACHER_MODEL teacher ($TEACHER_EPOCHS epochs) ..."
  taskset -c "$STUDENT_CPUS,$TEACHER_CPUS" "$EDL" train --model "$TEACHER_MODEL" \
    --data fashion-mnist --train_samples "$TEACHER_TRAIN_SAMPLES" \
    --batch_size "$TEACHER_BATCH" --epochs "$TEACHER_EPOCHS" --augment true --log_every 0 \
    --checkpoint_dir "$WORK/teacher" | tee "$WORK/teacher.log" | grep summary
fi

echo "teacher $TEACHER_MODEL: $(grep -o 'test_acc [0-9.]*%' "$WORK/teacher.log" 2>/dev/null || echo 'accuracy not logged')"

# ---- the server and teachers of (b)
rm -f "$WORK"/*.port  # from an earlier run kept with KEEP
"$EDL" server --server_port 0 --bind 127.0.0.1 --port_file "$WORK/server.port" \
  --secret_file "$SECRET" --job_id distill --events_dir "$WORK/events" > "$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/server.port" ] && break; sleep 0.1; done
SERVER=127.0.0.1:$(cat "$WORK/server.port")
TEACHER_PIDS=()
start_teacher() {  # $1 name
  taskset -c "$TEACHER_CPUS" "$EDL" teacher --service kd --name "$1" --model "$TEACHER_MODEL" "${DATA[@]}" \
    --checkpoint_dir "$WORK/teacher" --server "$SERVER" --secret_file "$SECRET" --bind 127.0.0.1 \
    --threads "$n_teacher_cpus" --port_file "$WORK/$1.port" > "$WORK/$1.log" 2>&1 &
  PIDS+=($!); TEACHER_PIDS+=($!)
  for _ in $(seq 600); do [ -s "$WORK/$1.port" ] && return 0; sleep 0.1; done
  echo "teacher $1 did not start:"; tail -5 "$WORK/$1.log"; exit 1
}
stop_teachers() {
  for p in "${TEACHER_PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${TEACHER_PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  TEACHER_PIDS=()
  rm -f "$WORK"/t*.port
}
# Student: $1 log, rest: extra flags. Prints "acc images/s" from the summary line. Runs on
# RUN_CPUS with RUN_THREADS threads (default: STUDENT_CPUS, one thread per core of it).
student() {
  local log=$1; shift
  taskset -c "${RUN_CPUS:-$STUDENT_CPUS}" "$EDL" train "${STUDENT[@]}" \
    --threads "${RUN_THREADS:-$n_student_cpus}" --log_every 0 "$@" > "$log" 2>&1
  awk '$1 == "summary:" { for (i = 1; i <= NF; i++) { if ($i == "test_acc") a = $(i+1);
       if ($i == "train_images/s") r = $(i+1) } } END { sub("%", "", a); print a, r }' "$log"
}
DISTILL=(--distill kd --distill_server "$SERVER" --secret_file "$SECRET" --distill_temperature "$T"
         --distill_alpha "$ALPHA")
LOCAL=(--distill_local "$WORK/teacher" --distill_local_model "$TEACHER_MODEL" --distill_temperature "$T"
       --distill_alpha "$ALPHA")

seed=${SEEDS%% *}
if [ -z "${ONLY_KILL:-}" ]; then
for i in $(seq "$N_TEACHERS"); do start_teacher "t$i"; done
for seed in $SEEDS; do
  read -r acc ips < <(student "$WORK/a.$seed.log" --seed "$seed")
  echo "a $seed $acc $ips" >> "$WORK/results"
  echo "(a) alone      seed $seed: test acc $acc%  student images/s $ips"
  read -r acc ips < <(student "$WORK/b.$seed.log" --seed "$seed" "${DISTILL[@]}")
  echo "b $seed $acc $ips" >> "$WORK/results"
  echo "(b) services   seed $seed: test acc $acc%  student images/s $ips  ($N_TEACHERS teachers;" \
       "$(grep -o 'distill answered=.*' "$WORK/b.$seed.log"))"
  read -r acc ips < <(RUN_CPUS="$STUDENT_CPUS,$TEACHER_CPUS" RUN_THREADS=$((n_student_cpus + n_teacher_cpus)) \
                      student "$WORK/c.$seed.log" --seed "$seed" "${LOCAL[@]}")
  echo "c $seed $acc $ips" >> "$WORK/results"
  echo "(c) same proc  seed $seed: test acc $acc%  student images/s $ips"
done
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def col(mode, k): return [float(r[k]) for r in rows if r[0] == mode and r[k] not in ("", "n/a")]
acc = {m: statistics.mean(col(m, 2)) for m in "abc"}
ips = {m: statistics.mean(col(m, 3)) for m in "abc"}
spread = {m: (max(col(m, 2)) - min(col(m, 2))) / 2 for m in "abc"}
print(f"mean test acc: (a) {acc['a']:.2f}% ±{spread['a']:.2f}  (b) {acc['b']:.2f}% ±{spread['b']:.2f}"
      f"  (c) {acc['c']:.2f}% ±{spread['c']:.2f}  (± half the min-max spread over seeds)")
print(f"RESULT distill_accuracy ours={acc['b']:.2f}% ref={acc['a']:.2f}% ratio={acc['b'] / acc['a']:.4f}")
print(f"RESULT distill_images_per_s ours={ips['b']:.1f}img/s ref={ips['a']:.1f}img/s ratio={ips['b'] / ips['a']:.3f}")
print(f"RESULT distill_vs_same_proc ours={ips['b']:.1f}img/s ref={ips['c']:.1f}img/s ratio={ips['b'] / ips['c']:.3f}")
PY

# ---- student images/s against the number of teachers (first seed)
seed=${SEEDS%% *}
for n in $TEACHER_COUNTS; do
  stop_teachers
  for i in $(seq "$n"); do start_teacher "t$i"; done
  read -r acc ips < <(student "$WORK/n$n.log" --seed "$seed" "${DISTILL[@]}")
  echo "(b) with $n teachers: student images/s $ips, test acc $acc%" \
       "($(grep -o 'distill answered=.*' "$WORK/n$n.log"))"
done
fi  # ONLY_KILL

# ---- a teacher SIGKILLed mid-epoch (2 teachers; a third one joins)
stop_teachers
start_teacher t1; start_teacher t2
taskset -c "$STUDENT_CPUS" "$EDL" train "${STUDENT[@]}" --threads "$n_student_cpus" --seed "$seed" \
  "${DISTILL[@]}" --log_every 2 \
  > "$WORK/kill.log" 2>&1 &
student_pid=$!; PIDS+=($student_pid)
steps_per_epoch=$(( ( ${TRAIN_SAMPLES/#0/60000} + BATCH - 1 ) / BATCH ))
half=$(( steps_per_epoch / 2 ))
while kill -0 "$student_pid" 2>/dev/null; do
  s=$(grep -o 'step [0-9]*' "$WORK/kill.log" | tail -1 | cut -d' ' -f2 || true)
  [ -n "$s" ] && [ "$s" -ge "$half" ] && break
  sleep 0.5
done
kill -9 "${TEACHER_PIDS[0]}"; echo "SIGKILLed teacher t1 at student step ${s:-?} of epoch 1"
start_teacher t3
wait "$student_pid"
done_steps=$(awk '$1 == "summary:" { for (i = 1; i < NF; i++) if ($i == "steps") print $(i+1) }' "$WORK/kill.log")
want_steps=$(( steps_per_epoch * EPOCHS ))
echo "teacher killed mid-epoch: student completed $done_steps of $want_steps steps" \
     "(steps lost: $(( want_steps - done_steps ))); $(grep -o 'distill answered=.*' "$WORK/kill.log")"
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at the end"
