#!/usr/bin/env bash
# Prints the C++ and CUDA sources clang-format owns (tracked and untracked-but-not-ignored files
# under src/, tests/ and bench/), one per line, for scripts/format.sh and scripts/check_format.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files --cached --others --exclude-standard -- src tests bench |
  grep -E '\.(cpp|h|cu|cuh)$' | while read -r f; do [ -f "$f" ] && echo "$f"; done
