#!/usr/bin/env bash
# Starts the EDL job client (`edl client`) of this node, with defaults that work on one machine:
# the same role as PaddlePaddle EDL's demo start_job_client.sh. It connects to the server (and
# keeps retrying with backoff while the server is down), starts and stops trainers on this node's
# slots, and runs until the job is done or you stop it; it takes a second to start.
#
#   scripts/start_job_client.sh [--daemon] [EXTRA edl client FLAGS...]
#   scripts/start_job_client.sh --stop | --status
#
# Foreground by default (stop with Ctrl-C: its trainers get SIGTERM, then SIGKILL after
# EDL_STOP_GRACE_S). With --daemon it detaches, appends its output to
# $EDL_RUN_DIR/logs/client-<node>.out and writes $EDL_RUN_DIR/client-<node>.pid; stop it with
# --stop. Resume: run it again; the server hands the node's slots out again.
#
# Environment (defaults in brackets):
#   EDL_BIN            the edl binary [<repo>/build/edl, else edl in PATH]
#   EDL_SECRET_FILE    cluster secret, the server's copy [$HOME/.edl/secret; created if missing]
#   EDL_SERVER         host:port of `edl server` [127.0.0.1:${EDL_SERVER_PORT:-8180}]
#   EDL_GPUS           GPU slots, e.g. 0,1,2,3 [every GPU nvidia-smi lists]
#   EDL_SLOTS          CPU trainer slots when there is no GPU (or EDL_GPUS=none) [2]
#   EDL_TRAINER_CMD    the trainer command line [$EDL_BIN train]
#   EDL_MODE           inplace (trainers link the EDL runtime) | restart (torchrun-style) [inplace]
#   EDL_NODE_NAME      [hostname]   EDL_ADVERTISE_ADDR address trainers bind and advertise [127.0.0.1]
#   EDL_STOP_GRACE_S   SIGTERM -> SIGKILL grace for trainers [10]
#   EDL_RUN_DIR        pid file and logs go under it [./edl-run]
#   EDL_STOP_TIMEOUT_S seconds --stop waits after SIGTERM before SIGKILL [EDL_STOP_GRACE_S + 20]
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

EDL_RUN_DIR="${EDL_RUN_DIR:-./edl-run}"
NODE_NAME="${EDL_NODE_NAME:-$(hostname)}"
PIDFILE="$EDL_RUN_DIR/client-$NODE_NAME.pid"
STOP_GRACE_S="${EDL_STOP_GRACE_S:-10}"

daemon=0
case "${1:-}" in
  --stop) edl_stop "edl client ($NODE_NAME)" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-$((STOP_GRACE_S + 20))}"; exit 0 ;;
  --status) edl_status "edl client ($NODE_NAME)" "$PIDFILE"; exit $? ;;
  --daemon) daemon=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

edl_find_bin
edl_ensure_secret
mkdir -p "$EDL_RUN_DIR/logs"

# Slots: EDL_GPUS, else every GPU nvidia-smi sees, else EDL_SLOTS CPU slots.
gpus="${EDL_GPUS:-}"
if [ -z "$gpus" ] && [ -z "${EDL_SLOTS:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  if [ "${count:-0}" -gt 0 ]; then
    gpus="$(seq -s, 0 $((count - 1)))"
  fi
fi
if [ -n "$gpus" ] && [ "$gpus" != none ]; then
  slot_args=(--gpus "$gpus")
else
  slot_args=(--slots "${EDL_SLOTS:-2}")
fi

args=(
  client
  --server "${EDL_SERVER:-127.0.0.1:${EDL_SERVER_PORT:-8180}}"
  --secret_file "$EDL_SECRET_FILE"
  --node_name "$NODE_NAME"
  "${slot_args[@]}"
  --mode "${EDL_MODE:-inplace}"
  --advertise_addr "${EDL_ADVERTISE_ADDR:-127.0.0.1}"
  --log_dir "$EDL_RUN_DIR/logs/$NODE_NAME"
  --stop_grace_s "$STOP_GRACE_S"
  --trainer_cmd "${EDL_TRAINER_CMD:-$EDL_BIN train}"
)

edl_run "edl client ($NODE_NAME)" "$PIDFILE" "$EDL_RUN_DIR/logs/client-$NODE_NAME.out" "$daemon" \
  "$EDL_BIN" "${args[@]}" "$@"
