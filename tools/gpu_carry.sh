#!/usr/bin/env bash
# Before and after a GPU call (the device tool carries the working tree, at most 64 MiB; the
# tree is about 61 MiB with models/kjv-tiny's 22 MB):
#   tools/gpu_carry.sh out [--keep FILE...]   moves models/kjv-tiny aside (to .gpu-aside/, which
#                                             git ignores and the call does not carry) and pins
#                                             others' work in progress (tools/gpu_pin_head.sh)
#   tools/gpu_carry.sh back                   puts models/kjv-tiny back
# Run `back` after every call, also a refused one: the demo model and its tests need the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  out)
    shift
    if [ -d models/kjv-tiny ]; then
      [ -e .gpu-aside/kjv-tiny ] && { echo "gpu_carry.sh: .gpu-aside/kjv-tiny exists already" >&2; exit 1; }
      mkdir -p .gpu-aside
      mv models/kjv-tiny .gpu-aside/kjv-tiny
    fi
    bash tools/gpu_pin_head.sh "$@"
    ;;
  back)
    if [ -d .gpu-aside/kjv-tiny ]; then
      [ -e models/kjv-tiny ] && { echo "gpu_carry.sh: models/kjv-tiny exists already" >&2; exit 1; }
      mv .gpu-aside/kjv-tiny models/kjv-tiny
    fi
    git status --short models/kjv-tiny
    ;;
  *)
    echo "usage: tools/gpu_carry.sh out [--keep FILE...] | back" >&2
    exit 2
    ;;
esac
