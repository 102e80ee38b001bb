#!/usr/bin/env bash
# One GPU call for issue 34's FP8 experts: builds gpu_test, cuda_moe_bench, cuda_e2e_bench and
# atom, runs the MoE kernel and layer tests (FP8 experts against the CPU and the BF16 path, the
# layer against itself dequantised at load) and the FP8 and MoE model parity tests, then the
# kernel benchmark (Qwen3-30B-A3B's experts in BF16 and FP8, both paths), the end-to-end decode
# and prefill of bench/models/qwen3-30b-a3b-fp8 with its experts kept FP8 and dequantised at load
# (ATOM_MOE_FP8_EXPERTS) and of the BF16 model, all in the same call; `throughput` adds
# `atom bench throughput` on the FP8 model both ways (ATOM_FP8_MOE_MODEL: another folder of
# bench/models, e.g. deepseek-v2-lite-fp8).
# Run from the repository root: bash tools/gpu_fp8_moe_session.sh [steps]
#   steps: test,kernel,e2e,throughput (default test,kernel,e2e)
set -u
out="${OUT:-/tmp/fp8moe-out}"
steps=",${1:-test,kernel,e2e},"
source tools/gpu_preamble.sh "gpu_test cuda_moe_bench cuda_e2e_bench atom"
if [[ "$steps" == *",test,"* ]]; then
  timeout 240 ./build-gpu/tests/kernels/gpu_test \
    --gtest_filter='GpuMoe.*:*GpuMoeParity*:*GpuFp8Parity*:GpuGptOssMxfp4*:*GpuMoeEngine*' > "$out/gpu_test_moe.txt" 2>&1
  echo "gpu_test moe: rc $?"
  grep -E "fp8 layer|^\[  (PASSED|FAILED)|Failure|Expected|Which is|actual|error:|rel err" "$out/gpu_test_moe.txt" | head -40
  grep -E "^  fp8 " "$out/gpu_test_moe.txt" | awk '{print $NF, $0}' | sort | uniq -c | sort -rn | head -3
  grep -cE "^  fp8 .*same bytes" "$out/gpu_test_moe.txt"
fi
if [[ "$steps" == *",kernel,"* ]]; then
  timeout 150 ./build-gpu/bench/cuda_moe_bench --fp8-only --paths > "$out/moe_bench_fp8.txt" 2>&1
  echo "cuda_moe_bench fp8: rc $?"; grep -v "^\[atom" "$out/moe_bench_fp8.txt" | tail -30
fi
if [[ "$steps" == *",e2e,"* ]]; then
  for v in 1 0; do
    ATOM_MOE_FP8_EXPERTS=$v timeout 150 ./build-gpu/bench/cuda_e2e_bench --model bench/models/qwen3-30b-a3b-fp8 \
      --load-format dummy --prefill 2048 --batch 1,32 --prompt 512 --steps 32 > "$out/e2e_qwen3_fp8_experts$v.txt" 2>&1
    echo "e2e qwen3-30b-a3b-fp8 ATOM_MOE_FP8_EXPERTS=$v: rc $?"; grep -v "^\[atom" "$out/e2e_qwen3_fp8_experts$v.txt" | tail -6
  done
  timeout 150 ./build-gpu/bench/cuda_e2e_bench --model bench/models/qwen3-30b-a3b \
    --load-format dummy --prefill 2048 --batch 1,32 --prompt 512 --steps 32 > "$out/e2e_qwen3_bf16.txt" 2>&1
  echo "e2e qwen3-30b-a3b bf16: rc $?"; grep -v "^\[atom" "$out/e2e_qwen3_bf16.txt" | tail -6
fi
if [[ "$steps" == *",throughput,"* ]]; then
  # The FP8 checkpoint with its experts kept FP8, then dequantised to BF16 at load.
  for v in 1 0; do
    m=${ATOM_FP8_MOE_MODEL:-qwen3-30b-a3b-fp8}
    ATOM_MOE_FP8_EXPERTS=$v timeout "${ATOM_TP_TIMEOUT:-170}" ./build-gpu/bin/atom bench throughput --model bench/models/$m --load-format dummy --device cuda \
      --input-len 1000 --output-len 1000 --num-prompts 512 --max-num-seqs 256 \
      --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
      --output-json "$out/throughput_${m}_experts$v.json" > "$out/throughput_${m}_experts$v.log" 2>&1
    echo "throughput $m ATOM_MOE_FP8_EXPERTS=$v: rc $?"; grep -vE "^\[atom" "$out/throughput_${m}_experts$v.log" | tail -6
    grep -E "KV|pages|blocks" "$out/throughput_${m}_experts$v.log" | head -2
  done
fi
