#!/usr/bin/env bash
# `make demo`: a complete elastic training job on this one machine. It starts an `edl server` and
# two `edl client`s on loopback (two "nodes" of two CPU slots each), which run 4 trainers of
# ResNet-20 on Fashion-MNIST (`edl train`, one thread each) while config/demo.script shrinks the
# job to 2, grows it to 3 and SIGKILLs a trainer. It prints live progress, then a summary: every
# generation change with its reason and stall, the final test accuracy, and where the events log,
# the timeline picture (scripts/plot_events.sh) and the logs are. While it runs, the server's live
# dashboard (and Prometheus /metrics) is at the http://127.0.0.1:PORT/ address it prints.
#
#   scripts/demo.sh [--short]      (make demo runs it without flags after building)
#
# Takes about 3 minutes on 2 idle cores (--short: about 1.5 minutes, fewer samples and a
# compressed script; the demo test uses it). Exits 0 when training finished, non-zero otherwise. Ctrl-C stops
# it: every process it started is stopped by pid, also on failure. Every run starts afresh: it
# deletes the previous run's checkpoints, events and logs in its directory. Nothing to resume.
#
# Environment (defaults in brackets):
#   EDL_DEMO_DIR            checkpoints (ckpt/), events/, logs/, secret, timeline.png [./edl-demo]
#   EDL_BIN                 the edl binary [<repo>/build/edl; built with `make build` if missing]
#   EDL_DEMO_EPOCHS         training epochs [2; --short: 2]
#   EDL_DEMO_TRAIN_SAMPLES  Fashion-MNIST training samples used [60000; --short: 20000]
#   EDL_DEMO_TIMEOUT_S      give up (exit 1) after this many seconds [900; --short: 1200, 12 times
#                           the run on 2 idle cores: the demo test's bound for a slow machine]
#   EDL_DEMO_TRAINER_FLAGS  more `edl train` flags, appended (e.g. "--device cuda --comm gloo
#                           --data_dir DIR --sample_log FILE": scripts/gpu_check.sh's check 3) []
#   EDL_DEMO_HTTP_ADDR      the dashboard's address [127.0.0.1:0 = a free port, printed]
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

SHORT=0
case "${1:-}" in
  --short) SHORT=1 ;;
  "") ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) edl_die "unknown argument '$1'; usage: $0 [--short]" ;;
esac
if [ "$SHORT" = 1 ]; then
  EPOCHS="${EDL_DEMO_EPOCHS:-2}" SAMPLES="${EDL_DEMO_TRAIN_SAMPLES:-20000}"
  TIMEOUT_S="${EDL_DEMO_TIMEOUT_S:-1200}" SCRIPT="$EDL_REPO_DIR/config/demo_short.script"
else
  EPOCHS="${EDL_DEMO_EPOCHS:-2}" SAMPLES="${EDL_DEMO_TRAIN_SAMPLES:-60000}"
  TIMEOUT_S="${EDL_DEMO_TIMEOUT_S:-900}" SCRIPT="$EDL_REPO_DIR/config/demo.script"
fi
NODES=(node-a node-b)

# ---- processes: every pid we start is in PIDS (and $DIR/pids, for the demo test)

PIDS=()
SERVER_PID="" WATCH_PID=""
CLIENT_PIDS=()

note() { printf '[demo %4ds] %s\n' "$SECONDS" "$*"; }

# Trainer pids from the clients' logs ("started trainer T (pid N, ..."), alive or not.
trainer_pids() {
  local n
  for n in "${NODES[@]}"; do
    [ -f "$LOG_DIR/client-$n.log" ] || continue
    sed -n 's/.*started trainer [^ ]* (pid \([0-9][0-9]*\).*/\1/p' "$LOG_DIR/client-$n.log"
  done
}

# True when PID is alive (not a zombie) and still one of ours: every process the demo starts has
# the demo directory on its command line, so a recycled pid is never signalled.
ours() {
  local pid="$1" state
  [ -r "/proc/$pid/cmdline" ] || return 1
  state="$(sed 's/^.*) \(.\).*/\1/' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [ "$state" != Z ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR"
}

# stop_pids GRACE_S PID...: SIGTERM, up to GRACE_S seconds, then SIGKILL what is left.
stop_pids() {
  local grace="$1" pid i left
  shift
  for pid in "$@"; do
    if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for ((i = 0; i < grace * 10; i++)); do
    left=0
    for pid in "$@"; do ours "$pid" && left=1; done
    [ "$left" = 0 ] && return 0
    sleep 0.1
  done
  for pid in "$@"; do
    if ours "$pid"; then
      echo "demo: pid $pid did not stop in ${grace}s; SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

CLEANED=0
cleanup() {
  [ "$CLEANED" = 1 ] && return 0
  CLEANED=1
  local t
  t="$(trainer_pids | tr '\n' ' ')"
  # Clients first: they stop their trainers (SIGTERM, then SIGKILL after stop_grace_s = 5).
  if [ -n "$WATCH_PID" ]; then stop_pids 2 "$WATCH_PID"; fi
  if [ "${#CLIENT_PIDS[@]}" -gt 0 ]; then stop_pids 10 "${CLIENT_PIDS[@]}"; fi
  # shellcheck disable=SC2086  # t is a list of pids
  [ -n "$t" ] && stop_pids 2 $t
  if [ -n "$SERVER_PID" ]; then stop_pids 5 "$SERVER_PID"; fi
  # shellcheck disable=SC2086
  echo "${PIDS[*]} $t" | tr ' ' '\n' | sed '/^$/d' >"$DIR/pids" 2>/dev/null || true
}
# shellcheck disable=SC2317  # invoked by the trap
on_signal() {
  echo
  note "interrupted: stopping every process this demo started"
  cleanup
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

# start NAME LOG CMD...: runs CMD in the background with its output in LOG; sets STARTED_PID.
start() {
  local name="$1" log="$2"
  shift 2
  "$@" >"$log" 2>&1 </dev/null &
  STARTED_PID=$!
  PIDS+=("$STARTED_PID")
  note "started $name (pid $STARTED_PID), log $log"
}

# ---- set-up

if [ -z "${EDL_BIN:-}" ] && [ ! -x "$EDL_REPO_DIR/build/edl" ]; then
  echo "demo: no build/edl yet; building it (make build: installs what is missing, then CMake)"
  make -C "$EDL_REPO_DIR" build
fi
edl_find_bin
command -v jq >/dev/null || edl_die "jq is missing: run scripts/install_deps.sh (or apt-get install jq)"

DIR="${EDL_DEMO_DIR:-./edl-demo}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
case "$DIR" in *[[:space:]]*) edl_die "EDL_DEMO_DIR '$DIR' contains a space; pick another directory" ;; esac
LOG_DIR="$DIR/logs"
EVENTS="$DIR/events/demo.events.jsonl"
rm -rf "$DIR/ckpt" "$DIR/events" "$LOG_DIR" "$DIR/timeline.png" "$DIR/server.port" "$DIR/http.port" "$DIR/pids"
mkdir -p "$DIR/ckpt" "$DIR/events" "$LOG_DIR/trainers"
EDL_SECRET_FILE="$DIR/secret"
edl_ensure_secret 2>/dev/null

TRAINER=("$EDL_BIN" train --model resnet20 --data fashion-mnist --threads 1 --batch_size 64
  --epochs "$EPOCHS" --train_samples "$SAMPLES" --checkpoint_dir "$DIR/ckpt"
  --checkpoint_steps 50 --log_every 5)
# shellcheck disable=SC2206  # word splitting wanted: a flag list
[ -n "${EDL_DEMO_TRAINER_FLAGS:-}" ] && TRAINER+=(${EDL_DEMO_TRAINER_FLAGS})

echo "EDL demo: elastic training of ResNet-20 on Fashion-MNIST ($SAMPLES samples x $EPOCHS epochs)"
echo "  one edl server + two edl clients on loopback, 4 CPU trainers; scaling script $SCRIPT"
echo "  everything goes to $DIR; Ctrl-C stops it all"

start "edl server" "$LOG_DIR/server.log" "$EDL_BIN" server --config "$EDL_REPO_DIR/config/demo_server.ini" \
  --server_port 0 --port_file "$DIR/server.port" --secret_file "$EDL_SECRET_FILE" \
  --events_dir "$DIR/events" --scale_script "$SCRIPT" \
  --http_addr "${EDL_DEMO_HTTP_ADDR:-127.0.0.1:0}" --http_port_file "$DIR/http.port"
SERVER_PID=$STARTED_PID
for ((i = 0; i < 600; i++)); do  # up to 60 s (well under 1 s on idle cores)
  [ -s "$DIR/server.port" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$DIR/server.port" ]; then
  tail -n 20 "$LOG_DIR/server.log" >&2
  edl_die "edl server did not start (see $LOG_DIR/server.log)"
fi
PORT="$(cat "$DIR/server.port")"
SERVER="127.0.0.1:$PORT"
HTTP_HOST="${EDL_DEMO_HTTP_ADDR:-127.0.0.1:0}"
HTTP_HOST="${HTTP_HOST%:*}"
note "live dashboard: http://$HTTP_HOST:$(cat "$DIR/http.port")/ (Prometheus: /metrics)"

for n in "${NODES[@]}"; do
  start "edl client $n" "$LOG_DIR/client-$n.log" "$EDL_BIN" client \
    --config "$EDL_REPO_DIR/config/demo_client.ini" --server "$SERVER" \
    --secret_file "$EDL_SECRET_FILE" --node_name "$n" --log_dir "$LOG_DIR/trainers" -- "${TRAINER[@]}"
  CLIENT_PIDS+=("$STARTED_PID")
done
: >"$LOG_DIR/watch.log"  # exists before the loop below reads it
start "edl ctl watch" "$LOG_DIR/watch.log" "$EDL_BIN" ctl --server "$SERVER" \
  --secret_file "$EDL_SECRET_FILE" watch
WATCH_PID=$STARTED_PID

# ---- live progress: the watch stream, one line per progress change and per notable event

# One jq program for every event line: prints "KEY<TAB>MESSAGE" (KEY "-" = always show; else the
# message shows once per KEY: the trainers each report the same stall and evaluation).
# shellcheck disable=SC2016  # jq program, not shell
EVENT_JQ='
  def r3: . * 1000 | round / 1000;
  def kind: if .failure then "failure" elif .world_size_after < .world_size_before then "shrink"
            elif .world_size_after > .world_size_before then "grow" else "re-form" end;
  if .type == "generation" then
    if .generation == 1 then "-\tgeneration 1: start with \(.world_size_after) trainers"
    else "-\tgeneration \(.generation): \(kind) \(.world_size_before) -> \(.world_size_after) trainers (reason: \(.reason))" end
  elif .type == "desired" and .reason == "script" then "-\tscaling script: desired size \(.desired)"
  elif .type == "kill" then "-\tscaling script: SIGKILL trainer \(.trainers | join(", ")) (a failure)"
  elif .type == "prepare" then "-\tgeneration \(.generation): starting \(.joiners) hot joiner(s); the others keep training"
  elif .type == "prepare_aborted" then "-\tgeneration \(.generation // "?"): hot join aborted: \(.why // .reason // "")"
  elif .type == "trainer_exit" then "-\ttrainer \(.trainer_id) ended: \(.how)"
  elif .type == "finished" then "-\tjob finished in generation \(.generation) (\(.world_size) trainers)"
  elif .type == "node_joined" then "-\tnode \(.node) joined with \(.slots) slots"
  elif .type == "node_lost" then "-\tnode \(.node) lost: \(.why // "")"
  elif .type == "trainer_event" then
    if .event == "left" then "-\ttrainer \(.trainer) left after step \(.step) (exits 0)"
    elif .event == "joiner_ready" then "-\thot joiner \(.trainer) ready after \(.ready_s | r3) s"
    elif .event == "stall" then "stall\(.generation)\tgeneration \(.generation) formed at step \(.switch_step): training paused \(.stall_s | r3) s"
    elif .event == "cold_start" then "cold\(.generation)\tgeneration \(.generation): cold start from the checkpoint at step \(.step)"
    elif .event == "eval" then "eval\(.step)\ttest accuracy at step \(.step): \(.accuracy * 10000 | round / 100)% (test loss \(.loss * 1000 | round / 1000))"
    else empty end
  else empty end'

declare -A SHOWN_KEYS=()
# `edl ctl watch`'s "status k=v ..." line as a progress line.
show_status() {
  local kv g="" w="" e=0 s="" l="" ips=0
  for kv in $1; do
    case "$kv" in
      generation=*) g="${kv#*=}" ;;
      world=*) w="${kv#*=}" ;;
      epoch=*) e="${kv#*=}" ;;
      step=*) s="${kv#*=}" ;;
      loss=*) l="${kv#*=}" ;;
      images/s=*) ips="${kv#*=}" ;;
    esac
  done
  [ "${s:-0}" = 0 ] && return 0  # nothing trained in this generation yet
  e=$((e + 1 > EPOCHS ? EPOCHS : e + 1))
  note "$(printf 'gen %s  world %s  epoch %s/%s  step %4s  loss %s  %5.0f images/s' \
    "$g" "$w" "$e" "$EPOCHS" "$s" "$l" "$ips")"
}
# Reads `edl ctl watch` lines on stdin; prints progress lines. One jq for the whole chunk.
format_watch() {
  local kind key msg
  while IFS=$'\t' read -r kind key msg; do
    if [ "$kind" = S ]; then
      show_status "$key"
      continue
    fi
    [ -n "$msg" ] || continue
    if [ "$key" != - ]; then
      [ -n "${SHOWN_KEYS[$key]:-}" ] && continue
      SHOWN_KEYS[$key]=1
    fi
    note "$msg"
  done < <(jq -R -r 'if startswith("status ") then "S\t\(.[7:])"
    elif startswith("event ") then (.[6:] | fromjson? | ('"$EVENT_JQ"') | "E\t\(.)")
    else empty end' 2>/dev/null)
}

shown=0
deadline=$((SECONDS + TIMEOUT_S))
server_rc=""
while true; do
  total="$(wc -l <"$LOG_DIR/watch.log")"
  if [ "$total" -gt "$shown" ]; then
    format_watch < <(sed -n "$((shown + 1)),${total}p" "$LOG_DIR/watch.log")
    shown=$total
  fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    set +e
    wait "$SERVER_PID"
    server_rc=$?
    set -e
    break
  fi
  alive=0
  for p in "${CLIENT_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  if [ "$alive" = 0 ]; then
    note "both edl clients exited before the job finished (see $LOG_DIR/client-*.log)"
    break
  fi
  failed="$(grep '"type":"trainer_exit"' "$EVENTS" 2>/dev/null | grep -c '"success":false' || true)"
  if [ "${failed:-0}" -ge 8 ]; then
    last="$(find "$LOG_DIR/trainers" -name '*.log' -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2)"
    note "trainers keep failing ($failed failed exits); giving up. The end of ${last:-a trainer log}:"
    [ -n "$last" ] && tail -n 5 "$last" | sed 's/^/    /'
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    note "timed out after ${TIMEOUT_S}s (EDL_DEMO_TIMEOUT_S) before the job finished"
    break
  fi
  sleep 1
done
sleep 0.5
total="$(wc -l <"$LOG_DIR/watch.log")"
if [ "$total" -gt "$shown" ]; then format_watch < <(sed -n "$((shown + 1)),${total}p" "$LOG_DIR/watch.log"); fi
cleanup

# ---- summary

echo
echo "==== EDL demo summary ===="
# Each generation change: when, what, why, and its stall: the longest pause of training a trainer
# measured around it (the "stall" events; a hot join's stall is only the final state handover,
# the joiner's start-up time shows separately as "joiner ready").
# shellcheck disable=SC2016  # jq program, not shell
jq -r -s '
  def r2: . * 100 | round / 100;
  (map(select(.type == "server_started")) | last | .time) as $t0
  | map(select(.type == "generation" and .generation > 1)) as $g
  | map(select(.type == "trainer_event" and .event == "stall")) as $stalls
  | map(select(.type == "trainer_event" and .event == "joiner_ready")) as $ready
  | "generation changes: \($g | length) (failures: \($g | map(select(.failure)) | length))",
    ($g[] | .generation as $n
      | ($stalls | map(select(.generation == $n) | .stall_s)) as $s
      | ($ready | map(select(.generation == $n) | .ready_s)) as $r
      | "  g\($n)  at \((.time - $t0) * 10 | round / 10) s  \(
          if .failure then "failure" elif .world_size_after < .world_size_before then "shrink "
          elif .world_size_after > .world_size_before then "grow   " else "re-form" end)  \(
          .world_size_before) -> \(.world_size_after)  reason=\(.reason)  stall \(
          if ($s | length) > 0 then "\($s | max | r2) s" else "n/a (superseded)" end)\(
          if ($r | length) > 0 then "  (hot joiner ready after \($r | max | r2) s while the others trained)"
          else "" end)")' "$EVENTS" || true

finished=0
grep -q '"type":"finished"' "$EVENTS" 2>/dev/null && finished=1
# Final test accuracy: the last evaluation a trainer reported (every rank reports the same).
acc="$(jq -r -s 'map(select(.type == "trainer_event" and .event == "eval")) | last
  | if . == null then "" else .accuracy * 10000 | round / 100 | tostring end' "$EVENTS" 2>/dev/null || true)"
if [ "$finished" = 1 ] && [ "${server_rc:-1}" = 0 ]; then
  echo "training: finished"
else
  echo "training: FAILED (server exit ${server_rc:-none}; see $LOG_DIR)"
fi
echo "final test accuracy: ${acc:-n/a}${acc:+%}"
PLOT=""
if PLOT="$(bash "$EDL_REPO_DIR/scripts/plot_events.sh" "$EVENTS" "$DIR/timeline.png" 2>&1)"; then
  echo "timeline picture: $PLOT"
else
  echo "timeline picture: not drawn: $PLOT"
fi
echo "events log: $EVENTS"
echo "logs: $LOG_DIR (server.log, client-*.log, trainers/<trainer>.log)"
echo "checkpoints: $DIR/ckpt (inspect with: $EDL_BIN ckpt ls --checkpoint_dir $DIR/ckpt)"
left=""
while read -r p; do
  if ours "$p"; then left="$left $p"; fi
done <"$DIR/pids"
if [ -z "$left" ]; then
  echo "processes: $(wc -l <"$DIR/pids") started, all stopped (pids in $DIR/pids)"
else
  echo "processes: still running:$left (pids in $DIR/pids)"
fi
if [ "$finished" = 1 ] && [ "${server_rc:-1}" = 0 ] && [ -n "$acc" ]; then
  exit 0
fi
exit 1
