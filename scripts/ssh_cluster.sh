#!/usr/bin/env bash
# Starts, stops or shows an EDL cluster over ssh: `edl server` on the first host of HOSTS_FILE (or
# EDL_SERVER_HOST) and one `edl client` on every host, each as a daemon with a pid file (through
# start_job_server.sh / start_job_client.sh --daemon on that host). `start` starts what is missing
# and leaves what runs (a running server or client is reported and kept), and returns only when
# every node's client has joined the server and its first trainer has started (or the job has all
# the trainers it wants); otherwise it fails naming each node that did not and why (its client's
# last error line), and stops again what it started: nothing of a failed start is left running.
# Resume after a stop or a crash: run `start` again (clients reconnect; the server resumes the job
# from its state directory, $EDL_RUN_DIR/state on the server host, and adopts the trainers they
# report; after a stop the trainers start again from the latest checkpoint; jobserver/state/STATE.md).
# `stop` stops the whole job as one decision (one stop generation, a final checkpoint by rank 0,
# no failures); it exits 1 when that checkpoint failed or was refused, and when a host does not
# answer (naming the nodes that may still run; `stop` can be run again).
#
#   scripts/ssh_cluster.sh start [--replace_secret] HOSTS_FILE
#   scripts/ssh_cluster.sh stop|status HOSTS_FILE
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
# NODE_NAME (the client's --node_name) defaults to HOST without user@.
#
# Before anything starts, on every host at once, and naming every problem (nothing is started
# then): the host answers over ssh; it resolves the server's address; an ADDRESS is one of that
# host's own (and the server's is the server host's); its copy of the cluster secret is the one
# here; the trainer command's program is found there (`command -v`); the server's port is free on
# the server host; and, while a job runs (its record on the server host), EDL_TRAINER_CMD is the
# command the job was started with (a node restarted with another would train another
# configuration).
#
# Assumptions: passwordless ssh (BatchMode, keys or agent) to every host; the EDL checkout with a
# built build/edl sits at the SAME path on every host (EDL_HOME, default this checkout's path;
# an NFS home or `rsync -a` of the tree does it); pid files and logs go to $EDL_RUN_DIR (default
# $EDL_HOME/edl-run, ignored by git) on each host. The cluster secret ($EDL_SECRET_FILE, default
# ~/.edl/secret) is created here if missing and copied, mode 0600, to each host that lacks it; a
# host holding a different one is refused with the command that fixes it, or, with
# --replace_secret, gets this one (only while no server runs).
#
# Environment: EDL_SERVER_HOST [first host], EDL_SERVER_PORT [8180], EDL_SERVER [the server host's
# ADDRESS:EDL_SERVER_PORT], EDL_SERVER_ARGS (further `edl server` flags, e.g. "--scale_script
# config/x.txt"; the trainers' --checkpoint_dir in EDL_TRAINER_CMD is passed to the server too),
# EDL_HOME, EDL_RUN_DIR, EDL_SSH_OPTS (extra ssh options), EDL_JOIN_TIMEOUT_S (how long `start`
# waits for each node to join with a trainer [120]), and every variable start_job_server.sh and
# start_job_client.sh read (EDL_BIN, EDL_JOB_ID, EDL_GPUS, EDL_SLOTS, EDL_TRAINER_CMD, EDL_MODE,
# ...), which is passed on to the remote hosts when set here.
# EDL_PASS_ENV: names or shell patterns of further variables whose values here are passed to every
# remote server and client, and so to the trainers [OMP_* NCCL_* GLOO_*], e.g.
#   EDL_PASS_ENV="OMP_* NCCL_* GLOO_* MY_DATA_DIR" NCCL_DEBUG=INFO scripts/ssh_cluster.sh start hosts
# EDL_SSH replaces the ssh command (tests use it to reach hosts in network namespaces, or to run
# the "remote" side locally).
# The functions run through `parallel` look unreachable to shellcheck:
# shellcheck disable=SC2317
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

usage() {
  echo "usage: $0 start [--replace_secret] HOSTS_FILE | stop HOSTS_FILE | status HOSTS_FILE   (see the comment at the top of $0)" >&2
  exit 2
}
REPLACE_SECRET=0
if [ "${1:-}" = start ] && [ "${2:-}" = --replace_secret ]; then
  REPLACE_SECRET=1
  set -- "$1" "${@:3}"
fi
[ $# -eq 2 ] || usage
ACTION="$1"
HOSTS_FILE="$2"
case "$ACTION" in start | stop | status) ;; *) usage ;; esac
[ -f "$HOSTS_FILE" ] || edl_die "hosts file $HOSTS_FILE does not exist"
SECRET_GIVEN="${EDL_SECRET_FILE:-}"
EDL_STOP_HINT="scripts/ssh_cluster.sh stop $HOSTS_FILE"

EDL_HOME="${EDL_HOME:-$EDL_REPO_DIR}"
EDL_RUN_DIR="${EDL_RUN_DIR:-$EDL_HOME/edl-run}"
EDL_SERVER_PORT="${EDL_SERVER_PORT:-8180}"
# ConnectTimeout and ServerAlive bound every ssh call; BatchMode never prompts for a password.
read -r -a SSH_OPTS <<<"-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=10 -o ServerAliveCountMax=3 ${EDL_SSH_OPTS:-}"
read -r -a SSH_CMD <<<"${EDL_SSH:-ssh}"

# The hosts file, in file order: ssh target, address ("" = ask the host), node name, slots ("" =
# the client's default).
HOSTS=()
ADDRS=()
NAMES=()
SLOTS=()
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  case "$line" in
    *$'\r') edl_die "$HOSTS_FILE line $lineno ends with a carriage return (Windows line endings): convert the file with \`sed -i 's/\\r\$//' $HOSTS_FILE\` (or dos2unix) and run again" ;;
  esac
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
  # One client per machine: a second one on the same host double-books its slots (two trainers on
  # one GPU or core). Only the one-machine setup (loopback hosts) runs several on purpose.
  for j in "${!HOSTS[@]}"; do
    if [ "${HOSTS[$j]#*@}" = "${words[0]#*@}" ] && ! edl_is_loopback "${words[0]#*@}"; then
      edl_die "$HOSTS_FILE line $lineno: host ${words[0]#*@} is listed twice (line of node ${NAMES[$j]} too): one edl client runs per machine, and a second would double-book its slots; list it once, with slots=N for all its slots"
    fi
    if [ -n "$addr" ] && [ "${ADDRS[$j]}" = "$addr" ] && ! edl_is_loopback "$addr"; then
      edl_die "$HOSTS_FILE line $lineno: address $addr is also node ${NAMES[$j]}'s: one edl client runs per machine, and a second would double-book its slots; list the machine once, with slots=N for all its slots"
    fi
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
SERVER_GIVEN="${EDL_SERVER:-}"
EDL_SERVER="${EDL_SERVER:-}"  # set by start (resolve_server) unless given
# The trainer command the running job was started with, kept on the server host from a start
# that succeeded until a stop that did.
TRAINER_CMD_RECORD="$EDL_RUN_DIR/trainer_cmd"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ssh_cluster.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
PASS_ENV="${EDL_PASS_ENV-OMP_* NCCL_* GLOO_*}"

# The variables passed on to the remote scripts, as `export K=V ...;` with quoting safe for sh.
# EDL_SECRET_FILE only when given here: else each host uses its own ~/.edl/secret.
remote_env() {
  local v out
  out="export EDL_RUN_DIR=$(printf '%q' "$EDL_RUN_DIR") EDL_SERVER=$(printf '%q' "$EDL_SERVER")"
  out+=" EDL_SERVER_PORT=$(printf '%q' "$EDL_SERVER_PORT") EDL_STOP_HINT=$(printf '%q' "$EDL_STOP_HINT")"
  if [ -n "$SECRET_GIVEN" ]; then out+=" EDL_SECRET_FILE=$(printf '%q' "$SECRET_GIVEN")"; fi
  for v in EDL_BIN EDL_JOB_ID EDL_BIND EDL_MIN_TRAINERS EDL_MAX_TRAINERS EDL_TRAINERS \
    EDL_SCALE_SCRIPT EDL_STATE_DIR EDL_GPUS EDL_SLOTS EDL_TRAINER_CMD EDL_MODE EDL_STOP_GRACE_S EDL_STOP_TIMEOUT_S \
    EDL_SERVER_ARGS EDL_JOIN_TIMEOUT_S EDL_START_TIMEOUT_S EDL_STOP_JOB_TIMEOUT_S EDL_SOCKET_DIR; do
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

# remote HOST 'EXTRA_ENV' 'COMMAND': runs the shell COMMAND in EDL_HOME on HOST with the passed-on
# env plus EXTRA_ENV (already quoted `K=V` words, evaluated by the remote shell).
remote() {
  local host="$1" extra_env="$2" command="$3"
  "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$host" \
    "$(remote_env) ${extra_env:+export $extra_env;} cd $(printf '%q' "$EDL_HOME") && $command" </dev/null
}

# on_host HOST 'EXTRA_ENV' SCRIPT ARGS...: runs scripts/SCRIPT ARGS in EDL_HOME on HOST.
on_host() {
  local host="$1" extra_env="$2" script="$3" args="" a
  shift 3
  for a in "$@"; do args+=" $(printf '%q' "$a")"; done
  remote "$host" "$extra_env" "scripts/$script$args"
}

# The env a node's client runs with: its node name, its slots= and its address column when given.
client_env() {
  local i="$1" out
  out="EDL_NODE_NAME=$(printf '%q' "${NAMES[$i]}")"
  if [ -n "${SLOTS[$i]}" ]; then out+=" EDL_SLOTS=${SLOTS[$i]}"; fi
  if [ -n "${ADDRS[$i]}" ]; then out+=" EDL_ADVERTISE_ADDR=$(printf '%q' "${ADDRS[$i]}")"; fi
  echo "$out"
}

# client_on INDEX 'EXTRA_ENV' ARGS...: start_job_client.sh ARGS on the INDEXth host, under its
# node name (the client's pid file is named after it) and with its slots= when given.
client_on() {
  local i="$1" extra="${2:-}"
  shift 2
  on_host "${HOSTS[$i]}" "$(client_env "$i") $extra" start_job_client.sh "$@"
}

# parallel FUNCTION INDEX...: runs `FUNCTION INDEX` for every INDEX at once, each one's output in
# $WORK/INDEX.out and exit status in $WORK/INDEX.rc; returns when all have finished.
parallel() {
  local fn="$1" i
  shift
  for i in "$@"; do
    ( set +e; "$fn" "$i" >"$WORK/$i.out" 2>&1; echo $? >"$WORK/$i.rc" ) &
  done
  wait
}
rc_of() { cat "$WORK/$1.rc" 2>/dev/null || echo 1; }
out_of() { cat "$WORK/$1.out" 2>/dev/null || true; }

# Every host of the file, then the server host when it is not one of them: indexes into ALL_HOSTS.
ALL_HOSTS=("${HOSTS[@]}")
SERVER_INDEX=-1
for i in "${!HOSTS[@]}"; do
  if [ "${HOSTS[$i]}" = "$SERVER_HOST" ] && [ "$SERVER_INDEX" -lt 0 ]; then SERVER_INDEX=$i; fi
done
if [ "$SERVER_INDEX" -lt 0 ]; then
  ALL_HOSTS+=("$SERVER_HOST")
  SERVER_INDEX=$((${#ALL_HOSTS[@]} - 1))
fi

probe_one() { "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "${ALL_HOSTS[$1]}" true </dev/null; }

# Sets UNREACHABLE to the "  HOST: ssh error" lines of the hosts that do not answer (all asked at
# once, each bounded by ConnectTimeout) and REACHABLE_IDX to the indexes of the others.
probe_hosts() {
  local i
  parallel probe_one "${!ALL_HOSTS[@]}"
  UNREACHABLE=""
  REACHABLE_IDX=()
  for i in "${!ALL_HOSTS[@]}"; do
    if [ "$(rc_of "$i")" = 0 ]; then
      REACHABLE_IDX+=("$i")
    else
      UNREACHABLE+=$'\n'"  ${ALL_HOSTS[$i]}: $(out_of "$i" | tail -n 1)"
    fi
  done
}
reachable() {
  local i
  for i in "${REACHABLE_IDX[@]}"; do [ "$i" != "$1" ] || return 0; done
  return 1
}

# Sets EDL_SERVER (unless given) to the server host's address column, else to its first
# `hostname -I` address; then stops unless every host resolves that address.
resolve_server() {
  local i addr q bad=""
  if [ -z "$EDL_SERVER" ]; then
    addr="$SERVER_ADDR"
    if [ -z "$addr" ]; then
      addr="$("${SSH_CMD[@]}" "${SSH_OPTS[@]}" "$SERVER_HOST" "hostname -I" </dev/null | awk '{ print $1 }')"
      [ -n "$addr" ] || edl_die "$SERVER_HOST reports no address (hostname -I): give it an address column in $HOSTS_FILE"
    fi
    EDL_SERVER="$addr:$EDL_SERVER_PORT"
  fi
  q="$(printf '%q' "${EDL_SERVER%:*}")"
  resolves_one() { "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "${HOSTS[$1]}" "getent ahosts $q >/dev/null" </dev/null; }
  parallel resolves_one "${!HOSTS[@]}"
  for i in "${!HOSTS[@]}"; do
    [ "$(rc_of "$i")" = 0 ] || bad+=" ${HOSTS[$i]}"
  done
  [ -z "$bad" ] || edl_die "these hosts cannot resolve the server address ${EDL_SERVER%:*} (nothing was started):$bad; put the server's IP address in its line of $HOSTS_FILE (HOST ADDRESS) or set EDL_SERVER"
}

# The secret's path on a host, for its shell: EDL_SECRET_FILE when given here, else ~/.edl/secret.
remote_secret_path() {
  # shellcheck disable=SC2016  # $HOME is the remote shell's
  if [ -n "$SECRET_GIVEN" ]; then printf '%q' "$SECRET_GIVEN"; else echo '"$HOME/.edl/secret"'; fi
}

# Copies the local secret to ALL_HOSTS[INDEX] (mode 0600, through a temporary file and a rename).
push_secret() {
  local f
  f="$(remote_secret_path)"
  "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "${ALL_HOSTS[$1]}" \
    "f=$f; umask 077; mkdir -p \"\$(dirname \"\$f\")\" && cat >\"\$f.tmp.\$\$\" && chmod 600 \"\$f.tmp.\$\$\" && mv \"\$f.tmp.\$\$\" \"\$f\"" \
    <"$EDL_SECRET_FILE"
}

# Prints one problem line per host whose secret differs from the local one (after copying the
# local one to the hosts without one, and with --replace_secret to those with another one).
check_secrets() {
  local i f mine theirs shown
  f="$(remote_secret_path)"
  mine="$(sha256sum <"$EDL_SECRET_FILE" | cut -c1-64)"
  digest_one() { "${SSH_CMD[@]}" "${SSH_OPTS[@]}" "${ALL_HOSTS[$1]}" "f=$f; if [ -f \"\$f\" ]; then sha256sum <\"\$f\" | cut -c1-64; else echo missing; fi" </dev/null; }
  parallel digest_one "${!ALL_HOSTS[@]}"
  shown="${SECRET_GIVEN:-.edl/secret}"
  for i in "${!ALL_HOSTS[@]}"; do
    theirs="$(out_of "$i" | tail -n 1)"
    if [ "$theirs" = missing ] || { [ "$theirs" != "$mine" ] && [ $REPLACE_SECRET = 1 ]; }; then
      echo "ssh_cluster: copying the cluster secret to ${ALL_HOSTS[$i]}:$shown" >&2
      push_secret "$i" >&2 || echo "${ALL_HOSTS[$i]}: cannot copy the cluster secret there"
    elif [ "$theirs" != "$mine" ]; then
      echo "${ALL_HOSTS[$i]}: holds a different cluster secret in $shown than $EDL_SECRET_FILE here (its clients would be refused: bad HMAC); copy this one there (scp -p $EDL_SECRET_FILE ${ALL_HOSTS[$i]}:$shown), or run start with --replace_secret to push it to every host that differs"
    fi
  done
}

# Runs the checks of ALL_HOSTS[INDEX] there; prints "problem server|client: ..." lines, "running
# server|client" for what runs, and "record CMD" for the job's recorded trainer command.
check_host() {
  local i="$1" cmd=""
  if [ "$i" = "$SERVER_INDEX" ]; then
    local check_addr=""
    if [ -z "$SERVER_GIVEN" ]; then check_addr="EDL_CHECK_SERVER_ADDR=$(printf '%q' "${EDL_SERVER%:*}")"; fi
    cmd+="$check_addr scripts/start_job_server.sh --check | sed 's/^/problem server: /';"
    cmd+=" scripts/start_job_server.sh --status >/dev/null 2>&1 && echo 'running server' || true;"
    cmd+=" [ -f $(printf '%q' "$TRAINER_CMD_RECORD") ] && { printf 'record '; cat $(printf '%q' "$TRAINER_CMD_RECORD"); echo; } || true;"
  fi
  if [ "$i" -lt ${#HOSTS[@]} ]; then
    cmd+=" ( export $(client_env "$i"); scripts/start_job_client.sh --check | sed 's/^/problem client: /';"
    cmd+=" scripts/start_job_client.sh --status >/dev/null 2>&1 && echo 'running client' || true );"
  fi
  remote "${ALL_HOSTS[$i]}" "" "$cmd"
}

# Checks every host at once (start_job_server.sh / start_job_client.sh --check there) and records
# what runs already: SERVER_RAN, CLIENT_RAN[i] (1 or 0). Prints one problem line per problem.
preflight() {
  local i line
  parallel check_host "${!ALL_HOSTS[@]}"
  SERVER_RAN=0
  RECORDED_CMD=""
  RECORDED=0
  CLIENT_RAN=()
  for i in "${!ALL_HOSTS[@]}"; do
    CLIENT_RAN[i]=0
    [ "$(rc_of "$i")" = 0 ] || echo "${ALL_HOSTS[$i]}: the checks did not run there: $(out_of "$i" | tail -n 1)"
    while IFS= read -r line; do
      case "$line" in
        'problem server: '*) echo "${ALL_HOSTS[$i]} (server): ${line#problem server: }" ;;
        'problem client: '*) echo "${ALL_HOSTS[$i]} (node ${NAMES[$i]}): ${line#problem client: }" ;;
        'running server') SERVER_RAN=1 ;;
        'running client') CLIENT_RAN[i]=1 ;;
        'record '*) RECORDED=1; RECORDED_CMD="${line#record }" ;;
      esac
    done < <(out_of "$i")
  done
}

start_client() { client_on "$1" "" --daemon; }
stop_client() { client_on "$1" "" --stop; }

# Stops what this start started (clients first, then the server), all at once per role.
roll_back() {
  local i started=()
  for i in "${!HOSTS[@]}"; do [ "${CLIENT_RAN[$i]}" = 1 ] || started+=("$i"); done
  if [ ${#started[@]} -gt 0 ]; then parallel stop_client "${started[@]}"; fi
  if [ "$SERVER_RAN" = 0 ]; then
    on_host "$SERVER_HOST" "" start_job_server.sh --abort >/dev/null 2>&1 || true
  fi
}

start() {
  local i problems failed="" line
  probe_hosts
  [ -z "$UNREACHABLE" ] || edl_die "cannot reach these hosts over ssh (nothing was started):$UNREACHABLE"$'\n'"fix the hosts file or ssh access (passwordless, BatchMode)"
  resolve_server
  edl_ensure_secret  # the local copy, created here if missing, is the one pushed
  check_secrets >"$WORK/secret.problems"
  preflight >"$WORK/host.problems"
  problems="$(cat "$WORK/secret.problems" "$WORK/host.problems")"
  if [ $REPLACE_SECRET = 1 ] && [ "$SERVER_RAN" = 1 ]; then
    problems+=$'\n'"$SERVER_HOST (server): runs already, with the secret it read at its start: --replace_secret is for a stopped job (run stop first)"
  fi
  if [ "$RECORDED" = 1 ] && [ "$RECORDED_CMD" != "${EDL_TRAINER_CMD:-}" ]; then
    problems+=$'\n'"EDL_TRAINER_CMD here is '${EDL_TRAINER_CMD:-}' but the job that runs (or was not stopped) was started with '$RECORDED_CMD' ($SERVER_HOST:$TRAINER_CMD_RECORD): a node started with another command joins with another configuration; set EDL_TRAINER_CMD='$RECORDED_CMD' and run start again, or stop the job first (scripts/ssh_cluster.sh stop $HOSTS_FILE) to change it"
  fi
  problems="$(grep -v '^$' <<<"$problems" || true)"
  [ -z "$problems" ] || edl_die "not started (nothing was started), because:"$'\n'"  ${problems//$'\n'/$'\n'  }"

  echo "ssh_cluster: starting edl server on $SERVER_HOST (clients connect to $EDL_SERVER)" >&2
  if ! on_host "$SERVER_HOST" "" start_job_server.sh --daemon; then
    roll_back
    edl_die "edl server did not start on $SERVER_HOST (above); nothing of this start is left running"
  fi
  echo "ssh_cluster: starting edl clients on ${HOSTS[*]}; waiting until each has joined with a trainer (EDL_JOIN_TIMEOUT_S=${EDL_JOIN_TIMEOUT_S:-120})" >&2
  parallel start_client "${!HOSTS[@]}"
  for i in "${!HOSTS[@]}"; do
    out_of "$i" | sed "s/^/  [${NAMES[$i]}] /" >&2
    if [ "$(rc_of "$i")" != 0 ]; then
      line="$(out_of "$i" | grep -v '^[[:space:]]*$' | tail -n 1 || true)"
      failed+=$'\n'"  ${NAMES[$i]} (${HOSTS[$i]}): ${line#start_job_client.sh: }"
    fi
  done
  if [ -n "$failed" ]; then
    roll_back
    edl_die "these nodes did not join the job:$failed"$'\n'"what this start had started was stopped again (nothing of it is left running); fix the above and run start again"
  fi
  if [ "$RECORDED" = 0 ]; then
    remote "$SERVER_HOST" "" "printf '%s' $(printf '%q' "${EDL_TRAINER_CMD:-}") >$(printf '%q' "$TRAINER_CMD_RECORD")" ||
      echo "ssh_cluster: could not record the trainer command on $SERVER_HOST" >&2
  fi
  echo "ssh_cluster: every node joined the job (server $EDL_SERVER); see it with: scripts/ssh_cluster.sh status $HOSTS_FILE; stop it with: $EDL_STOP_HINT" >&2
}

# The whole job first, as one decision through the server (start_job_server.sh --stop: one stop
# generation, rank 0's final checkpoint, then the clients and the server exit by themselves);
# then whatever client still runs (e.g. one that had lost the server) is stopped host by host.
# Hosts that do not answer are named at the end: their clients and trainers may still run.
stop() {
  local i rc=0 left="" server_rc=1 clients_rc=0
  probe_hosts
  if reachable "$SERVER_INDEX"; then
    echo "ssh_cluster: stopping the job through edl server on $SERVER_HOST" >&2
    server_rc=0
    on_host "$SERVER_HOST" "" start_job_server.sh --stop || server_rc=$?
    [ "$server_rc" = 0 ] || rc=1
  else
    echo "ssh_cluster: the server host $SERVER_HOST does not answer: the job could not be stopped as one decision" >&2
    rc=1
  fi
  local reach=() names=""
  for i in "${!HOSTS[@]}"; do
    if reachable "$i"; then
      reach+=("$i")
      names+=" ${NAMES[$i]}"
    else
      left+=$'\n'"  ${NAMES[$i]} (${HOSTS[$i]})"
    fi
  done
  if [ ${#reach[@]} -gt 0 ]; then
    echo "ssh_cluster: stopping what still runs of the edl clients of nodes$names" >&2
    parallel stop_client "${reach[@]}"
    for i in "${reach[@]}"; do
      out_of "$i" | sed "s/^/  [${NAMES[$i]}] /" >&2
      [ "$(rc_of "$i")" = 0 ] || clients_rc=1
    done
    [ "$clients_rc" = 0 ] || rc=1
  fi
  if [ -n "$UNREACHABLE" ]; then
    echo "ssh_cluster: these hosts did not answer over ssh:$UNREACHABLE" >&2
    [ -z "$left" ] || echo "ssh_cluster: the edl client and trainers of these nodes may still run:$left" >&2
    echo "ssh_cluster: run \`$EDL_STOP_HINT\` again once they answer (stopping what is stopped already is harmless)" >&2
    return 1
  fi
  # The job no longer runs once the server stopped it (3: its final checkpoint failed, which this
  # stop reports) and every client is gone: the next start may use another command.
  if { [ "$server_rc" = 0 ] || [ "$server_rc" = 3 ]; } && [ "$clients_rc" = 0 ]; then
    remote "$SERVER_HOST" "" "rm -f $(printf '%q' "$TRAINER_CMD_RECORD")" || true
  fi
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
