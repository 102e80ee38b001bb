#!/usr/bin/env bash
# On the GPU machine, in the sent checkout: undoes others' work in progress that
# tools/gpu_pin_head.sh recorded, so the build is the committed tree.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu-deps/head-files.tar ] && tar -xf .gpu-deps/head-files.tar
if [ -f .gpu-deps/untracked.txt ]; then
  while IFS= read -r f; do [ -n "$f" ] && rm -f -- "$f"; done < .gpu-deps/untracked.txt
fi
echo "gpu_apply_head.sh: the tree is HEAD $(head -1 .gpu-deps/COMMIT 2>/dev/null)"
