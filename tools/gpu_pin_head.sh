#!/usr/bin/env bash
# Makes the next GPU call build the committed tree (HEAD) even while others have work in progress
# in this checkout: the device tool copies the working tree, so this packs HEAD's version of every
# modified tracked file into .gpu-deps/head-files.tar and lists the untracked (not ignored) files
# in .gpu-deps/untracked.txt; tools/gpu_apply_head.sh, run first on the GPU machine, puts those
# files back and removes the untracked ones there. Run after tools/gpu_prepare.sh.
#   tools/gpu_pin_head.sh [--keep FILE...]
# --keep: your own uncommitted files, carried as they are (everything else modified is pinned).
# models/kjv-tiny (22 MB of the 64 MiB a call carries) is never pinned: tools/gpu_carry.sh moves
# it aside for a call, which git sees as a deletion.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=" "
if [ "${1:-}" = "--keep" ]; then
  shift
  keep=" $* "
fi
mkdir -p .gpu-deps
rm -f .gpu-deps/head-files.tar .gpu-deps/untracked.txt
changed=()
while IFS= read -r f; do
  [[ "$f" == models/kjv-tiny/* || "$keep" == *" $f "* ]] || changed+=("$f")
done < <(git diff --name-only HEAD)
if [ ${#changed[@]} -gt 0 ]; then
  # Files deleted in the working tree are still in HEAD: archive what HEAD has.
  git archive -o .gpu-deps/head-files.tar HEAD -- "${changed[@]}"
fi
git ls-files --others --exclude-standard | while IFS= read -r f; do
  [[ "$keep" == *" $f "* ]] || printf '%s\n' "$f"
done > .gpu-deps/untracked.txt
(git rev-parse --short HEAD && git status --short) > .gpu-deps/COMMIT
echo "gpu_pin_head.sh: ${#changed[@]} modified files pinned to HEAD, $(wc -l < .gpu-deps/untracked.txt) untracked to drop, kept:${keep% }"
