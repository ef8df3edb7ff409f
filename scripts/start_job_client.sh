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
# $EDL_RUN_DIR/logs/client-<node>.out and writes $EDL_RUN_DIR/client-<node>.pid; a client already
# running from that pid file is reported and kept. --stop stops this node only (the others see
# its trainers fail); to stop the whole job use start_job_server.sh --stop or `edl ctl stop`.
# Resume: run it again; the server hands the node's slots out again.
#
# Environment (defaults in brackets):
#   EDL_BIN            the edl binary [<repo>/build/edl, else edl in PATH]
#   EDL_SECRET_FILE    cluster secret: a copy of the server's file, never created here (a new one
#                      could never match the server's) [$HOME/.edl/secret]
#   EDL_SERVER         host:port of `edl server`, as THIS node reaches it, or a comma-separated list
#                      of a leader and its standbys [127.0.0.1:${EDL_SERVER_PORT:-8180}]
#   EDL_ADVERTISE_ADDR this node's address that the other nodes' trainers reach; trainers bind it
#                      [127.0.0.1 when EDL_SERVER is on this machine, else the source address of
#                      this node's route to the server (`ip route get`)]
#   EDL_GPUS           GPU slots, e.g. 0,1,2,3, or none [the first EDL_SLOTS GPUs nvidia-smi lists, or all]
#   EDL_SLOTS          trainer slots: the first N GPUs, or N CPU slots without GPUs (or with
#                      EDL_GPUS=none) [every GPU, else 2]
#   EDL_TRAINER_CMD    the trainer command line [$EDL_BIN train]; variables for the trainers go in
#                      front through env(1): "env NCCL_DEBUG=INFO $EDL_BIN train ..." (or export them
#                      before starting the client: trainers inherit its environment)
#   EDL_MODE           inplace (trainers link the EDL runtime) | restart (torchrun-style) [inplace]
#   EDL_NODE_NAME      [hostname]
#   EDL_STOP_GRACE_S   SIGTERM -> SIGKILL grace for trainers [10]
#   EDL_RUN_DIR        pid file and logs go under it [./edl-run, ignored by git in the checkout]
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
edl_require_secret
case "${EDL_SLOTS:-}" in
  '') ;;
  *[!0-9]* | 0) edl_die "EDL_SLOTS=$EDL_SLOTS is not a positive number of trainer slots" ;;
esac
SERVER="${EDL_SERVER:-127.0.0.1:${EDL_SERVER_PORT:-8180}}"
# Checked before anything starts: a client that cannot resolve the server would retry forever.
server_ip="$(edl_resolve_server "${SERVER%%,*}")"
ADVERTISE_ADDR="${EDL_ADVERTISE_ADDR:-}"
if [ -z "$ADVERTISE_ADDR" ]; then ADVERTISE_ADDR="$(edl_default_advertise_addr "$server_ip")"; fi
mkdir -p "$EDL_RUN_DIR/logs"

# Slots: EDL_GPUS, else the GPUs nvidia-smi sees (the first EDL_SLOTS of them when set), else
# EDL_SLOTS CPU slots.
gpus="${EDL_GPUS:-}"
if [ -z "$gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
  count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  if [ -n "${EDL_SLOTS:-}" ] && [ "${count:-0}" -gt "$EDL_SLOTS" ]; then count="$EDL_SLOTS"; fi
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
  --server "$SERVER"
  --secret_file "$EDL_SECRET_FILE"
  --node_name "$NODE_NAME"
  "${slot_args[@]}"
  --mode "${EDL_MODE:-inplace}"
  --advertise_addr "$ADVERTISE_ADDR"
  --log_dir "$EDL_RUN_DIR/logs/$NODE_NAME"
  --stop_grace_s "$STOP_GRACE_S"
  --trainer_cmd "${EDL_TRAINER_CMD:-$EDL_BIN train}"
)

edl_run "edl client ($NODE_NAME)" "$PIDFILE" "$EDL_RUN_DIR/logs/client-$NODE_NAME.out" "$daemon" \
  "$EDL_BIN" "${args[@]}" "$@"
