#!/usr/bin/env bash
# GLM-5.3 at its real width on one GPU (issue 35): cuda_e2e_bench on bench/models/glm-5.3-flash-4l
# (4 layers: 3 KDA + 1 NoPE MLA over k-pool selections, every MLP the 288-expert MoE), variants
# that isolate the layer kinds, and transformers on the same config. Prepared on 2026-12-06 after
# the first real-width prefill stopped with cuBLASLt EXECUTION_FAILED (H100); not yet run: the
# "diag" step names the failing kernel (CUDA_LAUNCH_BLOCKING=1) and which layer kind fails.
# Run from the repository root
# after tools/gpu_build.sh built cuda_e2e_bench.
#   bash tools/gpu_glm53_session.sh [steps]   steps: diag,bench,hf (default all)
set -u
out="${OUT:-/tmp/glm53-out}"
mkdir -p "$out"
steps=",${1:-diag,bench,hf},"
export LD_LIBRARY_PATH=/tmp/atom-deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bench=./build-gpu/bench/cuda_e2e_bench
cfg=bench/models/glm-5.3-flash-4l
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"
variant() {  # name, python edits of the text config
  mkdir -p "/tmp/$1"
  python3 - "$cfg/config.json" "/tmp/$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); t = c["text_config"]
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}
if [[ "$steps" == *",diag,"* ]]; then
  CUDA_LAUNCH_BLOCKING=1 timeout 120 $bench --model $cfg --prefill 2048 --batch 1 --prompt 128 --steps 8 > "$out/diag-blocking.txt" 2>&1
  echo "blocking: rc $? $(grep -m1 error "$out/diag-blocking.txt")"
  variant kda_dense 't["layer_types"]=["linear_attention"]*4; t["mlp_layer_types"]=["dense"]*4'
  variant mla_dense 't["layer_types"]=["deepseek_sparse_attention"]*4; t["mlp_layer_types"]=["dense"]*4'
  variant moe32 't["n_routed_experts"]=32'
  for m in /tmp/kda_dense /tmp/mla_dense /tmp/moe32; do
    timeout 90 $bench --model $m --prefill 2048 --batch 1 --prompt 128 --steps 8 > "$out/diag-$(basename $m).txt" 2>&1
    echo "$(basename $m): rc $? $(grep -m1 -E 'error' "$out/diag-$(basename $m).txt")"
    grep -E "prefill|decode" "$out/diag-$(basename $m).txt" | head -3
  done
fi
if [[ "$steps" == *",bench,"* ]]; then
  timeout 200 $bench --model $cfg --prefill 2048,8192 --batch 1,32 --prompt 128 --steps 64 > "$out/atom.txt" 2>&1
  echo "atom: rc $?"; tail -8 "$out/atom.txt"
fi
if [[ "$steps" == *",hf,"* ]]; then
  timeout 260 python3 bench/hf_baseline.py $cfg --batch 1,32 --prefill 2048,8192 --new 16 > "$out/hf.txt" 2>&1
  echo "hf: rc $?"; tail -8 "$out/hf.txt"
fi
