#!/usr/bin/env bash
# Checks the C++ and CUDA sources against the tree's .clang-format (Google style, 100 columns)
# with clang-format 14, Debian 12's (scripts/install_deps.sh installs it): a different version
# formats some constructs differently, so no other one is used.
#
#   scripts/check_format.sh                  every tracked source (git ls-files)
#   scripts/check_format.sh FILE...          these files only
#   scripts/check_format.sh --since REF      the sources changed since git REF (e.g. main)
#   scripts/check_format.sh --fix [...]      reformats them in place instead of checking
#
# It also names every line over the 100-column limit: clang-format cannot break some (a raw
# string, a long word in a comment), and those are split by hand (R"(a)" R"(b)" is one string).
# The check exits 1 naming every file that differs and every long line (and the command that
# fixes the first), 2 on a usage error or a missing clang-format. ScriptsLintTest runs it in
# `make test`; `make format-check` alone.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=("$@")
fix=0
since=""
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fix) fix=1 ;;
    --since)
      [ $# -ge 2 ] || { echo "check_format: --since needs a git revision" >&2; exit 2; }
      since="$2"
      shift
      ;;
    -h | --help)
      sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*) echo "check_format: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) files+=("$1") ;;
  esac
  shift
done

fmt=""
for c in clang-format-14 clang-format; do
  if command -v "$c" > /dev/null && "$c" --version | grep -q 'version 14\.'; then
    fmt="$c"
    break
  fi
done
if [ -z "$fmt" ]; then
  echo "check_format: clang-format 14 not found; install it with scripts/install_deps.sh" >&2
  exit 2
fi

patterns=('*.h' '*.cc' '*.cu' '*.cuh' '*.cpp' '*.hpp' '*.c')
if [ ${#files[@]} -eq 0 ]; then
  if [ -n "$since" ]; then
    mapfile -t files < <(git -C "$root" diff --name-only --diff-filter=ACMR "$since" -- "${patterns[@]}")
  else
    mapfile -t files < <(git -C "$root" ls-files -- "${patterns[@]}")
  fi
  files=("${files[@]/#/$root/}")
elif [ -n "$since" ]; then
  echo "check_format: give either files or --since, not both" >&2
  exit 2
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "check_format: no sources to check"
  exit 0
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "check_format: no such file: $f" >&2; exit 2; }
done

if [ "$fix" = 1 ]; then
  "$fmt" -i --style="file:$root/.clang-format" "${files[@]}"
  echo "check_format: formatted ${#files[@]} files with $fmt"
  exit 0
fi

# One run over every file; --dry-run reports each file that would change (the first place only).
rc=0
out="$("$fmt" --style="file:$root/.clang-format" --dry-run --Werror --ferror-limit=1 "${files[@]}" 2>&1)" || rc=$?
mapfile -t differ < <(printf '%s\n' "$out" |
  sed -nE 's/^(.+):[0-9]+:[0-9]+: (error|warning): code should be clang-formatted.*/\1/p' |
  sed "s|^$root/||" | sort -u)
if [ "$rc" != 0 ] && [ ${#differ[@]} -eq 0 ]; then
  printf '%s\n' "$out" >&2
  echo "check_format: $fmt failed (exit $rc)" >&2
  exit 2
fi
# Columns are characters (perl reads UTF-8), as clang-format counts them.
mapfile -t long < <(ROOT="$root/" perl -CSD -ne 'chomp; my $f = $ARGV; $f =~ s/^\Q$ENV{ROOT}\E//;
    print "  $f:$.: ", length($_), " columns\n" if length($_) > 100; close ARGV if eof' "${files[@]}")
if [ ${#differ[@]} -gt 0 ]; then
  echo "check_format: ${#differ[@]} of ${#files[@]} files differ from .clang-format ($fmt):"
  printf '  %s\n' "${differ[@]}"
  echo "check_format: fix with: scripts/check_format.sh --fix${args[*]:+ ${args[*]}}"
fi
if [ ${#long[@]} -gt 0 ]; then
  echo "check_format: ${#long[@]} lines pass the 100-column limit (split them by hand):"
  printf '%s\n' "${long[@]}"
fi
[ ${#differ[@]} -eq 0 ] && [ ${#long[@]} -eq 0 ] || exit 1
echo "check_format: ${#files[@]} files match .clang-format ($fmt), no line over 100 columns"
