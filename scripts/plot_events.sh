#!/usr/bin/env bash
# Draws the timeline of one EDL job from its events log (<events_dir>/<job>.events.jsonl, written by
# `edl server`) as a PNG: world size, images/s and training loss over time, with every generation
# change marked by a dashed line and labelled "g<N> <kind> (<reason>)", failures in red. Takes
# about a second; rerun it at any time (also while the job runs: it draws what is there so far).
#
#   scripts/plot_events.sh EVENTS_JSONL [OUT_PNG]      (default OUT_PNG: EVENTS_JSONL with .png)
#
# Needs jq and gnuplot (Debian packages jq and gnuplot-nox; scripts/install_deps.sh installs them).
# Records used: "server_started" (time zero), "generation" (generation, reason, failure,
# world_size_before/after, prepare_s), "progress" (world_size, loss, images_per_sec: the server
# writes one a second while trainers report), "trainer_event" with event "eval" (accuracy) and
# "finished".
set -euo pipefail

die() {
  echo "plot_events: $*" >&2
  exit 1
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: $0 EVENTS_JSONL [OUT_PNG]"; fi
EVENTS="$1"
OUT="${2:-${EVENTS%.jsonl}.png}"
[ -r "$EVENTS" ] || die "cannot read the events log '$EVENTS' (see --events_dir of edl server)"
command -v jq >/dev/null || die "jq is missing: apt-get install jq (or run scripts/install_deps.sh)"
command -v gnuplot >/dev/null || die "gnuplot is missing: apt-get install gnuplot-nox"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/edl-plot-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# Time zero: the server's start, else the first record. Malformed lines are skipped (jq -R).
records() { jq -R 'fromjson? | select(type == "object" and (.time | type) == "number")' "$EVENTS"; }
T0="$(records | jq -s 'map(select(.type == "server_started")) as $s
  | if ($s | length) > 0 then ($s | last | .time) else (map(.time) | min // 0) end')"
records | jq -s --argjson t0 "$T0" 'map(select(.time >= $t0))' >"$TMP/all.json"

# progress.tsv: seconds, loss, images/s, world size.
jq -r --argjson t0 "$T0" '.[] | select(.type == "progress")
  | [(.time - $t0), (.loss // 0), (.images_per_sec // 0), (.world_size // 0)] | @tsv' \
  "$TMP/all.json" >"$TMP/progress.tsv"
# world.tsv: a step line of the world size, from each generation to the last record.
jq -r --argjson t0 "$T0" '
  (map(select(.type == "generation")) | map([(.time - $t0), .world_size_after])) as $g
  | (map(.time) | max - $t0) as $tmax
  | ($g + (if ($g | length) > 0 then [[$tmax, ($g | last | .[1])]] else [] end))[] | @tsv' \
  "$TMP/all.json" >"$TMP/world.tsv"
# changes.tsv: seconds, colour (1 failure, 0 otherwise), label; skips the start generation.
jq -r --argjson t0 "$T0" '.[] | select(.type == "generation" and .generation > 1)
  | (if .failure then "failure"
     elif .world_size_after < .world_size_before then "shrink"
     elif .world_size_after > .world_size_before then "grow" else "re-form" end) as $kind
  | [(.time - $t0), (if .failure then 1 else 0 end),
     "g\(.generation) \($kind) \(.world_size_before)→\(.world_size_after) (\(.reason))"] | @tsv' \
  "$TMP/all.json" >"$TMP/changes.tsv"
# evals.tsv: seconds, test accuracy (%) of each evaluation (every rank reports it; first kept).
jq -r --argjson t0 "$T0" 'map(select(.type == "trainer_event" and .event == "eval"))
  | group_by(.step)[] | min_by(.time) | [(.time - $t0), (.accuracy * 1000 | round / 10)] | @tsv' \
  "$TMP/all.json" >"$TMP/evals.tsv"
FINISHED="$(jq -r --argjson t0 "$T0" 'map(select(.type == "finished")) | if length > 0 then
  (last | .time - $t0) else "" end' "$TMP/all.json")"
JOB="$(jq -r 'map(.job // empty) | first // "edl-job"' "$TMP/all.json")"
TMAX="$(jq --argjson t0 "$T0" 'map(.time) | max - $t0 | . * 1.03 + 1' "$TMP/all.json")"
WMAX="$(jq 'map(select(.type == "generation") | .world_size_after) | max // 1' "$TMP/all.json")"
[ -s "$TMP/world.tsv" ] || die "$EVENTS has no generation records yet: did the job start?"

# One gnuplot "set arrow/label" pair per change, in all three panels.
marks="$TMP/marks.gp"
: >"$marks"
i=0
prev=-1000000
while IFS=$'\t' read -r t fail label; do
  i=$((i + 1))
  color="#555555"
  [ "$fail" = 1 ] && color="#cc0000"
  # Left of its line; right of it when the previous change is too close for two labels.
  side=-1.8
  if jq -en --argjson t "$t" --argjson p "$prev" --argjson m "$TMAX" '$t - $p < $m * 0.03' >/dev/null; then
    side=1.7
    prev=-1000000
  else
    prev=$t
  fi
  echo "set arrow $i from $t, graph 0 to $t, graph 1 nohead dt 2 lw 1.5 lc rgb '$color'" >>"$marks"
  echo "if (top) set label $i \"$label\" at $t, graph 0.97 rotate by 90 right offset $side,0 font ',9' tc rgb '$color' front noenhanced" >>"$marks"
done <"$TMP/changes.tsv"
if [ -n "$FINISHED" ]; then
  i=$((i + 1))
  echo "set arrow $i from $FINISHED, graph 0 to $FINISHED, graph 1 nohead lw 1.5 lc rgb '#008800'" >>"$marks"
  echo "if (top) set label $i 'finished' at $FINISHED, graph 0.97 rotate by 90 right offset -1.8,0 font ',9' tc rgb '#008800' front noenhanced" >>"$marks"
fi

# Evaluations: a marker and the test accuracy near the top of the loss panel.
evals="$TMP/evals.gp"
: >"$evals"
j=100
while IFS=$'\t' read -r t acc; do
  j=$((j + 1))
  echo "set label $j 'test acc $acc%' at $t, graph 0.88 right point pt 7 ps 0.8 lc rgb '#9467bd' offset -0.8,0 font ',9' tc rgb '#9467bd' front" >>"$evals"
done <"$TMP/evals.tsv"

have_progress=0
[ -s "$TMP/progress.tsv" ] && have_progress=1
gnuplot <<EOF || die "gnuplot failed on $EVENTS"
set terminal pngcairo size 1100,900 font 'DejaVu Sans,10'
set output '$OUT'
set datafile separator '\t'
set grid lc rgb '#dddddd'
set xrange [0:$TMAX]
set lmargin 10
set rmargin 3
set multiplot layout 3,1 title "EDL job $JOB: elastic training timeline (dashed: generation changes, red: failures)" font ',12'
top = 1
load '$marks'
set ylabel 'world size (trainers)'
set yrange [0:$WMAX * 2.6 + 0.5]
set ytics 0, 1, $WMAX
set format x ''
plot '$TMP/world.tsv' using 1:2 with steps lw 2.5 lc rgb '#1f77b4' notitle
top = 0
unset label
load '$marks'
unset label
set ytics autofreq
set ylabel 'images/s (all trainers)'
set yrange [0:*]
if ($have_progress) {
  plot '$TMP/progress.tsv' using 1:3 with linespoints pt 7 ps 0.4 lw 1.5 lc rgb '#2ca02c' notitle
} else {
  set label 99 'no progress records in the events log' at graph 0.5, graph 0.5 center
  set yrange [0:1]
  plot 0 lc rgb '#ffffff' notitle
}
set xlabel 'seconds since the server started'
set format x '%g'
set ylabel 'training loss (rank 0)'
set autoscale y
set offsets 0, 0, graph 0.25, 0
load '$evals'
if ($have_progress) {
  plot '$TMP/progress.tsv' using 1:(\$2 > 0 ? \$2 : 1/0) with linespoints pt 7 ps 0.4 lw 1.5 lc rgb '#d62728' notitle
} else {
  set yrange [0:1]
  plot 0 lc rgb '#ffffff' notitle
}
unset multiplot
EOF
echo "$OUT"
