#!/usr/bin/env bash
# After a ctest run in BUILD_DIR (make test runs it after each stage): how many cases ran, passed,
# failed and were skipped, and every skipped case with the reason it printed (ctest shows a case's
# output only when it fails, so a skip would otherwise say nothing in the CI log). Reads the run's
# own record, BUILD_DIR/Testing/Temporary/LastTest.log. Always exits 0: the stage's exit status is
# ctest's.
#
#   tests/ctest_report.sh BUILD_DIR
set -uo pipefail
log="${1:?usage: $0 BUILD_DIR}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || { echo "== ctest report: no $log"; exit 0; }
awk -v dir="$1" '
  # One block per case: "N/M Test: NAME", its output between "Output:" and "<end of output>", then
  # "Test Passed." / "Test Failed." or, for a skip, "Skip regular expression found in output".
  /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); run++; reason = ""; grab = 0; next }
  /: Skipped$/ { grab = 1; next }
  /^\[  SKIPPED \]/ { grab = 0; next }
  grab { reason = reason (reason == "" ? "" : " ") $0; next }
  /^<end of output>/ { grab = 0; next }
  /^Skip regular expression found in output/ {
    skipped++; lines[skipped] = "  " name ": " (reason == "" ? "(no reason printed)" : reason); next }
  /^Test Passed\./ { passed++; next }
  /^Test (Failed|Timeout)/ || /^Test Fail Reason:/ { failed++; next }  # the latter: FAIL_REGULAR_EXPRESSION, a crash
  END {
    printf "== ctest (%s): %d cases run: %d passed, %d failed, %d skipped\n", dir, run, passed, failed, skipped
    for (i = 1; i <= skipped; i++) print lines[i]
  }' "$log"
exit 0
