#!/usr/bin/env bash
# Regenerates the flag reference in docs/FLAGS.md (between <!-- flags:begin --> and <!-- flags:end -->)
# from `edl <subcommand> --help` of the built binary, so the flag docs never drift from the code.
# Takes a second. Run it after adding or changing a flag, then commit docs/FLAGS.md.
#
#   scripts/update_flag_docs.sh [EDL_BINARY]     (default: build/edl)
set -euo pipefail
# shellcheck source=scripts/edl_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/edl_common.sh"

EDL_BIN="${1:-${EDL_BIN:-}}"
edl_find_bin
README="$EDL_REPO_DIR/docs/FLAGS.md"
grep -q '^<!-- flags:begin -->$' "$README" || edl_die "$README has no <!-- flags:begin --> marker"
grep -q '^<!-- flags:end -->$' "$README" || edl_die "$README has no <!-- flags:end --> marker"

gen="$(mktemp)"
trap 'rm -f "$gen" "$gen.new"' EXIT
for sub in server client ctl launch train teacher ckpt; do
  {
    echo
    echo "<details><summary><code>edl $sub</code></summary>"
    echo
    echo '```'
    "$EDL_BIN" "$sub" --help 2>&1 || true
    echo '```'
    echo
    echo "</details>"
  } >>"$gen"
done
awk -v gen="$gen" '
  /^<!-- flags:begin -->$/ { print; while ((getline line < gen) > 0) print line; skip = 1; next }
  /^<!-- flags:end -->$/ { skip = 0 }
  !skip { print }
' "$README" >"$gen.new"
mv "$gen.new" "$README"
echo "update_flag_docs: docs/FLAGS.md flag reference regenerated from $EDL_BIN"
