#!/usr/bin/env bash
# Chaos benchmark: an elastic CPU job that keeps training while its processes are killed.
#
# A real `edl server` (--state_dir, --checkpoint_dir) and NODES `edl client`s (SLOTS slots each; each
# client in its own network namespace behind the server's, when run as root with `ip netns`; on
# loopback otherwise) train ResNet-20 on a Fashion-MNIST subset with the cosine recipe of
# bench/accuracy.sh (lr 0.1 cosine, weight decay 5e-4, 28 px, global batch 128 as a fixed-global
# batch so a re-formed world trains the same steps). For DURATION_S a chaos driver
#  - SIGKILLs a random running trainer every TRAINER_KILL_S,
#  - SIGKILLs a random client every CLIENT_KILL_S (its trainers die with it) and starts it again
#    CLIENT_DOWN_S later (same node name and session token),
#  - SIGKILLs the server every SERVER_KILL_S and starts it again SERVER_DOWN_S later on the same
#    port and --state_dir. With STANDBY=1 (the default) a standby server (`--standby`, same port and
#    --state_dir) waits beside the leader from the start, as docs/CHECKPOINTS.md "Standby servers"
#    advises: the SIGKILL goes to the leader, the standby takes over, and the restarted process is
#    the next standby; STANDBY=0: no standby, the job waits for the restart,
#  - SIGSTOPs one random trainer once, at STOP_AT_S, and leaves it stopped (its client must drop it),
#  - loses one node at NODE_LOSS_AT_S: SIGKILLs a random client and leaves it down for the rest of
#    the run (its trainers regrow on the other nodes' free slots, if any).
# A period or time of 0 turns that action off. Then the same job at a fixed size of TRAINERS with no
# chaos for the same DURATION_S (the reference).
# Schedules (SCHEDULE=...; any variable set explicitly wins):
#   default    2 nodes x 2 slots, 4 trainers; trainer kill every 15 s, client every 120 s, server
#              every 180 s, one trainer SIGSTOPped at 100 s.
#   realistic  4 nodes x 3 slots, 8 trainers; one trainer failure every 180 s and one node lost at
#              half time; no client or server kills, no SIGSTOP.
# Checks, on the job's own records (build/edl_chaos_check, the integration tests' checking code):
# every completed epoch consumed each sample exactly once and each rank fed the labels of exactly
# its planned samples; every generation's members synced identical state; the stopped trainer was
# dropped. Prints
#   RESULT chaos_goodput ours=<committed images/s> ref=<fixed-size images/s> ratio=<ours/ref>
#   RESULT chaos_accuracy ours=<acc>% ref=<acc>% ratio=...   (after the last epoch both completed)
# where committed images are the samples of the steps in the job's final history (a step redone
# after a rollback counts once) over the run's wall window (server start to DURATION_S), and where
# the loss went: seconds without a committed step after each kind of chaos event, and time at each
# world size, also as RESULT lines against the reference's steady step (chaos_gap_per_<action>,
# chaos_failure_stall_p50/p99/max, chaos_growback_after_trainer_kill_p50/max: ratio = steady step /
# ours, above 1 when an action cost less than a step) and the reference's time (chaos_time_at_world_<w>). The load average is printed at the
# start and the end. When a run fails its check,
# no RESULT line is printed and the script exits 1.
# REPEAT pairs (default 3): one pair cannot carry a target on a small shared machine, whose
# reference alone moves by ~10 % between runs; the report gives each pair's goodput, their mean,
# standard deviation and minimum, and the per-run figures (stalls, gaps, grow-backs) as the worst
# run's, with every run's listed. It names every gap and stall over 1 s of every run with its
# generation, its phases and the chaos actions around it.
# Takes 2 x DURATION_S + ~1 min per pair (~63 min at the defaults). Smoke run (~5 min):
#   REPEAT=1 DURATION_S=120 TRAINER_KILL_S=10 CLIENT_KILL_S=40 SERVER_KILL_S=60 STOP_AT_S=25 \
#     TRAIN_SAMPLES=4096 bench/chaos.sh
# Usage: bench/chaos.sh [BUILD_DIR] (default build; needs the targets edl_bin and edl_chaos_check built there).
# KEEP=DIR keeps the run's files there (default: a temporary directory, removed at exit).
set -euo pipefail
BUILD=${1:-build}
EDL=$(realpath "$BUILD/edl")
CHECK=$(realpath "$BUILD/edl_chaos_check")
DURATION_S=${DURATION_S:-600}
case "${SCHEDULE:-default}" in
  default)
    NODES=${NODES:-2} SLOTS=${SLOTS:-2} TRAINERS=${TRAINERS:-4} TRAINER_KILL_S=${TRAINER_KILL_S:-15}
    CLIENT_KILL_S=${CLIENT_KILL_S:-120} SERVER_KILL_S=${SERVER_KILL_S:-180} STOP_AT_S=${STOP_AT_S:-100}
    NODE_LOSS_AT_S=${NODE_LOSS_AT_S:-0} ;;
  realistic)
    NODES=${NODES:-4} SLOTS=${SLOTS:-3} TRAINERS=${TRAINERS:-8} TRAINER_KILL_S=${TRAINER_KILL_S:-180}
    CLIENT_KILL_S=${CLIENT_KILL_S:-0} SERVER_KILL_S=${SERVER_KILL_S:-0} STOP_AT_S=${STOP_AT_S:-0}
    NODE_LOSS_AT_S=${NODE_LOSS_AT_S:-$((DURATION_S / 2))} ;;
  *) echo "SCHEDULE=$SCHEDULE: use default or realistic" >&2; exit 2 ;;
esac
[ "$((NODES * SLOTS))" -ge "$TRAINERS" ] || { echo "NODES x SLOTS ($NODES x $SLOTS) < TRAINERS ($TRAINERS)" >&2; exit 2; }
REPEAT=${REPEAT:-3}
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || { echo "REPEAT=$REPEAT: use a count of pairs, 1 or more" >&2; exit 2; }
case "${ORDER:-chaos-first}" in
  chaos-first) chaos_first=1 ;;
  ref-first) chaos_first=0 ;;
  *) echo "ORDER=$ORDER: use chaos-first or ref-first" >&2; exit 2 ;;
esac
CLIENT_DOWN_S=${CLIENT_DOWN_S:-2}
SERVER_DOWN_S=${SERVER_DOWN_S:-2}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-32768}
EPOCHS=${EPOCHS:-10}
SEED=${SEED:-1}
DATA_DIR=/usr/share/datasets/fashion-mnist
TRAIN_FLAGS=(--model resnet20 --data_dir "$DATA_DIR" --train_samples "$TRAIN_SAMPLES" --batch_policy fixed-global
             --batch_size 128 --base_batch 128 --lr 0.1 --lr_decay cosine --image_size 28
             --weight_decay 5e-4 --epochs "$EPOCHS" --seed "$SEED" --threads 1 --log_every 0
             --comm_timeout_s 20 --checkpoint_steps 50)
for f in "$EDL" "$CHECK"; do
  [ -x "$f" ] || { echo "$f not built: cmake --build $BUILD --target edl_bin edl_chaos_check" >&2; exit 2; }
done
[ -f "$DATA_DIR/train-labels-idx1-ubyte.gz" ] || { echo "Fashion-MNIST not found in $DATA_DIR" >&2; exit 2; }
if [ -n "${KEEP:-}" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/edl-chaos-XXXXXX); fi
STANDBY=${STANDBY:-1}
SERVER_PID="" STANDBY_PID="" CLIENT_PIDS=() STOPPED=""
NS_PREFIX="ec$$"
NETNS=0
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) on $(nproc) cores" >&2; }
now() { date +%s.%N; }
stop_all() {  # every process this script started, by pid (a client's trainers die with it)
  local p
  [ -n "$STOPPED" ] && kill -KILL "$STOPPED" 2>/dev/null || true
  for p in $STANDBY_PID $SERVER_PID "${CLIENT_PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
  sleep 2
  for p in $STANDBY_PID $SERVER_PID "${CLIENT_PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  SERVER_PID="" STANDBY_PID="" CLIENT_PIDS=() STOPPED=""
}
cleanup() {
  stop_all
  if [ "$NETNS" = 1 ]; then for ns in srv $(node_names); do ip netns delete "$NS_PREFIX-$ns" 2>/dev/null || true; done; fi
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# The network: the server's namespace is a router between one namespace per node (veth pairs), so
# the trainers of n1, n2, ... reach each other through it as hosts would.
node_names() { seq -f 'n%g' 1 "$NODES"; }
declare -A SRV_ADDR NODE_ADDR
for n in $(node_names); do SRV_ADDR[$n]=127.0.0.1; NODE_ADDR[$n]=127.0.0.1; done
if [ "$(id -u)" = 0 ] && [ "${USE_NETNS:-1}" = 1 ] && ip netns list > /dev/null 2>&1; then
  NETNS=1
  ip netns add "$NS_PREFIX-srv" && ip -n "$NS_PREFIX-srv" link set lo up
  ip netns exec "$NS_PREFIX-srv" sysctl -qw net.ipv4.ip_forward=1
  i=0
  for n in $(node_names); do
    i=$((i + 1)); ns="$NS_PREFIX-$n"; net="10.232.$i"
    ip netns add "$ns" && ip -n "$ns" link set lo up
    ip link add "${NS_PREFIX}s$i" netns "$NS_PREFIX-srv" type veth peer name "${NS_PREFIX}c$i" netns "$ns"
    ip -n "$NS_PREFIX-srv" addr add "$net.1/24" dev "${NS_PREFIX}s$i"
    ip -n "$NS_PREFIX-srv" link set "${NS_PREFIX}s$i" up
    ip -n "$ns" addr add "$net.2/24" dev "${NS_PREFIX}c$i"
    ip -n "$ns" link set "${NS_PREFIX}c$i" up
    ip -n "$ns" route add default via "$net.1"
    SRV_ADDR[$n]=$net.1; NODE_ADDR[$n]=$net.2
  done
  echo "network: server namespace routing between the namespaces of $(for n in $(node_names); do echo -n "$n (${NODE_ADDR[$n]}) "; done)" >&2
else
  echo "network: loopback (network namespaces need root and ip netns; USE_NETNS=0 turns them off)" >&2
fi
head -c 32 /dev/urandom | base64 > "$WORK/secret"; chmod 600 "$WORK/secret"

ns() {  # the argv prefix that runs a command in node $1's namespace (srv: the server's)
  [ "$NETNS" = 1 ] && echo "ip netns exec $NS_PREFIX-$1"
  return 0
}
start_server() {  # $1 run dir; $2 port (0 = pick one, written to $1/port); $3 standby: a --standby (STANDBY_PID)
  local d=$1 bind=127.0.0.1 standby=()
  [ "$NETNS" = 1 ] && bind=0.0.0.0
  [ "${3:-}" = standby ] && standby=(--standby)
  # shellcheck disable=SC2046
  setsid $(ns srv) "$EDL" server --server_port "$2" --bind "$bind" --port_file "$d/port" \
    --secret_file "$WORK/secret" --job_id chaos --min_trainers 1 --trainers "$TRAINERS" --state_dir "$d/state" \
    --checkpoint_dir "$d/ckpt" --events_dir "$d/events" --heartbeat_timeout_ms 3000 --join_timeout_s 60 \
    --backoff_min_s 1 --backoff_max_s 4 "${standby[@]}" >> "$d/server.log" 2>&1 &
  if [ "${3:-}" = standby ]; then STANDBY_PID=$!; else SERVER_PID=$!; fi
  disown "$!"  # no job-status noise when it is killed
}
start_standby() {  # $1 run dir, $2 port: a standby, once it says it waits for the leader
  start_server "$1" "$2" standby
  local n0 i
  n0=$(grep -c "standby for job chaos: the leader is pid $SERVER_PID" "$1/server.log" || true)
  for i in $(seq 300); do
    [ "$(grep -c "standby for job chaos: the leader is pid $SERVER_PID" "$1/server.log" || true)" -gt "$n0" ] && return 0
    kill -0 "$STANDBY_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "the standby did not start waiting: $(tail -3 "$1/server.log")" >&2
  return 1
}
start_client() {  # $1 run dir, $2 node, $3 its index in CLIENT_PIDS
  local d=$1 n=$2
  # shellcheck disable=SC2046
  setsid $(ns "$n") "$EDL" client --server "${SRV_ADDR[$n]}:$(cat "$d/port")" --secret_file "$WORK/secret" \
    --node_name "$n" --slots "$SLOTS" --advertise_addr "${NODE_ADDR[$n]}" --mode inplace --socket_path "$d/$n.sock" \
    --log_dir "$d/logs" --leave_grace_s 30 --stop_grace_s 2 --trainer_timeout_s 10 --exit_when_done -- \
    "$EDL" train "${TRAIN_FLAGS[@]}" --checkpoint_dir "$d/ckpt" --sample_log "$d/samples.jsonl" >> "$d/$n.log" 2>&1 &
  CLIENT_PIDS[$3]=$!
  disown "$!"
}
trainers() {  # running (not stopped) trainers: the clients' children, less their waiting spares
  local c p
  for c in "${CLIENT_PIDS[@]}"; do
    [ "$c" = lost ] && continue
    for p in $(ps -o pid= --ppid "$c" 2>/dev/null); do
      [ "$p" != "$STOPPED" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" != edl-spare ] && echo "$p"
    done
  done
  return 0
}
gone() { while [ -e "/proc/$1" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; do sleep 0.05; done; }
live_client() {  # the index of a random client that is not lost (empty if none)
  local live=() k
  for k in "${!CLIENT_PIDS[@]}"; do [ "${CLIENT_PIDS[$k]}" != lost ] && live+=("$k"); done
  [ "${#live[@]}" -gt 0 ] && echo "${live[RANDOM % ${#live[@]}]}"
  return 0
}
log_action() { echo "{\"time\": $(now), \"t\": $(( SECONDS - T0 )), \"action\": \"$1\", \"pid\": ${2:-0}}" >> "$D/chaos.jsonl"; }

# One run of DURATION_S; $1 name, $2 1 = with chaos. The server and clients are (re)started by pid.
run() {
  D="$WORK/$1"; mkdir -p "$D"
  local chaos=$2 t next_trainer=$TRAINER_KILL_S next_client=$CLIENT_KILL_S next_server=$SERVER_KILL_S
  local stopped_once=0 lost_once=0 port p k
  T0=$SECONDS
  head -1 /proc/stat > "$D/cpu.txt"  # the machine's CPU time at the start and the end (chaos_report.py)
  echo "{\"time\": $(now), \"t\": 0, \"action\": \"start\", \"pid\": 0}" > "$D/chaos.jsonl"
  start_server "$D" 0
  for _ in $(seq 300); do [ -s "$D/port" ] && break; sleep 0.1; done
  [ -s "$D/port" ] || { echo "$1: the server did not start: $(tail -5 "$D/server.log")" >&2; return 1; }
  port=$(cat "$D/port")
  if [ "$STANDBY" = 1 ]; then start_standby "$D" "$port" || return 1; fi
  CLIENT_PIDS=()
  for k in $(seq 0 $((NODES - 1))); do start_client "$D" "n$((k + 1))" "$k"; done
  while [ $((SECONDS - T0)) -lt "$DURATION_S" ]; do
    sleep 0.5
    t=$((SECONDS - T0))
    [ "$t" -ge "$DURATION_S" ] && break
    grep -q '"type":"finished"' "$D/events/chaos.events.jsonl" 2>/dev/null && { echo "$1: the job finished at ${t} s" >&2; break; }
    [ "$chaos" = 1 ] || continue
    if [ "$TRAINER_KILL_S" -gt 0 ] && [ "$t" -ge "$next_trainer" ]; then
      next_trainer=$((next_trainer + TRAINER_KILL_S))
      mapfile -t ps_ < <(trainers)
      if [ "${#ps_[@]}" -gt 0 ]; then p=${ps_[RANDOM % ${#ps_[@]}]}; kill -KILL "$p" 2>/dev/null && log_action kill_trainer "$p"; fi
    fi
    if [ "$STOP_AT_S" -gt 0 ] && [ "$t" -ge "$STOP_AT_S" ] && [ "$stopped_once" = 0 ]; then
      mapfile -t ps_ < <(trainers)
      if [ "${#ps_[@]}" -gt 0 ]; then
        p=${ps_[RANDOM % ${#ps_[@]}]}; kill -STOP "$p" 2>/dev/null && { STOPPED=$p; stopped_once=1; log_action stop_trainer "$p"; }
      fi
    fi
    if [ "$CLIENT_KILL_S" -gt 0 ] && [ "$t" -ge "$next_client" ]; then
      next_client=$((next_client + CLIENT_KILL_S))
      k=$(live_client)
      if [ -n "$k" ]; then
        p=${CLIENT_PIDS[$k]}
        kill -KILL "$p" 2>/dev/null && log_action "kill_client_n$((k + 1))" "$p"
        gone "$p"
        sleep "$CLIENT_DOWN_S"
        start_client "$D" "n$((k + 1))" "$k"; log_action "start_client_n$((k + 1))" "${CLIENT_PIDS[$k]}"
      fi
    fi
    if [ "$NODE_LOSS_AT_S" -gt 0 ] && [ "$t" -ge "$NODE_LOSS_AT_S" ] && [ "$lost_once" = 0 ]; then
      lost_once=1
      k=$(live_client)
      if [ -n "$k" ]; then
        p=${CLIENT_PIDS[$k]}; CLIENT_PIDS[$k]=lost
        kill -KILL "$p" 2>/dev/null && log_action "lose_node_n$((k + 1))" "$p"
        gone "$p"
      fi
    fi
    if [ "$SERVER_KILL_S" -gt 0 ] && [ "$t" -ge "$next_server" ]; then
      next_server=$((next_server + SERVER_KILL_S))
      kill -KILL "$SERVER_PID" 2>/dev/null && log_action kill_server "$SERVER_PID"
      gone "$SERVER_PID"
      if [ "$STANDBY" = 1 ]; then  # the standby leads now; the restarted process waits behind it
        SERVER_PID=$STANDBY_PID STANDBY_PID=""
        sleep "$SERVER_DOWN_S"
        start_standby "$D" "$port" && log_action start_standby "$STANDBY_PID"
      else
        sleep "$SERVER_DOWN_S"
        start_server "$D" "$port"; log_action start_server "$SERVER_PID"
      fi
    fi
    for k in $(seq 0 $((NODES - 1))); do  # a client that exited by itself (not killed here): say so
      [ "${CLIENT_PIDS[$k]}" = lost ] && continue
      if ! kill -0 "${CLIENT_PIDS[$k]}" 2>/dev/null; then
        echo "$1: client n$((k + 1)) exited at ${t} s: $(tail -2 "$D/n$((k + 1)).log")" >&2
        log_action "client_exited_n$((k + 1))" "${CLIENT_PIDS[$k]}"; start_client "$D" "n$((k + 1))" "$k"
      fi
    done
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "$1: the server exited at ${t} s: $(tail -3 "$D/server.log")" >&2;
                                           log_action server_exited "$SERVER_PID"; start_server "$D" "$port"; }
  done
  log_action end 0
  head -1 /proc/stat >> "$D/cpu.txt"
  stop_all
}

chaos_run() {  # $1: the run's name (chaos, chaos2)
  load
  echo "chaos run (${SCHEDULE:-default} schedule): ${DURATION_S} s, ${TRAINERS} trainers on ${NODES} nodes x ${SLOTS} slots;" \
       "every N s (0 = never): trainer SIGKILL ${TRAINER_KILL_S}, client ${CLIENT_KILL_S}, server ${SERVER_KILL_S}" \
       "($([ "$STANDBY" = 1 ] && echo "a standby takes over" || echo "no standby: the job waits for the restart"));" \
       "$([ "$STOP_AT_S" -gt 0 ] && echo "one trainer SIGSTOPped at ${STOP_AT_S} s" || echo "no SIGSTOP")," \
       "$([ "$NODE_LOSS_AT_S" -gt 0 ] && echo "one node lost at ${NODE_LOSS_AT_S} s" || echo "no node lost")" >&2
  run "$1" 1
}
ref_run() {  # $1: the run's name (ref, ref2)
  load
  echo "reference run: fixed size ${TRAINERS}, no chaos, ${DURATION_S} s" >&2
  run "$1" 0
}
# ORDER=ref-first runs the reference first: on a small shared machine the two runs' steady steps
# can differ by a few % for reasons of their own; swapping the order tells that from chaos.
# REPEAT=N runs N pairs, each in the opposite order of the one before (chaos, ref, ref2, chaos2,
# chaos3, ref3, ...: a drift of the machine over the runs cancels), and reports the goodput of all
# pairs together, each pair's and their spread.
RUNS=()
for i in $(seq 1 "$REPEAT"); do
  suffix=$([ "$i" = 1 ] || echo "$i")
  if [ "$chaos_first" = 1 ]; then chaos_run "chaos$suffix"; ref_run "ref$suffix"
  else ref_run "ref$suffix"; chaos_run "chaos$suffix"; fi
  RUNS+=("chaos$suffix" "ref$suffix")
  chaos_first=$((1 - chaos_first))
done
load

rc=0
for r in "${RUNS[@]}"; do
  "$CHECK" --sample_log "$WORK/$r/samples.jsonl" --events "$WORK/$r/events/chaos.events.jsonl" \
    --labels "$DATA_DIR/train-labels-idx1-ubyte.gz" --train_samples "$TRAIN_SAMPLES" > "$WORK/$r/check.json" \
    || { echo "$r: CHECK FAILED: $(cat "$WORK/$r/check.json")" >&2; rc=1; }
done
# No goodput without exactly-once: the report prints none and exits 1 when a check failed.
/usr/bin/python3 "$(dirname "$0")/chaos_report.py" "$WORK" "$DURATION_S" "$TRAIN_SAMPLES" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$TRAINERS" "$REPEAT" || rc=1
[ -n "${KEEP:-}" ] && echo "run files kept in $WORK" >&2
exit "$rc"
