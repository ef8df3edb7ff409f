#!/usr/bin/env bash
# Starts, stops or shows an EDL cluster over ssh: `edl server` on the first host of HOSTS_FILE (or
# EDL_SERVER_HOST) and one `edl client` on every host, each as a daemon with a pid file (through
# start_job_server.sh / start_job_client.sh --daemon on that host). Start takes a few seconds per
# host; the cluster then runs until the job ends or `stop`. `start` starts what is missing and
# leaves what runs (a running server or client is reported and kept). Resume after a stop or a
# crash: run `start` again (clients reconnect; the server resumes the job from its state
# directory, $EDL_RUN_DIR/state on the server host, and adopts the trainers they report; after a
# stop the trainers start again from the latest checkpoint; jobserver/STATE.md). `stop` stops the
# whole job as one decision (one stop generation, a final checkpoint by rank 0, no failures).
#
#   scripts/ssh_cluster.sh start|stop|status HOSTS_FILE
#
# HOSTS_FILE: one node a line (blank lines and # comments are ignored), in any of these forms:
#   HOST                         ssh target (host, user@host or an ssh alias)
#   HOST ADDRESS [NODE_NAME]     + the node's address: the server's clients connect to it (first
#                                line) and the node's trainers bind and advertise it
#   HOST slots=N                 MPI / Horovod hostfile form: N trainer slots (the first N GPUs, or
#                                N CPU slots on a node without GPUs)
#   ... addr=ADDRESS name=NODE_NAME   the same columns by name, mixed freely with slots=N
# (MPI's max_slots=N is accepted and ignored.) ADDRESS defaults to the node's first `hostname -I`
# address, asked over ssh, so an ssh alias is never handed to a client as the server's address;
# NODE_NAME (the client's --node_name) defaults to HOST without user@. Before anything starts,
# every host must answer over ssh and resolve the server's address; otherwise nothing is started
# and the unreachable host is named.
#
# Assumptions: passwordless ssh (BatchMode, keys or agent) to every host; the EDL checkout with a
# built build/edl sits at the SAME path on every host (EDL_HOME, default this checkout's path;
# an NFS home or `rsync -a` of the tree does it); pid files and logs go to $EDL_RUN_DIR (default
# $EDL_HOME/edl-run, ignored by git) on each host. The cluster secret ($EDL_SECRET_FILE, default
# ~/.edl/secret) is created here if missing and copied with scp, mode 0600, to each host that lacks it.
#
# Environment: EDL_SERVER_HOST [first host], EDL_SERVER_PORT [8180], EDL_SERVER [the server host's
# ADDRESS:EDL_SERVER_PORT], EDL_HOME, EDL_RUN_DIR, EDL_SSH_OPTS (extra ssh/scp options), and every
# variable start_job_server.sh and start_job_client.sh read (EDL_BIN, EDL_JOB_ID, EDL_GPUS,
# EDL_SLOTS, EDL_TRAINER_CMD, EDL_MODE, ...), which is passed on to the remote hosts when set here.
# EDL_PASS_ENV: names or shell patterns of further variables whose values here are passed to every
# remote server and client, and so to the trainers [OMP_* NCCL_* GLOO_*], e.g.
#   EDL_PASS_ENV="OMP_* NCCL_* GLOO_* MY_DATA_DIR" NCCL_DEBUG=INFO scripts/ssh_cluster.sh start hosts
# EDL_SSH / EDL_SCP replace the ssh / scp commands (tests use them to run the "remote" side locally).
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

# The hosts file, in file order: ssh target, address ("" = ask the host), node name, slots ("" =
# the client's default).
HOSTS=()
ADDRS=()
NAMES=()
SLOTS=()
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  read -r -a words <<<"${line%%#*}"
  [ ${#words[@]} -gt 0 ] || continue
  addr="" name="" slots="" column=0
  for w in "${words[@]:1}"; do
    case "$w" in
      slots=*) slots="${w#slots=}" ;;
      max_slots=*) ;;
      addr=*) addr="${w#addr=}" ;;
      name=*) name="${w#name=}" ;;
      *=*) edl_die "$HOSTS_FILE line $lineno: unknown key '${w%%=*}' (known: slots=N, addr=ADDRESS, name=NODE_NAME)" ;;
      *)
        column=$((column + 1))
        case $column in
          1) addr="$w" ;;
          2) name="$w" ;;
          *) edl_die "$HOSTS_FILE line $lineno: too many columns (HOST [ADDRESS [NODE_NAME]] [slots=N])" ;;
        esac
        ;;
    esac
  done
  case "$slots" in
    '') ;;
    *[!0-9]* | 0) edl_die "$HOSTS_FILE line $lineno: slots=$slots is not a positive number" ;;
  esac
  name="${name:-${words[0]#*@}}"
  for n in "${NAMES[@]}"; do
    [ "$n" != "$name" ] || edl_die "$HOSTS_FILE line $lineno: node name $name is used twice (give each line its own name=)"
  done
  HOSTS+=("${words[0]}")
  ADDRS+=("$addr")
  NAMES+=("$name")
  SLOTS+=("$slots")
done <"$HOSTS_FILE"
[ ${#HOSTS[@]} -gt 0 ] || edl_die "hosts file $HOSTS_FILE lists no host"
SERVER_HOST="${EDL_SERVER_HOST:-${HOSTS[0]}}"
SERVER_ADDR=""
for i in "${!HOSTS[@]}"; do
  if [ "${HOSTS[$i]}" = "$SERVER_HOST" ]; then SERVER_ADDR="${ADDRS[$i]}"; fi
done
EDL_SERVER="${EDL_SERVER:-}"  # set by start (resolve_server) unless given
PASS_ENV="${EDL_PASS_ENV-OMP_* NCCL_* GLOO_*}"

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
  for v in $(passed_env_names); do out+=" $v=$(printf '%q' "${!v}")"; done
  echo "$out;"
}

# The exported variables here whose names match a pattern of EDL_PASS_ENV, one per line.
passed_env_names() {
  local name pat
  # Patterns stay unexpanded by the shell: they are matched against names, not files.
  local -a pats
  read -r -a pats <<<"$PASS_ENV"
  for name in $(compgen -e); do
    for pat in "${pats[@]}"; do
      # shellcheck disable=SC2053  # $pat is a glob on purpose
      if [[ $name == $pat ]]; then
        echo "$name"
        break
      fi
    done
  done
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

# client_on INDEX 'EXTRA_ENV' ARGS...: start_job_client.sh ARGS on the INDEXth host, under its
# node name (the client's pid file is named after it) and with its slots= when given.
client_on() {
  local i="$1" extra="${2:-}" slots=""
  shift 2
  if [ -n "${SLOTS[$i]}" ]; then slots="EDL_SLOTS=${SLOTS[$i]}"; fi
  on_host "${HOSTS[$i]}" "EDL_NODE_NAME=$(printf '%q' "${NAMES[$i]}") $slots $extra" start_job_client.sh "$@"
}

# Stops with every host that does not answer over ssh named, before anything is started.
check_reachable() {
  local host err bad="" extra=("$SERVER_HOST")
  for host in "${HOSTS[@]}"; do [ "$host" != "$SERVER_HOST" ] || extra=(); done
  for host in "${HOSTS[@]}" "${extra[@]}"; do
    if ! err="$("${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" true 2>&1)"; then
      bad+=$'\n'"  $host: ${err:-ssh failed}"
    fi
  done
  [ -z "$bad" ] || edl_die "cannot reach these hosts over ssh (nothing was started):$bad"$'\n'"fix the hosts file or ssh access (passwordless, BatchMode)"
}

# Sets EDL_SERVER (unless given) to the server host's address column, else to its first
# `hostname -I` address; then stops unless every host resolves that address.
resolve_server() {
  local i addr q bad=""
  if [ -z "$EDL_SERVER" ]; then
    addr="$SERVER_ADDR"
    if [ -z "$addr" ]; then
      addr="$("${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$SERVER_HOST" "hostname -I" | awk '{ print $1 }')"
      [ -n "$addr" ] || edl_die "$SERVER_HOST reports no address (hostname -I): give it an address column in $HOSTS_FILE"
    fi
    EDL_SERVER="$addr:$EDL_SERVER_PORT"
  fi
  q="$(printf '%q' "${EDL_SERVER%:*}")"
  for i in "${!HOSTS[@]}"; do
    if ! "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "${HOSTS[$i]}" "getent ahosts $q >/dev/null"; then
      bad+=" ${HOSTS[$i]}"
    fi
  done
  [ -z "$bad" ] || edl_die "these hosts cannot resolve the server address ${EDL_SERVER%:*} (nothing was started):$bad; put the server's IP address in its line of $HOSTS_FILE (HOST ADDRESS) or set EDL_SERVER"
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
  check_reachable
  resolve_server
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
    echo "ssh_cluster: starting edl client ${NAMES[$i]} on $host" >&2
    client_on "$i" "$addr" --daemon
  done
}

# The whole job first, as one decision through the server (start_job_server.sh --stop: one stop
# generation, rank 0's final checkpoint, then the clients and the server exit by themselves);
# then whatever client still runs (e.g. one that had lost the server) is stopped host by host.
stop() {
  local i rc=0
  echo "ssh_cluster: stopping the job through edl server on $SERVER_HOST" >&2
  on_host "$SERVER_HOST" "" start_job_server.sh --stop || rc=1
  for i in "${!HOSTS[@]}"; do
    echo "ssh_cluster: checking edl client ${NAMES[$i]} on ${HOSTS[$i]}" >&2
    client_on "$i" "" --stop || rc=1
  done
  return $rc
}

status() {
  local i rc=0
  on_host "$SERVER_HOST" "" start_job_server.sh --status || rc=1
  for i in "${!HOSTS[@]}"; do
    client_on "$i" "" --status || rc=1
  done
  return $rc
}

"$ACTION"
