#!/usr/bin/env bash
# Fails, listing them, when C++ or CUDA sources differ from what clang-format-14 makes of them
# with the repository's .clang-format (scripts/format.sh fixes them). The version is pinned:
# another clang-format may format the same code differently.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "check_format: $CLANG_FORMAT not found (scripts/install_deps.sh installs it)" >&2
  exit 2
fi
files="$(scripts/format_files.sh)"
# --dry-run reports each misformatted spot as "path:line:col: error: code should be clang-formatted".
report="$(printf '%s\n' "$files" | xargs -r "$CLANG_FORMAT" --style=file --dry-run 2>&1 || true)"
drift="$(printf '%s\n' "$report" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: \(error\|warning\): code should be clang-formatted.*/\1/p' | sort -u)"
if [ -n "$drift" ]; then
  echo "check_format: $(printf '%s\n' "$drift" | wc -l) file(s) are not formatted (run scripts/format.sh):" >&2
  printf '  %s\n' $drift >&2
  exit 1
fi
if printf '%s\n' "$report" | grep -q .; then
  echo "check_format: $CLANG_FORMAT failed:" >&2
  printf '%s\n' "$report" >&2
  exit 2
fi
echo "check_format: $(printf '%s\n' "$files" | wc -l) files formatted"
