#!/usr/bin/env bash
# Checks the job server's layering: its rooms, lowest first, and what each may include of the
# others. A room includes only rooms below it (and itself); the server's own files at the top of
# jobserver/ may include every room. Exits 1 naming every include that reaches up, 0 otherwise.
#
#   policy    the cluster policy, goodput models, job specs, scaling scripts: pure decisions
#   services  distillation services: their registry and teacher placement
#   state     the durable state: its encodings, RocksDB and etcd
#   events    the events-log records and the log
#   http      the HTTP endpoint, its request parser, the metrics and the dashboard
#   ctl       `edl ctl`
#   (top)     jobserver/*: the cluster, job memberships, nodes, the rendezvous KV and the server
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rooms=(policy services state events http ctl)
rank_of() {
  local i
  for i in "${!rooms[@]}"; do
    if [ "${rooms[$i]}" = "$1" ]; then echo "$i"; return; fi
  done
  echo "${#rooms[@]}"  # the top: jobserver/ itself
}

status=0
while IFS= read -r f; do
  rel="${f#jobserver/}"
  room="${rel%%/*}"
  [ "$room" != "$rel" ] || room=""
  mine=$(rank_of "$room")
  while IFS=: read -r n inc; do
    target="${inc#jobserver/}"
    troom="${target%%/*}"
    [ "$troom" != "$target" ] || troom=""
    theirs=$(rank_of "$troom")
    if [ "$theirs" -gt "$mine" ]; then
      echo "$f:$n: includes $inc: room '${troom:-jobserver}' is above '${room:-jobserver}'"
      status=1
    fi
  done < <(grep -n -o '^#include "jobserver/[^"]*"' "$f" | sed 's/#include "\(.*\)"/\1/')
done < <(git ls-files 'jobserver/*.cc' 'jobserver/*.h')
if [ $status -ne 0 ]; then
  echo "check_layers: a room includes one above it (scripts/check_layers.sh lists them lowest first);" \
       "move the shared part down, or the caller up" >&2
fi
exit $status
