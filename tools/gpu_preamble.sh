# Sourced by the GPU session scripts, on the GPU machine, once `out` is set: puts the committed
# tree back (tools/gpu_apply_head.sh), builds ATOM_GPU_TARGETS (default: the first argument) into
# build-gpu/ with the build's log in $out/build.txt, prints its result, sets the library path for
# the binaries and prints the card.
#   out="${OUT:-/tmp/x-out}"; source tools/gpu_preamble.sh "gpu_test cuda_e2e_bench atom"
mkdir -p "$out"
bash tools/gpu_apply_head.sh
ATOM_GPU_TARGETS="${ATOM_GPU_TARGETS:-$1}" bash tools/gpu_build.sh none > "$out/build.txt" 2>&1
echo "build: rc $? $(grep -m3 -E 'error' "$out/build.txt")"
export LD_LIBRARY_PATH=/tmp/atom-deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
