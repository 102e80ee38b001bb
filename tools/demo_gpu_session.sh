#!/usr/bin/env bash
# The demo model's run on the GPU machine, from a folder staged by tools/demo_stage.sh:
#   bash STAGE/tools/demo_gpu_session.sh
# trains the model and records its references (tools/train_demo_model.py), returns them in
# $OUT at once (demo_model.tgz, model.safetensors.part0*), then benchmarks atom's CPU build
# beside PyTorch eager on 2 of this
# machine's CPU cores (bench/cpu_demo_bench.py).
set -uo pipefail
stage="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$stage/out}"
mkdir -p "$out"
cd "$stage"
export LD_LIBRARY_PATH="$stage/lib:${LD_LIBRARY_PATH:-}"
{ date -u; cat COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  lscpu | grep -E '^Model name|^CPU\(s\)|^Thread|^L3'; python3 --version; } 2>&1 | tee "$out/machine.txt"
python3 tools/train_demo_model.py --verses kjv_verses.jsonl --out work \
  --train-seconds "${TRAIN_SECONDS:-120}" 2>&1 | tee "$out/train.log"
# What comes back is at most 8 files of 16 MiB: the weights in two pieces, the rest in one tarball.
tar czf "$out/demo_model.tgz" -C work --exclude "*/model.safetensors" . &&
  split -b 15M -d work/kjv-tiny/model.safetensors "$out/model.safetensors.part" && ls -la "$out"
echo "== atom (CPU build) on this machine"
ldd bin/atom | grep 'not found'
OMP_NUM_THREADS=2 bin/atom generate --device cpu --model work/kjv-tiny --prompt 'In the beginning' \
  --max-tokens 24 --json 2>&1 | tail -3
timeout "${BENCH_SECONDS:-150}" python3 bench/cpu_demo_bench.py --atom bin/atom --model work/kjv-tiny \
  --threads 2 --out "$out/bench_cpu.json" 2>&1 | tee "$out/bench.log"
