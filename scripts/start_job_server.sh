#!/usr/bin/env bash
# Starts the EDL job server (`edl server`) for one job, with defaults that work on one machine: the
# same role as PaddlePaddle EDL's demo start_job_server.sh. It runs until the job is stopped
# (`edl ctl stop`), or until you stop it; it takes a second to start.
#
#   scripts/start_job_server.sh [--daemon] [EXTRA edl server FLAGS...]
#   scripts/start_job_server.sh --stop | --status | --check | --abort
#
# Foreground by default (Ctrl-C stops the server alone; its trainers keep running). With --daemon
# it detaches, appends its output to $EDL_RUN_DIR/logs/server.out and writes
# $EDL_RUN_DIR/server.pid, and returns once the server answers `edl ctl status` (or fails with the
# end of its log, e.g. a port in use, naming EDL_SERVER_PORT). A server already running from that
# pid file is reported and kept. Before it starts one it checks that EDL_SERVER_PORT is free here
# (--check runs only the checks).
# --stop stops the whole job as one decision (`edl ctl stop`: one stop generation, a final
# checkpoint by rank 0, no failure records; then the clients and the server exit) and waits for
# the server to exit [EDL_STOP_JOB_TIMEOUT_S, 330 s]; a stopped job started again resumes from its
# latest checkpoint. It exits 3 when the job stopped but rank 0's final checkpoint failed or was
# refused (the events log's stop_checkpoint record), with the reason, and 1 when the server did not
# stop the job (it is then stopped alone). --abort stops the server process alone (SIGTERM,
# then SIGKILL): no stop generation, no final checkpoint (it undoes a start that failed).
# Resume: run it again. The job's state (generation, trainer ids, desired size, scaling-script
# position; jobserver/state/STATE.md) is kept in $EDL_RUN_DIR/state, synced before every change is sent,
# so a restarted server resumes the job: clients reconnect with backoff and report their running
# trainers, the server adopts the survivors of the stored generation (they keep training, nothing
# restarts) and numbers every later generation above the ones it issued. A damaged state directory
# is refused with the fix; moving it aside starts a new job. Extra arguments, and the words of
# EDL_SERVER_ARGS, go to `edl server` as they are (e.g. --scale_script config/x.txt). When
# EDL_TRAINER_CMD holds --checkpoint_dir DIR and no --checkpoint_dir is given, the server gets it
# too: it numbers generations above the store's newest, so a new state directory beside an old
# store does not have every save refused by the store's fence.
#
# Environment (defaults in brackets):
#   EDL_BIN            the edl binary [<repo>/build/edl, else edl in PATH]
#   EDL_SECRET_FILE    cluster secret, created (0600, /dev/urandom) if missing [$HOME/.edl/secret]
#   EDL_SERVER_PORT    TCP port [8180]            EDL_BIND     listen address [0.0.0.0]
#   EDL_JOB_ID         job name [edl-job]
#   EDL_MIN_TRAINERS   [1]   EDL_MAX_TRAINERS [0 = no bound]   EDL_TRAINERS initial size [0 = every free slot]
#   EDL_SCALE_SCRIPT   scaling-script file (see config/) [none]
#   EDL_RUN_DIR        pid file, events, logs and the job's state go under it [./edl-run]
#   EDL_STATE_DIR      the job's durable state [$EDL_RUN_DIR/state]
#   EDL_STATE_STORE    etcd://HOST:PORT[,...]: keep the state in etcd instead of EDL_STATE_DIR; run
#                      this script on two or three machines and one server leads, the others wait
#                      as standbys (docs/CHECKPOINTS.md "Standby servers") [unset]
#   EDL_LEASE_TTL_S    with EDL_STATE_STORE: the leader's lease [5]
#   EDL_STANDBY        1: start a standby of the server already running from EDL_RUN_DIR (same
#                      EDL_STATE_DIR and EDL_SERVER_PORT; docs/CHECKPOINTS.md "Standby servers"): it
#                      waits without listening and takes over the moment that server's process ends.
#                      Its pid file is $EDL_RUN_DIR/standby.pid, its output logs/standby.out;
#                      with --stop or --abort it stops the standby alone [0]
#   EDL_STOP_TIMEOUT_S seconds --stop waits after SIGTERM before SIGKILL [30]
#   EDL_SERVER_ARGS    further `edl server` flags, split at blanks [none]
#   EDL_TRAINER_CMD    read only for its --checkpoint_dir (see above) [unset]
#   EDL_START_TIMEOUT_S --daemon: seconds to wait for the server to answer; 0: do not wait [60]
#   EDL_HTTP_ADDR      the dashboard, Prometheus /metrics and /api/status (docs/WATCHING.md);
#                      "off": none [127.0.0.1:8181]
#   EDL_HTTP_TOKEN_FILE bearer token (0600) the HTTP endpoint requires; needed when EDL_HTTP_ADDR
#                      is not a loopback address [unset]
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

EDL_RUN_DIR="${EDL_RUN_DIR:-./edl-run}"
PIDFILE="$EDL_RUN_DIR/server.pid"
STANDBY_PIDFILE="$EDL_RUN_DIR/standby.pid"

# The pid of the process listening on EDL_SERVER_PORT here: the server that leads; nothing when
# none listens (or `ss` is missing).
leader_pid() {
  edl_port_listener "${EDL_SERVER_PORT:-8180}" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2
}

# A standby that took over (its leader died) is the server now: its pid file becomes server.pid.
adopt_standby() {
  local pid
  edl_running_pid "$PIDFILE" >/dev/null && return 0
  pid="$(edl_running_pid "$STANDBY_PIDFILE")" || return 0
  [ "$pid" = "$(leader_pid)" ] || return 0
  mv -f "$STANDBY_PIDFILE" "$PIDFILE"
  echo "$(basename "$0"): the standby (pid $pid) took over and leads: it is the server now ($PIDFILE)" >&2
}

# Stops a standby that still waits: it holds nothing, and left running it would take over the state
# of a job stopped or a server stopped here.
stop_waiting_standby() {
  local pid
  pid="$(edl_running_pid "$STANDBY_PIDFILE")" || return 0
  if ! command -v ss >/dev/null 2>&1; then
    echo "$(basename "$0"): ss (iproute2) is missing, so whether the standby (pid $pid) leads is unknown: left running" >&2
    return 0
  fi
  [ "$pid" != "$(leader_pid)" ] || return 0
  edl_stop "edl server standby" "$STANDBY_PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"
}

# The address `edl ctl` reaches this host's server at.
ctl_server() {
  local host="${EDL_BIND:-0.0.0.0}"
  case "$host" in 0.0.0.0 | '') host=127.0.0.1 ;; :: | '[::]') host='[::1]' ;; *:*) host="[$host]" ;; esac
  echo "$host:${EDL_SERVER_PORT:-8180}"
}

# The events log of the job (EventsLog: <events_dir>/<job_id>.events.jsonl).
EVENTS_LOG="$EDL_RUN_DIR/events/${EDL_JOB_ID:-edl-job}.events.jsonl"

# Reads events-log records appended after byte OFFSET; fails, saying why, when rank 0's final
# checkpoint (the stop_checkpoint record) failed or was refused by the store's fence.
check_final_checkpoint() {
  local offset="$1" tail_records final error
  [ -f "$EVENTS_LOG" ] || return 0
  tail_records="$(tail -c +"$((offset + 1))" "$EVENTS_LOG")"
  final="$(grep '"event":"stop_checkpoint"' <<<"$tail_records" | tail -n 1 || true)"
  [ -n "$final" ] || return 0
  case "$final" in *'"ok":false'*) ;; *) return 0 ;; esac
  error="$(grep '"event":"checkpoint_failed"' <<<"$tail_records" | tail -n 1 |
    sed -n 's/.*"error":"\(\([^"\\]\|\\.\)*\)".*/\1/p' || true)"
  echo "$(basename "$0"): the job stopped, but rank 0's final checkpoint was NOT saved: ${error:-see the log of rank 0 under $EDL_RUN_DIR/logs} (events log $EVENTS_LOG)" >&2
  return 3
}

# Stops the whole job as one decision through the running server (`edl ctl stop`: one stop
# generation, rank 0's final checkpoint, then the clients and the server exit by themselves) and
# waits for the server to exit; a server that does not answer or outlives the wait gets SIGTERM.
# Fails when the final checkpoint failed or was refused.
stop_job() {
  local pid offset=0
  stop_waiting_standby
  if pid="$(edl_running_pid "$PIDFILE")"; then
    edl_find_bin
    EDL_SECRET_FILE="${EDL_SECRET_FILE:-$HOME/.edl/secret}"
    if [ -f "$EVENTS_LOG" ]; then offset="$(wc -c <"$EVENTS_LOG")"; fi
    echo "$(basename "$0"): stopping the job through edl server (pid $pid): edl ctl stop" >&2
    # `edl ctl stop` waits for the stop to end: 0 once it did, 1 when it did and the final checkpoint
    # failed (said below from the events log), anything else when the server did not answer.
    local rc=0
    timeout "${EDL_STOP_JOB_TIMEOUT_S:-330}" "$EDL_BIN" ctl --server "$(ctl_server)" --secret_file "$EDL_SECRET_FILE" \
      stop >&2 || rc=$?
    if [ "$rc" -le 1 ] && edl_wait_exit "$PIDFILE" "${EDL_STOP_JOB_TIMEOUT_S:-330}"; then
      rm -f "$PIDFILE"
      echo "$(basename "$0"): the job stopped and edl server (pid $pid) exited" >&2
      check_final_checkpoint "$offset"
      return
    fi
    echo "$(basename "$0"): edl server (pid $pid) did not stop the job; stopping the server alone" >&2
    edl_stop "edl server" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"
    return 1
  fi
  edl_stop "edl server" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"
}

# Prints one line per problem that would keep a server from starting here.
check_server() {
  local listener
  edl_run_dir_problem
  if [ -n "${EDL_BIN:-}" ]; then
    [ -x "$EDL_BIN" ] || echo "EDL_BIN=$EDL_BIN is not an executable file here; build it with \`make\` or fix EDL_BIN"
  elif [ ! -x "$EDL_REPO_DIR/build/edl" ] && ! command -v edl >/dev/null 2>&1; then
    echo "no edl binary here: run \`make\` in $EDL_REPO_DIR, or set EDL_BIN=/path/to/edl"
  fi
  if [ "${EDL_STANDBY:-0}" = 1 ]; then
    [ -z "${EDL_STATE_STORE:-}" ] ||
      echo "EDL_STANDBY=1 is for a server on EDL_STATE_DIR; with EDL_STATE_STORE every server already waits as a standby while another leads: unset EDL_STANDBY"
    edl_running_pid "$PIDFILE" >/dev/null ||
      echo "EDL_STANDBY=1: no server runs from $EDL_RUN_DIR (no live pid in $PIDFILE) to be the standby of: start it first, without EDL_STANDBY"
  elif ! edl_running_pid "$PIDFILE" >/dev/null; then
    listener="$(edl_port_listener "${EDL_SERVER_PORT:-8180}")"
    if [ -n "$listener" ]; then
      echo "port ${EDL_SERVER_PORT:-8180} on $(hostname) is in use ($listener): set EDL_SERVER_PORT to a free port, or stop what listens there"
    fi
  fi
  # ssh_cluster.sh: the address the clients are given must be this host's own.
  if [ -n "${EDL_CHECK_SERVER_ADDR:-}" ] && ! edl_is_own_address "$EDL_CHECK_SERVER_ADDR"; then
    echo "the server's address $EDL_CHECK_SERVER_ADDR (the clients connect to it) is not an address of $(hostname), the server host (it has: $(hostname -I 2>/dev/null | xargs)); fix its address column in the hosts file"
  fi
  if [ -n "${EDL_SCALE_SCRIPT:-}" ] && [ ! -f "$EDL_SCALE_SCRIPT" ]; then
    echo "EDL_SCALE_SCRIPT=$EDL_SCALE_SCRIPT does not exist on $(hostname)"
  fi
}

# Waits until the server answers `edl ctl status`; fails with the end of its log (a port in use
# named as EDL_SERVER_PORT, the variable the scripts take) when it exits first or never answers.
wait_ready() {
  local pid="$1" timeout="${EDL_START_TIMEOUT_S:-60}" deadline log="$EDL_RUN_DIR/logs/server.out" why
  [ "$timeout" -gt 0 ] || return 0
  [ -z "${EDL_STATE_STORE:-}" ] || return 0  # a standby does not listen until it leads
  deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null; do
    if timeout 15 "$EDL_BIN" ctl --server "$(ctl_server)" --secret_file "$EDL_SECRET_FILE" status --json >/dev/null 2>&1; then
      return 0
    fi
    if [ $SECONDS -ge $deadline ]; then
      why="$(edl_last_error "$log")"
      edl_stop "edl server" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}" >/dev/null 2>&1
      edl_die "edl server did not answer within ${timeout}s (EDL_START_TIMEOUT_S) and was stopped: ${why:-no error in its log} (log $log)"
    fi
    sleep 0.2
  done
  rm -f "$PIDFILE"
  why="$(edl_last_error "$log")"
  edl_die "edl server exited at start: $(edl_explain "${why:-see its log}") (log $log)"
}

# Waits until a standby says whom it waits for, or leads (its leader was gone by then); fails with
# the end of its log when it exits first.
wait_standby() {
  local pid="$1" offset="$2" timeout="${EDL_START_TIMEOUT_S:-60}" log="$EDL_RUN_DIR/logs/standby.out" deadline
  [ "$timeout" -gt 0 ] || return 0
  deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null; do
    if tail -c +"$((offset + 1))" "$log" 2>/dev/null | grep -q 'standby for .*: the leader is pid\| listening on '; then
      echo "$(basename "$0"): $(tail -c +"$((offset + 1))" "$log" | grep -o 'standby for .*: the leader is pid [0-9]*\|edl server .* listening on .*' | tail -n 1)" >&2
      return 0
    fi
    [ $SECONDS -lt $deadline ] || edl_die "the standby (pid $pid) said nothing within ${timeout}s (EDL_START_TIMEOUT_S); log $log"
    sleep 0.2
  done
  rm -f "$STANDBY_PIDFILE"
  edl_die "the standby exited at start: $(edl_explain "$(edl_last_error "$log")") (log $log)"
}

adopt_standby
daemon=0
if [ "${EDL_STANDBY:-0}" = 1 ]; then
  case "${1:-}" in
    --stop | --abort) edl_stop "edl server standby" "$STANDBY_PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"; exit 0 ;;
    --status) edl_status "edl server standby" "$STANDBY_PIDFILE"; exit $? ;;
  esac
fi
case "${1:-}" in
  --stop) stop_job; exit $? ;;
  --abort)
    stop_waiting_standby
    edl_stop "edl server" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"
    exit 0
    ;;
  --status)
    rc=0
    edl_status "edl server" "$PIDFILE" || rc=$?
    if edl_running_pid "$STANDBY_PIDFILE" >/dev/null; then edl_status "edl server standby" "$STANDBY_PIDFILE" || true; fi
    exit "$rc"
    ;;
  --check)
    problems="$(check_server)"
    [ -z "$problems" ] && exit 0
    printf '%s\n' "$problems"
    exit 1
    ;;
  --daemon) daemon=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

problems="$(check_server)"
[ -z "$problems" ] || edl_die "not started: $(printf '%s\n' "$problems" | sed '2,$s/^/  and: /')"
edl_find_bin
edl_ensure_secret
mkdir -p "$EDL_RUN_DIR/events" "$EDL_RUN_DIR/logs"

args=(
  server
  --server_port "${EDL_SERVER_PORT:-8180}"
  --bind "${EDL_BIND:-0.0.0.0}"
  --secret_file "$EDL_SECRET_FILE"
  --job_id "${EDL_JOB_ID:-edl-job}"
  --min_trainers "${EDL_MIN_TRAINERS:-1}"
  --max_trainers "${EDL_MAX_TRAINERS:-0}"
  --trainers "${EDL_TRAINERS:-0}"
  --events_dir "$EDL_RUN_DIR/events"
  --log_dir "$EDL_RUN_DIR/logs"
)
if [ -n "${EDL_STATE_STORE:-}" ]; then
  args+=(--state_store "$EDL_STATE_STORE" --lease_ttl_s "${EDL_LEASE_TTL_S:-5}")
else
  args+=(--state_dir "${EDL_STATE_DIR:-$EDL_RUN_DIR/state}")
fi
if [ "${EDL_HTTP_ADDR:-}" != off ]; then
  args+=(--http_addr "${EDL_HTTP_ADDR:-127.0.0.1:8181}")
  [ -z "${EDL_HTTP_TOKEN_FILE:-}" ] || args+=(--http_token_file "$EDL_HTTP_TOKEN_FILE")
fi
if [ -n "${EDL_SCALE_SCRIPT:-}" ]; then
  args+=(--scale_script "$EDL_SCALE_SCRIPT")
fi
read -r -a server_args <<<"${EDL_SERVER_ARGS:-}"
args+=("${server_args[@]}" "$@")
# The trainers' checkpoint store, for the server to number generations above it.
ckpt_dir="$(edl_checkpoint_dir_of "${EDL_TRAINER_CMD:-}")"
if [ -n "$ckpt_dir" ] && ! printf '%s\n' "${args[@]}" | grep -q '^--checkpoint_dir\(=\|$\)'; then
  args+=(--checkpoint_dir "$ckpt_dir")
fi

if [ "${EDL_STANDBY:-0}" = 1 ]; then
  args+=(--standby)
  started=1
  if edl_running_pid "$STANDBY_PIDFILE" >/dev/null; then started=0; fi
  offset=0
  [ ! -f "$EDL_RUN_DIR/logs/standby.out" ] || offset="$(wc -c <"$EDL_RUN_DIR/logs/standby.out")"
  EDL_STOP_HINT="EDL_STANDBY=1 $0 --stop" edl_run "edl server standby" "$STANDBY_PIDFILE" \
    "$EDL_RUN_DIR/logs/standby.out" "$daemon" "$EDL_BIN" "${args[@]}"
  if [ "$started" = 1 ]; then wait_standby "$(cat "$STANDBY_PIDFILE")" "$offset"; fi
  exit 0
fi
started=1
if edl_running_pid "$PIDFILE" >/dev/null; then started=0; fi
edl_run "edl server" "$PIDFILE" "$EDL_RUN_DIR/logs/server.out" "$daemon" "$EDL_BIN" "${args[@]}"
if [ "$started" = 1 ]; then wait_ready "$(cat "$PIDFILE")"; fi
