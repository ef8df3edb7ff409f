#!/usr/bin/env bash
# Starts the EDL job client (`edl client`) of this node, with defaults that work on one machine:
# the same role as PaddlePaddle EDL's demo start_job_client.sh. It connects to the server (and
# keeps retrying with backoff while the server is down), starts and stops trainers on this node's
# slots, and runs until the job is done or you stop it; it takes a second to start.
#
#   scripts/start_job_client.sh [--daemon] [EXTRA edl client FLAGS...]
#   scripts/start_job_client.sh --stop | --status | --check
#
# Before it starts anything it checks this node and stops, naming every problem, when: the edl
# binary or the cluster secret is missing, the server's address does not resolve here,
# EDL_ADVERTISE_ADDR is not an address of this machine (its trainers could not bind it), or the
# trainer command's program is not found here (`command -v`). --check runs only these checks.
# Foreground by default (stop with Ctrl-C: its trainers get SIGTERM, then SIGKILL after
# EDL_STOP_GRACE_S). With --daemon it detaches, appends its output to
# $EDL_RUN_DIR/logs/client-<node>.out and writes $EDL_RUN_DIR/client-<node>.pid, and returns only
# once the client has joined the server and its first trainer has started (or the job has all the
# trainers it wants without one here), or fails with the client's last error line when the client
# exits or has not joined within EDL_JOIN_TIMEOUT_S; a client it started is then stopped again. A
# client already running from that pid file is reported and kept (and waited for the same way).
# --stop stops this node only (the others see its trainers fail); to stop the whole job use
# start_job_server.sh --stop or `edl ctl stop`. Resume: run it again; the server hands the node's
# slots out again. The node's session token is kept in $EDL_RUN_DIR (edl-<node>.session): a new
# run directory is a new job's.
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
#   EDL_SOCKET_DIR     directory of the trainers' Unix socket (a short path: a socket path holds
#                      at most 107 bytes) [/tmp]
#   EDL_STOP_TIMEOUT_S seconds --stop waits after SIGTERM before SIGKILL [EDL_STOP_GRACE_S + 20]
#   EDL_JOIN_TIMEOUT_S --daemon: seconds to wait for the client to join and a trainer to start;
#                      0: return once it runs [120]
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

EDL_RUN_DIR="${EDL_RUN_DIR:-./edl-run}"
NODE_NAME="${EDL_NODE_NAME:-$(hostname)}"
PIDFILE="$EDL_RUN_DIR/client-$NODE_NAME.pid"
STOP_GRACE_S="${EDL_STOP_GRACE_S:-10}"

daemon=0
check_only=0
case "${1:-}" in
  --stop) edl_stop "edl client ($NODE_NAME)" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-$((STOP_GRACE_S + 20))}"; exit 0 ;;
  --status) edl_status "edl client ($NODE_NAME)" "$PIDFILE"; exit $? ;;
  --check) check_only=1; shift ;;
  --daemon) daemon=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

SERVER="${EDL_SERVER:-127.0.0.1:${EDL_SERVER_PORT:-8180}}"
SECRET_DEFAULT="$HOME/.edl/secret"

# Prints one line per problem of this node that would keep its client or trainers from working.
check_node() {
  local program server_ip=""
  edl_run_dir_problem
  if [ -n "${EDL_SOCKET_DIR:-}" ] && { [ ! -d "$EDL_SOCKET_DIR" ] || [ ! -w "$EDL_SOCKET_DIR" ]; }; then
    echo "EDL_SOCKET_DIR=$EDL_SOCKET_DIR is not a directory $(id -un) can write on $(hostname): create it or choose another"
  fi
  if [ -n "${EDL_BIN:-}" ]; then
    [ -x "$EDL_BIN" ] || echo "EDL_BIN=$EDL_BIN is not an executable file here; build it with \`make\` or fix EDL_BIN"
  elif [ ! -x "$EDL_REPO_DIR/build/edl" ] && ! command -v edl >/dev/null 2>&1; then
    echo "no edl binary here: run \`make\` in $EDL_REPO_DIR, or set EDL_BIN=/path/to/edl"
  fi
  if [ ! -f "${EDL_SECRET_FILE:-$SECRET_DEFAULT}" ]; then
    echo "the cluster secret ${EDL_SECRET_FILE:-$SECRET_DEFAULT} does not exist here; copy the server's file here, keeping its mode (scp -p SERVER:.edl/secret ${EDL_SECRET_FILE:-$SECRET_DEFAULT}) (scripts/ssh_cluster.sh copies it for you)"
  fi
  case "${EDL_SLOTS:-}" in
    '') ;;
    *[!0-9]* | 0) echo "EDL_SLOTS=$EDL_SLOTS is not a positive number of trainer slots" ;;
  esac
  if ! server_ip="$( (edl_resolve_server "${SERVER%%,*}") 2>&1)"; then
    echo "${server_ip#*: }"
    server_ip=""
  fi
  if [ -n "${EDL_ADVERTISE_ADDR:-}" ] && ! edl_is_own_address "$EDL_ADVERTISE_ADDR"; then
    echo "EDL_ADVERTISE_ADDR=$EDL_ADVERTISE_ADDR (this node's address, which its trainers bind) is not an address of $(hostname) (it has: $(hostname -I 2>/dev/null | xargs)); fix the node's address column in the hosts file, or EDL_ADVERTISE_ADDR"
  fi
  if [ -n "${EDL_TRAINER_CMD:-}" ] && ! edl_split_command "$EDL_TRAINER_CMD"; then
    echo "EDL_TRAINER_CMD='$EDL_TRAINER_CMD' has an unterminated quote or ends with a backslash: close the quote (a word holding a space is written 'a b' or a\\ b)"
  elif [ -n "${EDL_TRAINER_CMD:-}" ]; then
    program="$(edl_trainer_program "$EDL_TRAINER_CMD")"
    if [ -z "$program" ]; then
      echo "EDL_TRAINER_CMD='$EDL_TRAINER_CMD' names no program"
    elif ! command -v "$program" >/dev/null 2>&1; then
      echo "the trainer command's program '$program' (EDL_TRAINER_CMD='$EDL_TRAINER_CMD') is not found on $(hostname) in $(pwd) (command -v $program): check the path, or install it on this node"
    fi
  fi
}

problems="$(check_node)"
if [ $check_only = 1 ]; then
  [ -z "$problems" ] && exit 0
  printf '%s\n' "$problems"
  exit 1
fi
[ -z "$problems" ] || edl_die "not started: $(printf '%s\n' "$problems" | sed '2,$s/^/  and: /')"

edl_find_bin
edl_require_secret
server_ip="$(edl_resolve_server "${SERVER%%,*}")"
ADVERTISE_ADDR="${EDL_ADVERTISE_ADDR:-}"
if [ -z "$ADVERTISE_ADDR" ]; then ADVERTISE_ADDR="$(edl_default_advertise_addr "$server_ip")"; fi
mkdir -p "$EDL_RUN_DIR/logs"
LOGFILE="$EDL_RUN_DIR/logs/client-$NODE_NAME.out"

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
  --state_dir "$EDL_RUN_DIR"
  --socket_dir "${EDL_SOCKET_DIR:-/tmp}"
  --stop_grace_s "$STOP_GRACE_S"
  --trainer_cmd "${EDL_TRAINER_CMD:-$EDL_BIN train}"
)

# Waits until the server lists this node as connected with a trainer of the current generation
# (seen twice in a row, half a second apart, with a trainer process under the client), or the job
# runs all the trainers it wants without one here. Stops the client it started (started=1) and
# fails with the client's last error line when the client exits or the wait runs out.
wait_joined() {
  local pid="$1" started="$2" timeout="${EDL_JOIN_TIMEOUT_S:-120}" deadline seen=0 state="" out="" why
  case "$timeout" in '' | *[!0-9]*) edl_die "EDL_JOIN_TIMEOUT_S=$timeout is not a number of seconds" ;; esac
  [ "$timeout" -gt 0 ] || return 0
  deadline=$((SECONDS + timeout))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      edl_die "edl client ($NODE_NAME) exited before it joined the server at $SERVER: $(edl_last_error "$LOGFILE") (log $LOGFILE)"
    fi
    # A name another connected client holds is refused until that client goes: no join timeout's
    # worth of waiting changes that, so it is said at once.
    if [ -f "$LOGFILE" ] && grep -q "node name '$NODE_NAME' belongs to another client (connected from" "$LOGFILE"; then
      why="$(grep -o "belongs to another client (connected from [^)]*)" "$LOGFILE" | tail -n 1)"
      if [ "$started" = 1 ]; then
        edl_stop "edl client ($NODE_NAME)" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-$((STOP_GRACE_S + 20))}" >/dev/null 2>&1
      fi
      edl_die "the server at $SERVER refuses node name $NODE_NAME: it ${why:-belongs to another client}; give this client its own name (EDL_NODE_NAME, or name= in the hosts file) or stop the other one (log $LOGFILE)$([ "$started" = 1 ] && echo "; this client was stopped again")"
    fi
    if out="$(timeout 15 "$EDL_BIN" ctl --server "$SERVER" --secret_file "$EDL_SECRET_FILE" status --json 2>&1)"; then
      state="$(printf '%s\n' "$out" | edl_node_state "$NODE_NAME")"
      out=""
    else
      state="no answer from the server: $(printf '%s\n' "$out" | tail -n 1)"
    fi
    case "$state" in
      trainers*)
        if pgrep -P "$pid" >/dev/null 2>&1 || ! command -v pgrep >/dev/null 2>&1; then seen=$((seen + 1)); else seen=0; fi
        ;;
      full* | cluster) seen=2 ;;
      *) seen=0 ;;
    esac
    if [ $seen -ge 2 ]; then
      case "$state" in
        trainers*) echo "$(basename "$0"): edl client ($NODE_NAME) joined the server at $SERVER; ${state#trainers } trainer(s) of the job run here" >&2 ;;
        full*) echo "$(basename "$0"): edl client ($NODE_NAME) joined the server at $SERVER; no trainer placed here: the job runs the ${state#full } it wants" >&2 ;;
        *) echo "$(basename "$0"): edl client ($NODE_NAME) runs (a cluster server places jobs' trainers as it sees fit)" >&2 ;;
      esac
      return 0
    fi
    [ $SECONDS -lt $deadline ] || break
    sleep 0.5
  done
  why="$(edl_last_error "$LOGFILE")"
  case "$state" in
    absent) state="the server does not list this node" ;;
    disconnected) state="the server lists this node as disconnected" ;;
    waiting*) state="connected, but no trainer of the job runs here ($state)" ;;
  esac
  if [ "$started" = 1 ]; then
    edl_stop "edl client ($NODE_NAME)" "$PIDFILE" "${EDL_STOP_TIMEOUT_S:-$((STOP_GRACE_S + 20))}" >/dev/null 2>&1
  fi
  edl_die "edl client ($NODE_NAME) did not join the server at $SERVER with a running trainer within ${timeout}s (EDL_JOIN_TIMEOUT_S): $state; the client's last error: ${why:-none} (log $LOGFILE)$([ "$started" = 1 ] && echo "; the client was stopped again")"
}

started=1
if edl_running_pid "$PIDFILE" >/dev/null; then started=0; fi
edl_run "edl client ($NODE_NAME)" "$PIDFILE" "$LOGFILE" "$daemon" "$EDL_BIN" "${args[@]}" "$@"
wait_joined "$(edl_running_pid "$PIDFILE" || cat "$PIDFILE" 2>/dev/null || echo 0)" "$started"
