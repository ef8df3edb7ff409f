#!/usr/bin/env bash
# Checks that no C++ source reads JSON with a throwing or unchecked accessor outside the decoders.
# Bytes from a peer or a user's program are decoded once, at the edge, into typed structs
# (edl/proto: messages.h, trainer_events.h, frames.h; the one field reader edl/proto/fields.h);
# everything after the edge reads the structs. A nlohmann accessor elsewhere (`.value("key", ...)`,
# `.get<T>()`, `.get_ref<T>()`, `.at("key")`, or reading `j["key"]`) throws or asserts on a value
# of another type or a missing key: one mistyped message would stop the process.
#
#   scripts/check_json_reads.sh            every tracked C++ source outside the decoders
#   scripts/check_json_reads.sh FILE...    these files only (decoders included)
#
# A line that reads JSON this process built itself (never bytes from outside) may say so with a
# trailing `// json: own` comment, which names why the read cannot throw on peer input. Exits 1
# listing every offending line, 0 when there is none, 2 on a usage error.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The decoders: the only files that read JSON field by field. edl/proto: the wire's messages;
# state_value.h and *_state.cc: the server's stored state; job_spec.cc: a submitted job's spec;
# etcd_client.cc: etcd's replies; checkpoint_store.cc: a checkpoint's metadata.
decoders='^(edl/proto/[a-z_]+\.(cc|h)|jobserver/state/[a-z_]+\.(cc|h)|jobserver/policy/job_spec\.cc|edl/ckpt/checkpoint_store\.cc|tools/sched_sim/workload\.cc)$'

files=()
if [ $# -gt 0 ]; then
  case "$1" in
    -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_json_reads: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  files=("$@")
else
  while IFS= read -r f; do
    [[ "$f" =~ $decoders ]] || files+=("$f")
  done < <(git ls-files -- '*.cc' '*.h' | grep -vE '^(tests|bench|examples)/')
fi

# Accessors that throw or assert on a peer's value; `["key"]` counts unless it is assigned to or
# appended to (`j["key"] = v`, `j["key"].push_back(v)`, which build JSON).
pattern='\.value\("|(\.|->)get<|(\.|->)get_ref<|\.at\("|\["[A-Za-z0-9_]+"\] *([^ =.[]|==|$)|\["[A-Za-z0-9_]+"\]\.[a-oq-z]'
status=0
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "check_json_reads: no such file: $f" >&2; exit 2; }
  grep -q json "$f" || continue  # no JSON here (maps and Boost options read alike)
  # Comments are not code: drop // comments (outside strings, roughly) before matching.
  rc=0
  out=$(sed -E 's@(^|[^:"])//.*$@\1@' "$f" | grep -nE "$pattern") || rc=$?
  [ $rc -le 1 ] || { echo "check_json_reads: grep failed on $f" >&2; exit 2; }
  [ -n "$out" ] || continue
  own=$(grep -nE '// json: own' "$f" | cut -d: -f1 | tr '\n' ' ' || true)
  while IFS= read -r line; do
    n=${line%%:*}
    [[ " $own " == *" $n "* ]] && continue
    echo "$f:$line"
    status=1
  done <<< "$out"
done
if [ $status -ne 0 ]; then
  echo "check_json_reads: the lines above read JSON outside the decoders; decode the message into" \
       "its typed struct at the edge (edl/proto) and read the struct, or mark JSON this process" \
       "built itself with '// json: own'" >&2
fi
exit $status
