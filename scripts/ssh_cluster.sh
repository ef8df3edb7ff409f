#!/usr/bin/env bash
# Starts, stops or shows an EDL cluster over ssh: `edl server` on the first host of HOSTS_FILE (or
# EDL_SERVER_HOST) and one `edl client` on every host, each as a daemon with a pid file (through
# start_job_server.sh / start_job_client.sh --daemon on that host). Start takes a few seconds per
# host; the cluster then runs until the job ends or `stop`. Resume after a stop or a crash: run
# `start` again (clients reconnect; the server resumes the job from its state directory,
# $EDL_RUN_DIR/state on the server host, and adopts the trainers they report; jobserver/STATE.md).
#
#   scripts/ssh_cluster.sh start|stop|status HOSTS_FILE
#
# HOSTS_FILE: one host per line as ssh reaches it (host or user@host), optionally followed by the
# address that node's trainers bind and advertise (default: the host's first `hostname -I`
# address); blank lines and # comments are ignored.
#
# Assumptions: passwordless ssh (BatchMode, keys or agent) to every host; the EDL checkout with a
# built build/edl sits at the SAME path on every host (EDL_HOME, default this checkout's path;
# an NFS home or `rsync -a` of the tree does it); pid files and logs go to $EDL_RUN_DIR (default
# $EDL_HOME/edl-run) on each host. The cluster secret ($EDL_SECRET_FILE, default ~/.edl/secret) is
# created here if missing and copied with scp, mode 0600, to each host that lacks it.
#
# Environment: EDL_SERVER_HOST [first host], EDL_SERVER_PORT [8180], EDL_HOME, EDL_RUN_DIR,
# EDL_SSH_OPTS (extra ssh/scp options), and every variable start_job_server.sh and
# start_job_client.sh read (EDL_BIN, EDL_JOB_ID, EDL_GPUS, EDL_SLOTS, EDL_TRAINER_CMD, EDL_MODE, ...),
# which is passed on to the remote hosts when set here. EDL_SSH / EDL_SCP replace the ssh / scp
# commands (tests use them to run the "remote" side locally).
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

usage() {
  echo "usage: $0 start|stop|status HOSTS_FILE   (see the comment at the top of $0)" >&2
  exit 2
}
[ $# -eq 2 ] || usage
ACTION="$1"
HOSTS_FILE="$2"
case "$ACTION" in start | stop | status) ;; *) usage ;; esac
[ -f "$HOSTS_FILE" ] || edl_die "hosts file $HOSTS_FILE does not exist"
SECRET_GIVEN="${EDL_SECRET_FILE:-}"

EDL_HOME="${EDL_HOME:-$EDL_REPO_DIR}"
EDL_RUN_DIR="${EDL_RUN_DIR:-$EDL_HOME/edl-run}"
EDL_SERVER_PORT="${EDL_SERVER_PORT:-8180}"
# ConnectTimeout and ServerAlive bound every ssh call; BatchMode never prompts for a password.
read -r -a SSH_OPTS <<<"-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=10 -o ServerAliveCountMax=3 ${EDL_SSH_OPTS:-}"
read -r -a SSH_CMD <<<"${EDL_SSH:-ssh}"
read -r -a SCP_CMD <<<"${EDL_SCP:-scp}"

# Hosts and their advertise addresses, in file order.
HOSTS=()
ADDRS=()
while read -r host addr _; do
  case "$host" in '' | '#'*) continue ;; esac
  HOSTS+=("$host")
  ADDRS+=("${addr:-}")
done <"$HOSTS_FILE"
[ ${#HOSTS[@]} -gt 0 ] || edl_die "hosts file $HOSTS_FILE lists no host"
SERVER_HOST="${EDL_SERVER_HOST:-${HOSTS[0]}}"
SERVER_ADDR="${SERVER_HOST#*@}"  # ssh's user@ is not part of the address
EDL_SERVER="${EDL_SERVER:-$SERVER_ADDR:$EDL_SERVER_PORT}"

# The variables passed on to the remote scripts, as `export K=V ...;` with quoting safe for sh.
# EDL_SECRET_FILE only when given here: else each host uses its own ~/.edl/secret.
remote_env() {
  local v out
  out="export EDL_RUN_DIR=$(printf '%q' "$EDL_RUN_DIR") EDL_SERVER=$(printf '%q' "$EDL_SERVER")"
  out+=" EDL_SERVER_PORT=$(printf '%q' "$EDL_SERVER_PORT")"
  if [ -n "$SECRET_GIVEN" ]; then out+=" EDL_SECRET_FILE=$(printf '%q' "$SECRET_GIVEN")"; fi
  for v in EDL_BIN EDL_JOB_ID EDL_BIND EDL_MIN_TRAINERS EDL_MAX_TRAINERS EDL_TRAINERS \
    EDL_SCALE_SCRIPT EDL_STATE_DIR EDL_GPUS EDL_SLOTS EDL_TRAINER_CMD EDL_MODE EDL_STOP_GRACE_S EDL_STOP_TIMEOUT_S; do
    if [ -n "${!v:-}" ]; then out+=" $v=$(printf '%q' "${!v}")"; fi
  done
  echo "$out;"
}

# on_host HOST 'EXTRA_ENV' SCRIPT ARGS...: runs scripts/SCRIPT ARGS in EDL_HOME on HOST with the
# passed-on env plus EXTRA_ENV (already quoted `K=V` words, evaluated by the remote shell).
on_host() {
  local host="$1" extra_env="$2" script="$3" args="" a
  shift 3
  for a in "$@"; do args+=" $(printf '%q' "$a")"; done
  "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" \
    "$(remote_env) ${extra_env:+export $extra_env;} cd $(printf '%q' "$EDL_HOME") && scripts/$script$args"
}

# The client's node name is the host as listed, without user@ (its pid file is named after it).
client_on() {
  local host="$1" extra="${2:-}"
  shift 2
  on_host "$host" "EDL_NODE_NAME=$(printf '%q' "${host#*@}") $extra" start_job_client.sh "$@"
}

# Copies the local secret to HOST unless the file already exists there (same path when
# EDL_SECRET_FILE is given, else ~/.edl/secret of the remote user).
push_secret() {
  local host="$1" remote_path q
  remote_path="${SECRET_GIVEN:-.edl/secret}"
  q="$(printf '%q' "$remote_path")"
  if "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" "test -f $q"; then
    return 0
  fi
  echo "ssh_cluster: copying the cluster secret to $host:$remote_path" >&2
  "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" "umask 077; mkdir -p \"\$(dirname $q)\""
  "${SCP_CMD[@]}" "${SSH_OPTS[@]}" -p "$EDL_SECRET_FILE" "$host:$remote_path"
  "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" "chmod 600 $q"
}

start() {
  edl_ensure_secret  # the local copy, created here if missing, is the one pushed
  local i host addr
  for host in "${HOSTS[@]}"; do push_secret "$host"; done
  echo "ssh_cluster: starting edl server on $SERVER_HOST (clients connect to $EDL_SERVER)" >&2
  on_host "$SERVER_HOST" "" start_job_server.sh --daemon
  for i in "${!HOSTS[@]}"; do
    host="${HOSTS[$i]}"
    if [ -n "${ADDRS[$i]}" ]; then
      addr="EDL_ADVERTISE_ADDR=$(printf '%q' "${ADDRS[$i]}")"
    else
      addr="EDL_ADVERTISE_ADDR=\$(hostname -I | awk '{print \$1}')"
    fi
    echo "ssh_cluster: starting edl client on $host" >&2
    client_on "$host" "$addr" --daemon
  done
}

stop() {
  local host rc=0
  for host in "${HOSTS[@]}"; do
    echo "ssh_cluster: stopping edl client on $host" >&2
    client_on "$host" "" --stop || rc=1
  done
  echo "ssh_cluster: stopping edl server on $SERVER_HOST" >&2
  on_host "$SERVER_HOST" "" start_job_server.sh --stop || rc=1
  return $rc
}

status() {
  local host rc=0
  on_host "$SERVER_HOST" "" start_job_server.sh --status || rc=1
  for host in "${HOSTS[@]}"; do
    client_on "$host" "" --status || rc=1
  done
  return $rc
}

"$ACTION"
