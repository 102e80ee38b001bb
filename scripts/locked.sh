#!/usr/bin/env bash
# Runs a command holding this machine's one build lock (flock on $ATOM_BUILD_LOCK, default
# /tmp/atom-build.lock): a second build waits for the first instead of both running at half speed
# on two cores. scripts/build.sh, scripts/sanitize.sh and tools/mutate.py build through it.
#   scripts/locked.sh cmake --build build -j2
set -euo pipefail
lock="${ATOM_BUILD_LOCK:-/tmp/atom-build.lock}"
exec 9>>"$lock"
if ! flock -n 9; then
  echo "locked.sh: another build holds $lock; waiting for it" >&2
  flock 9
fi
exec "$@"
