#!/usr/bin/env bash
# Stages the demo model's GPU-machine run (tools/demo_gpu_session.sh) into DEST, an ignored folder
# of the checkout the device tool sends: the corpus (tools/demo_corpus.py, from Debian's
# bible-kjv), the training tool, the CPU benchmark, and this checkout's CPU-only atom (stripped)
# with the shared libraries an Ubuntu 24.04 GPU machine may lack.
#   tools/demo_stage.sh [CPU_BUILD_DIR] [DEST]
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
dest="${2:-$src/stage-demo}"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/tools" "$dest/bench"
command -v bible >/dev/null || apt-get install -y --no-install-recommends bible-kjv bible-kjv-text
python3 "$src/tools/demo_corpus.py" "$dest/kjv_verses.jsonl"
cp "$src/tools/demo_corpus.py" "$src/tools/train_demo_model.py" "$src/tools/demo_gpu_session.sh" "$dest/tools/"
cp "$src/bench/cpu_demo_bench.py" "$dest/bench/"
mkdir -p "$dest/bin/bench"
strip -o "$dest/bin/atom" "$build/atom"
strip -o "$dest/bin/bench/cpu_fma_peak" "$build/bench/cpu_fma_peak"
for l in $(ldd "$build/atom" | awk '/httplib|brotli|fmt|xxhash/ {print $3}'); do cp -L "$l" "$dest/lib/"; done
(cd "$src" && git rev-parse --short HEAD && git status --short | head -20) > "$dest/COMMIT"
du -sh "$dest"
