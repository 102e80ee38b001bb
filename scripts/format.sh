#!/usr/bin/env bash
# Formats every C++ and CUDA source in place with clang-format-14 and the repository's
# .clang-format (scripts/check_format.sh is the check CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
scripts/format_files.sh | xargs -r "$CLANG_FORMAT" -i --style=file
