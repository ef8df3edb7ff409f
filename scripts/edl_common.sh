#!/usr/bin/env bash
# Helpers sourced by start_job_server.sh, start_job_client.sh and ssh_cluster.sh: find the `edl`
# binary, create or check the cluster secret, resolve the server and this node's address, and run
# a role in the foreground or as a daemon with a pid file. Not meant to be run by itself.

# Directory of the EDL checkout (this file lives in <repo>/scripts).
EDL_REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Prints "edl: MESSAGE" on stderr and exits 1.
edl_die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# Creates EDL_RUN_DIR (pid files, logs, events, state) and prints a problem line when this user
# cannot write it, naming EDL_RUN_DIR and the fix (not a raw mkdir or redirection error later).
edl_run_dir_problem() {
  local why=""
  why="$(mkdir -p "$EDL_RUN_DIR" 2>&1)" || true
  if [ ! -d "$EDL_RUN_DIR" ] || [ ! -w "$EDL_RUN_DIR" ] || [ ! -x "$EDL_RUN_DIR" ]; then
    echo "EDL_RUN_DIR=$EDL_RUN_DIR cannot be used on $(hostname) by $(id -un) (${why:-not a directory it can write}): set EDL_RUN_DIR to a directory this user can write (with ssh_cluster.sh: on every host)"
  fi
}

# Sets EDL_BIN: $EDL_BIN if given, else <repo>/build/edl, else `edl` from PATH.
edl_find_bin() {
  if [ -n "${EDL_BIN:-}" ]; then
    if [ ! -f "$EDL_BIN" ] || [ ! -x "$EDL_BIN" ]; then
      edl_die "EDL_BIN=$EDL_BIN is not an executable file; build it with \`make\` or fix EDL_BIN"
    fi
  elif [ -f "$EDL_REPO_DIR/build/edl" ] && [ -x "$EDL_REPO_DIR/build/edl" ]; then
    EDL_BIN="$EDL_REPO_DIR/build/edl"
  elif command -v edl >/dev/null 2>&1; then
    EDL_BIN="$(command -v edl)"
  else
    edl_die "no edl binary: run \`make\` in $EDL_REPO_DIR, or set EDL_BIN=/path/to/edl"
  fi
  export EDL_BIN
}

# Sets EDL_SECRET_FILE (default $HOME/.edl/secret) and creates it, mode 0600, from /dev/urandom
# (32 random bytes as 64 hex characters) when it does not exist yet.
edl_ensure_secret() {
  EDL_SECRET_FILE="${EDL_SECRET_FILE:-$HOME/.edl/secret}"
  export EDL_SECRET_FILE
  if [ -f "$EDL_SECRET_FILE" ]; then
    return 0
  fi
  local dir
  dir="$(dirname "$EDL_SECRET_FILE")"
  mkdir -p "$dir"
  chmod 700 "$dir" 2>/dev/null || true
  (
    umask 077
    head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$EDL_SECRET_FILE.tmp.$$"
    mv "$EDL_SECRET_FILE.tmp.$$" "$EDL_SECRET_FILE"
  )
  chmod 600 "$EDL_SECRET_FILE"
  echo "$(basename "$0"): created cluster secret $EDL_SECRET_FILE (mode 0600); copy it to every node" >&2
}

# Sets EDL_SECRET_FILE (default $HOME/.edl/secret) and stops with the fix when it does not exist:
# a client or a node must hold a copy of the server's secret, and a new one never matches it.
edl_require_secret() {
  EDL_SECRET_FILE="${EDL_SECRET_FILE:-$HOME/.edl/secret}"
  export EDL_SECRET_FILE
  [ -f "$EDL_SECRET_FILE" ] && return 0
  edl_die "the cluster secret $EDL_SECRET_FILE does not exist; copy the server's file here, keeping its mode (scp -p SERVER:.edl/secret $EDL_SECRET_FILE), or set EDL_SECRET_FILE to its path (scripts/ssh_cluster.sh copies it for you)"
}

# True when ADDRESS names this machine only (127.0.0.0/8, ::1, localhost).
edl_is_loopback() {
  case "$1" in 127.* | ::1 | localhost | localhost.*) return 0 ;; esac
  return 1
}

# Prints the IP address HOST:PORT's host resolves to here (IPv4 first); stops with the fix when it
# does not resolve, since a client would retry "cannot resolve" forever.
edl_resolve_server() {
  local server="$1" host ip
  host="${server%:*}"
  host="${host#[}"
  host="${host%]}"
  ip="$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 { print $1 }')"
  [ -n "$ip" ] || ip="$(getent ahosts "$host" 2>/dev/null | awk 'NR == 1 { print $1 }')"
  [ -n "$ip" ] || edl_die "cannot resolve the server host '$host' (EDL_SERVER=$server) on $(hostname): give the server's IP address, or a name every node resolves (an ssh alias from ~/.ssh/config is not one)"
  echo "$ip"
}

# Prints the address this node's trainers should bind and advertise for a server at IP: 127.0.0.1
# when the server is on loopback (one machine), else the source address of the route to it (the
# interface the other nodes reach this one through). Stops with the fix when there is none.
edl_default_advertise_addr() {
  local ip="$1" src
  if edl_is_loopback "$ip"; then
    echo 127.0.0.1
    return 0
  fi
  src="$(ip -o route get "$ip" 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }')"
  [ -n "$src" ] || edl_die "no route from $(hostname) to the server at $ip to take this node's address from: set EDL_ADVERTISE_ADDR to the address the other nodes reach this one at"
  echo "$src"
}

# Prints the pid in PIDFILE if that process is alive, else nothing (and returns 1). A zombie (dead,
# not yet reaped by whoever adopted it) is not alive.
edl_running_pid() {
  local pidfile="$1" pid stat
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  kill -0 "$pid" 2>/dev/null || return 1
  if stat="$(cat "/proc/$pid/stat" 2>/dev/null)"; then
    case "${stat##*) }" in Z* | X*) return 1 ;; esac
  fi
  echo "$pid"
}

# edl_run NAME PIDFILE LOGFILE DAEMON CMD...: runs CMD in the foreground (exec) or, when DAEMON is
# 1, detached in its own session with output appended to LOGFILE and its pid in PIDFILE (the stop
# command it prints is EDL_STOP_HINT when set: ssh_cluster.sh sets its own). When
# PIDFILE names a live process, that one is kept and reported (start what is missing, leave what
# runs: starting a cluster again after a crash only restarts what died).
edl_run() {
  local name="$1" pidfile="$2" logfile="$3" daemon="$4" pid
  shift 4
  if pid="$(edl_running_pid "$pidfile")"; then
    echo "$(basename "$0"): $name is already running (pid $pid, $pidfile): kept as it is" >&2
    return 0
  fi
  if [ "$daemon" != 1 ]; then
    echo "$(basename "$0"): running in the foreground: $*" >&2
    exec "$@"
  fi
  mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
  # setsid: own session, so the daemon outlives this shell and its terminal.
  setsid "$@" >>"$logfile" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  sleep 0.5
  if ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$pidfile"
    echo "$(basename "$0"): $name exited at once; the end of $logfile:" >&2
    tail -n 20 "$logfile" >&2 || true
    edl_die "$name exited at start: $(edl_explain "$(edl_last_error "$logfile")") (log $logfile)"
  fi
  echo "$(basename "$0"): $name started (pid $pid); log $logfile; stop with: ${EDL_STOP_HINT:-$0 --stop}" >&2
}

# edl_stop NAME PIDFILE TIMEOUT_S: SIGTERM, up to TIMEOUT_S seconds, then SIGKILL. Removes PIDFILE.
edl_stop() {
  local name="$1" pidfile="$2" timeout_s="$3" pid i
  if ! pid="$(edl_running_pid "$pidfile")"; then
    echo "$(basename "$0"): $name is not running (no live pid in $pidfile)" >&2
    rm -f "$pidfile"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout_s * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$(basename "$0"): $name (pid $pid) still running after ${timeout_s}s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  echo "$(basename "$0"): $name (pid $pid) stopped" >&2
}

# edl_wait_exit PIDFILE TIMEOUT_S: waits up to TIMEOUT_S seconds for the process in PIDFILE to
# exit; true when it did (or none ran).
edl_wait_exit() {
  local pidfile="$1" timeout_s="$2" i
  for ((i = 0; i < timeout_s * 10; i++)); do
    edl_running_pid "$pidfile" >/dev/null || return 0
    sleep 0.1
  done
  return 1
}

# edl_status NAME PIDFILE: prints whether it runs; returns 0 when it does, 3 when it does not.
edl_status() {
  local name="$1" pidfile="$2" pid
  if pid="$(edl_running_pid "$pidfile")"; then
    echo "$name: running (pid $pid)"
    return 0
  fi
  echo "$name: not running"
  return 3
}

# ---- checks before a start, and what a start is waiting for (the scripts' "no silent failure")

# Prints a daemon's reason for failing from LOGFILE: its last error line (a glog E or F line, as
# "E20260102 12:00:00.1 42 f.cc:9] msg" -> "msg", or a line of its own such as "edl server: IOError:
# ..."), else its last warning, else its last non-empty line; nothing without a log.
edl_last_error() {
  local logfile="$1" line
  [ -f "$logfile" ] || return 0
  line="$(grep -E '^[EF][0-9]{4}|^[^IWEF[:space:]]|^[IWEF]([^0-9]|$)' "$logfile" 2>/dev/null | tail -n 1 || true)"
  [ -n "$line" ] || line="$(grep -E '^W[0-9]{4}' "$logfile" 2>/dev/null | tail -n 1 || true)"
  [ -n "$line" ] || line="$(grep -v '^[[:space:]]*$' "$logfile" 2>/dev/null | tail -n 1 || true)"
  case "$line" in [IEFW][0-9][0-9][0-9][0-9]*'] '*) line="${line#*] }" ;; esac
  echo "$line"
}

# Splits a command line into the array EDL_WORDS the way `edl client --trainer_cmd` does
# (edl::SplitCommandLine, edl/base/flags.h; ScriptsTest checks the two agree): at blanks; '...'
# keeps everything; "..." keeps everything but a backslash before " \ $ ` (which it escapes);
# outside quotes a backslash keeps the next character. No expansion. Returns 1 (EDL_WORDS then
# holds the words so far) for an unterminated quote or a trailing backslash.
edl_split_command() {
  local s="$1" c n cur="" quote="" in_word=0 i
  EDL_WORDS=()
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    if [ "$quote" = "'" ]; then
      if [ "$c" = "'" ]; then quote=""; else cur+="$c"; fi
    elif [ "$quote" = '"' ]; then
      n="${s:i+1:1}"
      if [ "$c" = '"' ]; then
        quote=""
      elif [ "$c" = "\\" ] && [ -n "$n" ] && [[ "$n" == [\"\\\$\`] ]]; then
        cur+="$n"
        i=$((i + 1))
      else
        cur+="$c"
      fi
    elif [ "$c" = "'" ] || [ "$c" = '"' ]; then
      quote="$c"
      in_word=1
    elif [ "$c" = "\\" ]; then
      [ $((i + 1)) -lt ${#s} ] || return 1
      i=$((i + 1))
      cur+="${s:i:1}"
      in_word=1
    elif [ "$c" = ' ' ] || [ "$c" = $'\t' ]; then
      if [ $in_word = 1 ]; then EDL_WORDS+=("$cur"); fi
      cur=""
      in_word=0
    else
      cur+="$c"
      in_word=1
    fi
  done
  [ -z "$quote" ] || return 1
  if [ $in_word = 1 ]; then EDL_WORDS+=("$cur"); fi
  return 0
}

# Prints a daemon's error line with what the scripts call the thing it names: the server's
# --server_port is EDL_SERVER_PORT here.
edl_explain() {
  case "$1" in
    *--server_port* | *"already in use"*)
      echo "$1 (the scripts take the port from EDL_SERVER_PORT, now ${EDL_SERVER_PORT:-8180}: set EDL_SERVER_PORT to a free port)" ;;
    *) echo "$1" ;;
  esac
}

# Prints the program a trainer command line runs: its first word, or with `env` first the word
# after env's options and NAME=VALUE words.
edl_trainer_program() {
  local w after_env=0 skip_next=0
  edl_split_command "$1" || return 0
  for w in "${EDL_WORDS[@]}"; do
    if [ $skip_next = 1 ]; then
      skip_next=0
      continue
    fi
    if [ $after_env = 0 ] && [ "${w##*/}" = env ]; then
      after_env=1
      continue
    fi
    if [ $after_env = 1 ]; then
      case "$w" in -u | --unset | -C | --chdir) skip_next=1; continue ;; -* | *=*) continue ;; esac
    fi
    echo "$w"
    return 0
  done
}

# Prints the value of --checkpoint_dir in a trainer command line (`--checkpoint_dir DIR` or
# `--checkpoint_dir=DIR`), or nothing.
edl_checkpoint_dir_of() {
  local i
  edl_split_command "$1" || return 0
  for ((i = 0; i < ${#EDL_WORDS[@]}; i++)); do
    case "${EDL_WORDS[$i]}" in
      --checkpoint_dir=*) echo "${EDL_WORDS[$i]#--checkpoint_dir=}"; return 0 ;;
      --checkpoint_dir) echo "${EDL_WORDS[$((i + 1))]:-}"; return 0 ;;
    esac
  done
}

# True when ADDRESS (an IP literal or a name, resolved here) is an address of this machine's
# interfaces: a node's trainers bind the address it advertises, and clients connect to the server's.
edl_is_own_address() {
  local addr="$1" ip own
  addr="${addr#[}"
  addr="${addr%]}"
  if edl_is_loopback "$addr"; then return 0; fi
  own="$( { ip -o addr show 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }'; hostname -I 2>/dev/null | tr ' ' '\n'; echo 127.0.0.1; echo ::1; } | sort -u)"
  for ip in $(getent ahosts "$addr" 2>/dev/null | awk '{ print $1 }' | sort -u) "$addr"; do
    if grep -qxF "$ip" <<<"$own"; then return 0; fi
  done
  return 1
}

# Prints what listens on TCP PORT here (ss), or nothing when the port is free or ss is missing.
edl_port_listener() {
  local port="$1"
  command -v ss >/dev/null 2>&1 || return 0
  ss -Hltnp "sport = :$port" 2>/dev/null | awk '{ $1 = $2 = $3 = ""; sub(/^ +/, ""); print; exit }'
}

# edl_node_state NODE: reads `edl ctl status --json` on stdin; prints where NODE stands:
#   trainers N     its client is connected and N trainers of the current generation run there
#   full N         connected, no trainer placed there, and the job runs all N it wants (or is done)
#   waiting ...    connected, no trainer yet (world, target, pending follow)
#   disconnected   the server knows the node but its client is not connected
#   absent         the server does not know the node
#   cluster        a cluster server (edl server --cluster): no per-node placement to wait for
# The status body is nlohmann's dump(2): keys sorted, top-level keys indented 2, a node's 6.
edl_node_state() {
  awk -v node="\"$1\"" '
    function value(line) { sub(/^[^:]*: /, "", line); sub(/,$/, "", line); return line }
    /^  "[a-z_]+": / { k = $1; gsub(/[":]/, "", k); top[k] = value($0) }
    /^  "nodes": \[$/ { in_nodes = 1; next }
    in_nodes && /^  \]/ { in_nodes = 0 }
    in_nodes && /^      "[a-z_]+": / { k = $1; gsub(/[":]/, "", k); cur[k] = value($0) }
    in_nodes && /^    }/ {
      if (cur["name"] == node) { found = 1; conn = cur["connected"]; used = cur["used"] + 0 }
      split("", cur)
    }
    END {
      if (top["cluster"] == "true") { print "cluster"; exit }
      if (!found) { print "absent"; exit }
      if (conn != "true") { print "disconnected"; exit }
      if (used > 0) { print "trainers " used; exit }
      world = top["world_size"] + 0
      if (top["done"] == "true" || (top["pending"] == "false" && world > 0 && world >= top["target"] + 0)) {
        print "full " world; exit
      }
      print "waiting world " world " target " top["target"] " pending " top["pending"]
    }'
}
