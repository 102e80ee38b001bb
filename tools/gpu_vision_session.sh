#!/usr/bin/env bash
# One GPU call for issue 38's vision tower on CUDA: builds gpu_test and cuda_vision_bench, runs the
# encoder kernels' and the Kimi towers' GPU tests, the tower benchmark against transformers' in
# the same run, and the layer-by-layer comparison of transformers' tower with the reference.
# Run from the repository root: bash tools/gpu_vision_session.sh [steps]
#   steps: test,bench,diff,k3,prof,rope,all (k3: ATOM_K3_SHARED_EXPERT_OVERLAP off/on; prof: ncu's
#   per-kernel times of two 1024x1024 tower runs; rope: GpuEncoder.AttentionWithRopeTables* and
#   the tower with ATOM_VISION_FUSED_ROPE off and on in one run; all: the whole gpu_test)
set -u
out="${OUT:-/tmp/vision-out}"
steps=",${1:-test,bench,diff},"
source tools/gpu_preamble.sh "gpu_test cuda_vision_bench cuda_e2e_bench"
if [[ "$steps" == *",test,"* ]]; then
  timeout 300 ./build-gpu/tests/kernels/gpu_test --gtest_filter='GpuEncoder*:GpuKimiK25*:GpuKimiK3*:GpuMoe.Router*' > "$out/gpu_test_vision.txt" 2>&1
  echo "gpu_test vision: rc $?"
  grep -E "rel err|GPU tower|^\[  (PASSED|FAILED)|Failure|Expected|Which is|actual" "$out/gpu_test_vision.txt" | head -40
fi
if [[ "$steps" == *",bench,"* ]]; then
  timeout 240 ./build-gpu/bench/cuda_vision_bench --model bench/models/kimi-k25-1l > "$out/vision_bench.txt" 2>&1
  echo "cuda_vision_bench: rc $?"; cat "$out/vision_bench.txt" | tail -12
  grids=$(grep flash "$out/vision_bench.txt" | sed -n "s/.*(\([0-9]*\)x\([0-9]*\) patches).*/\1x\2/p" | tr '\n' ',' | sed 's/,$//')
  (cd bench && timeout 240 python3 vision_torch.py --grids "${grids:-32x32,74x74}") > "$out/vision_torch.txt" 2>&1
  echo "vision_torch: rc $?"; tail -8 "$out/vision_torch.txt"
  # Time to first token at Kimi-K3's text width (3 layers, MXFP4 experts) with K2.5's tower.
  timeout 200 ./build-gpu/bench/cuda_vision_bench --model bench/models/kimi-k3-3l-vision --sizes 448,1024 > "$out/vision_bench_k3.txt" 2>&1
  echo "cuda_vision_bench k3: rc $?"; grep -E "TTFT|Error|error" "$out/vision_bench_k3.txt" | tail -4
fi
if [[ "$steps" == *",k3,"* ]]; then
  # ATOM_K3_SHARED_EXPERT_OVERLAP off and on, Kimi-K3's width (3 layers, MXFP4 experts).
  for ov in 0 1; do
    ATOM_K3_SHARED_EXPERT_OVERLAP=$ov timeout 200 ./build-gpu/bench/cuda_e2e_bench --model bench/models/kimi-k3-3l \
      --prefill 2048 --batch 1,32 > "$out/k3_overlap_$ov.txt" 2>&1
    echo "kimi-k3-3l overlap $ov: rc $?"; tail -5 "$out/k3_overlap_$ov.txt"
  done
fi
if [[ "$steps" == *",rope,"* ]]; then
  timeout 120 ./build-gpu/tests/kernels/gpu_test --gtest_filter='GpuEncoder*:GpuKimiK25*' > "$out/gpu_test_rope.txt" 2>&1
  echo "gpu_test rope: rc $?"
  grep -E "rope|GPU tower|rows beyond|^\[  (PASSED|FAILED)|Failure|Expected|Which is|exception" "$out/gpu_test_rope.txt" | head -30
  for r in 0 1; do
    ATOM_VISION_FUSED_ROPE=$r timeout 60 ./build-gpu/bench/cuda_vision_bench --model bench/models/kimi-k25-1l \
      --sizes 448,1024 --backends flash --reps 6 --ttft 0 2>&1 | grep "tower flash" | sed "s/^/fused rope $r: /"
  done
fi
if [[ "$steps" == *",prof,"* ]]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 300 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    ./build-gpu/bench/cuda_vision_bench --model bench/models/kimi-k25-1l --sizes 1024 --backends flash \
    --reps 2 --ttft 0 > "$out/vision_ncu.txt" 2>&1
  echo "ncu: rc $?"
  python3 - "$out/vision_ncu.txt" <<'PY'
import csv, sys, collections
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
t, n = collections.Counter(), collections.Counter()
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    k = r["Kernel Name"][:100] + "  grid " + r.get("Grid Size", "")
    t[k] += float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1e-6); n[k] += 1
print(f"ncu: {sum(n.values())} launches, {sum(t.values()):.1f} ms of GPU time in all (two tower runs and the load)")
for k, v in t.most_common(16): print(f"  {v:9.2f} ms {n[k]:5d}x  {k}")
PY
  grep -E "tower flash" "$out/vision_ncu.txt" | head -2
fi
if [[ "$steps" == *",diff,"* ]]; then
  timeout 120 python3 tools/moonvit_layer_diff.py tests/fixtures > "$out/layer_diff.txt" 2>&1
  echo "layer diff: rc $?"; tail -12 "$out/layer_diff.txt"
fi
if [[ "$steps" == *",all,"* ]]; then
  timeout 400 ./build-gpu/tests/kernels/gpu_test > "$out/gpu_test.txt" 2>&1
  echo "gpu_test: rc $?"; grep -E "^\[  (PASSED|FAILED) |tests ran" "$out/gpu_test.txt" | head -30
fi
