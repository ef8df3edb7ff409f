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

# Sets EDL_BIN: $EDL_BIN if given, else <repo>/build/edl, else `edl` from PATH.
edl_find_bin() {
  if [ -n "${EDL_BIN:-}" ]; then
    [ -x "$EDL_BIN" ] || edl_die "EDL_BIN=$EDL_BIN is not an executable file; build it with \`make\` or fix EDL_BIN"
  elif [ -x "$EDL_REPO_DIR/build/edl" ]; then
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
# 1, detached in its own session with output appended to LOGFILE and its pid in PIDFILE. When
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
    exit 1
  fi
  echo "$(basename "$0"): $name started (pid $pid); log $logfile; stop with: $0 --stop" >&2
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
