#!/usr/bin/env bash
# Starts the EDL job server (`edl server`) for one job, with defaults that work on one machine: the
# same role as PaddlePaddle EDL's demo start_job_server.sh. It runs until the job is stopped
# (`edl ctl stop`), or until you stop it; it takes a second to start.
#
#   scripts/start_job_server.sh [--daemon] [EXTRA edl server FLAGS...]
#   scripts/start_job_server.sh --stop | --status
#
# Foreground by default (Ctrl-C stops the server alone; its trainers keep running). With --daemon
# it detaches, appends its output to $EDL_RUN_DIR/logs/server.out and writes
# $EDL_RUN_DIR/server.pid. A server already running from that pid file is reported and kept.
# --stop stops the whole job as one decision (`edl ctl stop`: one stop generation, a final
# checkpoint by rank 0, no failure records; then the clients and the server exit) and waits for
# the server to exit [EDL_STOP_JOB_TIMEOUT_S, 330 s]; a stopped job started again resumes from its
# latest checkpoint.
# Resume: run it again. The job's state (generation, trainer ids, desired size, scaling-script
# position; jobserver/STATE.md) is kept in $EDL_RUN_DIR/state, synced before every change is sent,
# so a restarted server resumes the job: clients reconnect with backoff and report their running
# trainers, the server adopts the survivors of the stored generation (they keep training, nothing
# restarts) and numbers every later generation above the ones it issued. A damaged state directory
# is refused with the fix; moving it aside starts a new job. Extra arguments go to `edl server` as
# they are (e.g. --scale_script config/x.txt, --checkpoint_dir DIR when a new state directory
# meets an old checkpoint store).
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
#                      as standbys (README "Standby servers") [unset]
#   EDL_LEASE_TTL_S    with EDL_STATE_STORE: the leader's lease [5]
#   EDL_STOP_TIMEOUT_S seconds --stop waits after SIGTERM before SIGKILL [30]
#   EDL_HTTP_ADDR      the dashboard, Prometheus /metrics and /api/status (README "Watching a
#                      cluster"); "off": none [127.0.0.1:8181]
#   EDL_HTTP_TOKEN_FILE bearer token (0600) the HTTP endpoint requires; needed when EDL_HTTP_ADDR
#                      is not a loopback address [unset]
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

EDL_RUN_DIR="${EDL_RUN_DIR:-./edl-run}"
PIDFILE="$EDL_RUN_DIR/server.pid"

# Stops the whole job as one decision through the running server (`edl ctl stop`: one stop
# generation, rank 0's final checkpoint, then the clients and the server exit by themselves) and
# waits for the server to exit; a server that does not answer or outlives the wait gets SIGTERM.
stop_job() {
  local pid host="${EDL_BIND:-0.0.0.0}"
  if pid="$(edl_running_pid "$PIDFILE")"; then
    case "$host" in 0.0.0.0 | '') host=127.0.0.1 ;; :: | '[::]') host='[::1]' ;; *:*) host="[$host]" ;; esac
    edl_find_bin
    EDL_SECRET_FILE="${EDL_SECRET_FILE:-$HOME/.edl/secret}"
    echo "$(basename "$0"): stopping the job through edl server (pid $pid): edl ctl stop" >&2
    if timeout 30 "$EDL_BIN" ctl --server "$host:${EDL_SERVER_PORT:-8180}" --secret_file "$EDL_SECRET_FILE" stop >&2 &&
      edl_wait_exit "$PIDFILE" "${EDL_STOP_JOB_TIMEOUT_S:-330}"; then
      rm -f "$PIDFILE"
      echo "$(basename "$0"): the job stopped and edl server (pid $pid) exited" >&2
      return 0
    fi
    echo "$(basename "$0"): edl server (pid $pid) did not stop the job; stopping the server alone" >&2
  fi
  edl_stop "edl server" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-30}"
}

daemon=0
case "${1:-}" in
  --stop) stop_job; exit 0 ;;
  --status) edl_status "edl server" "$PIDFILE"; exit $? ;;
  --daemon) daemon=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

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
  [ -f "$EDL_SCALE_SCRIPT" ] || edl_die "EDL_SCALE_SCRIPT=$EDL_SCALE_SCRIPT does not exist"
  args+=(--scale_script "$EDL_SCALE_SCRIPT")
fi

edl_run "edl server" "$PIDFILE" "$EDL_RUN_DIR/logs/server.out" "$daemon" "$EDL_BIN" "${args[@]}" "$@"
