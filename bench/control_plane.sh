#!/usr/bin/env bash
# Control plane at cluster scale, simulated on one machine: one `edl server` and 1000 simulated
# clients with 8 slots each (build/edl_sim_clients). Measures the time from
# running `edl ctl scale N` to every client holding the new generation, for a small step
# (+8 trainers) and a large one (+4000 trainers, 500 nodes start joiners), the server's and the
# simulated clients' CPU time for the large step, and the server's RSS. Then the same again with the
# server's HTTP endpoint on (--http_addr, docs/WATCHING.md) and /metrics read every
# second during the steps, as Prometheus would: the steps with and without it, and what one scrape
# of the 1000 nodes' metrics costs the server in CPU (target: at one scrape a second, <= 1% of a
# core). Each way REPEAT times, alternately; medians. About a minute on 2 idle cores. Re-run at
# will; it leaves nothing behind. Knobs: CLIENTS=1000 SLOTS=8 BUILD_DIR=build SCRAPES=100 IDLE_S=5
# REPEAT=3.
set -euo pipefail
BUILD_DIR=${BUILD_DIR:-build}
CLIENTS=${CLIENTS:-1000}
SLOTS=${SLOTS:-8}
SCRAPES=${SCRAPES:-100}
IDLE_S=${IDLE_S:-5}
REPEAT=${REPEAT:-3}
EDL=$BUILD_DIR/edl
SIM=$BUILD_DIR/edl_sim_clients
[[ -x $EDL && -x $SIM ]] || { echo "build first: cmake --build $BUILD_DIR --target edl_bin edl_sim_clients" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if (( $(ulimit -n) < CLIENTS + 100 )); then echo "ulimit -n $(ulimit -n) is too low for $CLIENTS clients" >&2; exit 1; fi

WORK=$(mktemp -d /tmp/edl-bench-cp-XXXXXX)
SERVER_PID='' SIM_PID='' SCRAPER_PID=''
stop_run() {  # the processes of one run, by pid
  local pid
  for pid in "$SCRAPER_PID" "$SIM_PID" "$SERVER_PID"; do
    if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; fi
  done
  wait 2>/dev/null || true
  exec 3<&- 2>/dev/null || true
  SERVER_PID='' SIM_PID='' SCRAPER_PID=''
}
cleanup() {
  stop_run
  rm -rf "$WORK"
}
trap cleanup EXIT
head -c 32 /dev/urandom | base64 > "$WORK/secret"; chmod 600 "$WORK/secret"

cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$SERVER_PID/status"; }
ms() { awk -v u="$1" 'BEGIN {printf "%.1f", u/1000}'; }
ratio() { awk -v r="$1" -v o="$2" 'BEGIN {printf "%.2f", r/o}'; }
# One GET of the server's HTTP endpoint (bash's /dev/tcp: no client to install); the response on stdout.
http_get() {
  local fd
  exec {fd}<>"/dev/tcp/127.0.0.1/$HTTP_PORT"
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&"$fd"
  cat <&"$fd"
  exec {fd}>&-
}

scale() {  # scale N: prints microseconds from starting `edl ctl scale` to every client holding it
  local t0 t1 word g
  t0=$(date +%s%N)
  "$EDL" ctl --server "127.0.0.1:$PORT" --secret_file "$WORK/secret" scale "$1" > /dev/null
  read -r -t 120 word g t1 <&3 || { echo "no generation reached every client" >&2; exit 1; }
  echo $(( (t1 - t0) / 1000 ))
}

# run off|on: a server (on: with --http_addr and a scraper reading /metrics every second during
# the steps) and the simulated clients; sets small_us, large_us, server_cpu, sim_cpu, rss, decode
# and, for "on", the cost of a scrape.
run() {
  local http=() i
  rm -rf "$WORK/events" "$WORK/port" "$WORK/http.port" "$WORK/sim.out"
  [[ $1 == on ]] && http=(--http_addr 127.0.0.1:0 --http_port_file "$WORK/http.port")
  "$EDL" server --server_port 0 --bind 127.0.0.1 --port_file "$WORK/port" --secret_file "$WORK/secret" \
    --job_id bench --trainers 8 --min_trainers 1 --heartbeat_timeout_ms 60000 --join_timeout_s 60 \
    --events_dir "$WORK/events" "${http[@]}" > "$WORK/server.$1.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 200); do [[ -s $WORK/port ]] && break; sleep 0.05; done
  PORT=$(cat "$WORK/port")
  [[ $1 == on ]] && HTTP_PORT=$(cat "$WORK/http.port")

  mkfifo "$WORK/sim.out"
  "$SIM" --server "127.0.0.1:$PORT" --secret_file "$WORK/secret" --clients "$CLIENTS" --slots "$SLOTS" \
    > "$WORK/sim.out" 2> "$WORK/sim.err" &
  SIM_PID=$!
  exec 3< "$WORK/sim.out"
  read -r -t 120 word gen <&3 || { echo "simulated clients did not all register" >&2; tail "$WORK/sim.err" >&2; exit 1; }
  [[ $word == READY ]] || { echo "unexpected: $word $gen" >&2; exit 1; }

  # The server's CPU between changes (the 1000 clients' heartbeats), over IDLE_S.
  local c0 c1 t0 t1 idle_ms idle_wall_ms busy_ms wall_ms
  c0=$(cpu_ms "$SERVER_PID"); t0=$(date +%s%N); sleep "$IDLE_S"; c1=$(cpu_ms "$SERVER_PID"); t1=$(date +%s%N)
  idle_ms=$(( c1 - c0 )) idle_wall_ms=$(( (t1 - t0) / 1000000 ))
  idle_pct=$(awk -v i="$idle_ms" -v iw="$idle_wall_ms" 'BEGIN {printf "%.2f", 100 * i / iw}')
  if [[ $1 == on ]]; then
    # What one scrape costs the server: its CPU over SCRAPES back-to-back scrapes, less what it
    # spends meanwhile anyway (at the rate just measured).
    http_get /metrics > "$WORK/metrics.txt"
    scrape_bytes=$(wc -c < "$WORK/metrics.txt")
    series=$(grep -c '^edl_' "$WORK/metrics.txt" || true)
    grep -q '^edl_node_slots{node=' "$WORK/metrics.txt" || { echo "/metrics lists no node" >&2; head "$WORK/metrics.txt" >&2; exit 1; }
    c0=$(cpu_ms "$SERVER_PID"); t0=$(date +%s%N)
    for ((i = 0; i < SCRAPES; i++)); do http_get /metrics > /dev/null; done
    c1=$(cpu_ms "$SERVER_PID"); t1=$(date +%s%N)
    busy_ms=$(( c1 - c0 )); wall_ms=$(( (t1 - t0) / 1000000 ))
    scrape_ms=$(awk -v b="$busy_ms" -v i="$idle_ms" -v iw="$idle_wall_ms" -v w="$wall_ms" -v n="$SCRAPES" \
      'BEGIN {c = (b - i * w / iw) / n; if (c < 0) c = 0; printf "%.3f", c}')
    # The scraper Prometheus would be: one scrape a second, through the steps below.
    ( while :; do http_get /metrics > /dev/null; sleep 1; done ) &
    SCRAPER_PID=$!
  fi

  small_us=$(scale 16)
  local server0 sim0
  server0=$(cpu_ms "$SERVER_PID") sim0=$(cpu_ms "$SIM_PID")
  large_us=$(scale 4016)
  server_cpu=$(( $(cpu_ms "$SERVER_PID") - server0 )) sim_cpu=$(( $(cpu_ms "$SIM_PID") - sim0 ))
  sleep 0.5
  rss=$(rss_mb)
  # What one real client spends on the large step's update (decode + apply, done by client 0 only).
  decode=$(grep '^DECODE' "$WORK/sim.err" | tail -1)
  [[ -n $decode ]] || { echo "client 0 decoded no generation update" >&2; tail "$WORK/sim.err" >&2; exit 1; }
  stop_run
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# Alternately without and with the endpoint, REPEAT times each, so that load from elsewhere on a
# shared machine falls on both alike; medians below.
declare -A M
for ((r = 0; r < REPEAT; r++)); do
  for mode in off on; do
    run "$mode"
    M[$mode.small]+=" $small_us" M[$mode.large]+=" $large_us" M[$mode.server_cpu]+=" $server_cpu"
    M[$mode.sim_cpu]+=" $sim_cpu" M[$mode.rss]+=" $rss" M[$mode.idle_pct]+=" $idle_pct"
    [[ $mode == on ]] && M[scrape_ms]+=" $scrape_ms"
    [[ $mode == off ]] && off_decode=$decode
  done
done
for k in "${!M[@]}"; do M[$k]=$(median <<< "${M[$k]}"); done
echo "clients=$CLIENTS slots=$SLOTS, medians of $REPEAT runs: small step 8->16: $(ms "${M[off.small]}") ms; large step 16->4016: $(ms "${M[off.large]}") ms; server RSS ${M[off.rss]} MB"
# Wall times share 2 cores with the 1000 simulated clients (whose JSON parsing is serial here, but
# parallel across nodes in a real cluster); CPU time per process separates the two.
echo "large step CPU: server ${M[off.server_cpu]} ms, simulated clients ${M[off.sim_cpu]} ms"
echo "one client's decode + apply of the last update: ${off_decode#DECODE }"
echo "with --http_addr and /metrics read every second: small step $(ms "${M[on.small]}") ms; large step $(ms "${M[on.large]}") ms;" \
  "large step CPU: server ${M[on.server_cpu]} ms, simulated clients ${M[on.sim_cpu]} ms; server RSS ${M[on.rss]} MB"
echo "one /metrics scrape ($scrape_bytes bytes, $series samples): ${M[scrape_ms]} ms of server CPU (median over $REPEAT x $SCRAPES scrapes)"
echo "the server's CPU between changes, no scrapes: ${M[off.idle_pct]}% of a core without the endpoint, ${M[on.idle_pct]}% with it"
scrape_pct=$(awk -v c="${M[scrape_ms]}" 'BEGIN {printf "%.3f", c / 10}')  # ms per 1000 ms, in percent
# No other system was measured in this run: each ref is the target from the issue that set it, so
# the RESULT names say "vs_target" rather than passing a target off as a measured reference. The
# http_on_vs_off lines compare the same steps without the endpoint (ref) and with it read every
# second (ours), both measured here.
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores"
echo "RESULT control_plane_scale_small_ms_vs_target ours=$(ms "${M[off.small]}")ms ref=200ms ratio=$(ratio 200 "$(ms "${M[off.small]}")")"
echo "RESULT control_plane_scale_large_ms_vs_target ours=$(ms "${M[off.large]}")ms ref=200ms ratio=$(ratio 200 "$(ms "${M[off.large]}")")"
echo "RESULT control_plane_server_rss_mb_vs_target ours=${M[off.rss]}MB ref=200MB ratio=$(ratio 200 "${M[off.rss]}")"
echo "RESULT control_plane_metrics_scrape_cpu_pct_vs_target ours=${scrape_pct}% ref=1% ratio=$(awk -v p="$scrape_pct" 'BEGIN {printf "%.1f", (p > 0 ? 1 / p : 999)}')"
echo "RESULT control_plane_scale_large_ms_http_on_vs_off ours=$(ms "${M[on.large]}")ms ref=$(ms "${M[off.large]}")ms ratio=$(ratio "${M[off.large]}" "${M[on.large]}")"
echo "RESULT control_plane_scale_large_server_cpu_ms_http_on_vs_off ours=${M[on.server_cpu]}ms ref=${M[off.server_cpu]}ms ratio=$(ratio "${M[off.server_cpu]}" "${M[on.server_cpu]}")"
