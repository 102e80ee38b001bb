#!/usr/bin/env bash
# One GPU call for issue 34 item 1's fusion switches: builds gpu_test, cuda_e2e_bench and atom;
# runs the FP8 linear kernel tests (the fused norm and activation against the unfused ops, the
# product on quantised inputs) and the FP8 model parity tests; then each FP8 model's decode step
# and prefill (bench/cuda_e2e_bench: Llama-3.1-8B per-channel, Qwen3-8B and DeepSeek-V2-Lite
# 128x128 blocks) and Llama-3.1-8B FP8's `atom bench throughput` with the spec's fusion switches
# on and off (Llama's two and DeepSeek's two together), all in the same call.
# Run from the repository root: bash tools/gpu_fusion_session.sh [steps]
#   steps: test,e2e,throughput (default all three)
set -u
out="${OUT:-/tmp/fusion-out}"
steps=",${1:-test,e2e,throughput},"
source tools/gpu_preamble.sh "gpu_test cuda_e2e_bench atom"
fuse() {
  export ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_RMSNORM_QUANT=$1 ATOM_LLAMA_ENABLE_AITER_TRITON_FUSED_SILU_MUL_QUANT=$1
  export ATOM_ENABLE_DS_INPUT_RMSNORM_QUANT_FUSION=$1 ATOM_ENABLE_DS_QKNORM_QUANT_FUSION=$1
}
if [[ "$steps" == *",test,"* ]]; then
  # The kernels, then the FP8 models on the GPU with the switches on and off.
  for v in 1 0; do
    fuse $v
    filter='*GpuFp8Parity*'
    [ $v = 1 ] && filter='GpuLinearFp8.*:*GpuFp8Parity*'
    timeout 200 ./build-gpu/tests/kernels/gpu_test --gtest_filter="$filter" > "$out/gpu_test_fused$v.txt" 2>&1
    echo "gpu_test fused=$v: rc $?"
    grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure|Expected|Which is|cases$|rel|margin" "$out/gpu_test_fused$v.txt" | head -30
  done
fi
if [[ "$steps" == *",e2e,"* ]]; then
  for m in llama-3.1-8b-fp8-dynamic qwen3-8b-fp8 deepseek-v2-lite-fp8; do
    for v in 1 0; do
      fuse $v
      timeout 80 ./build-gpu/bench/cuda_e2e_bench --model bench/models/$m --load-format dummy \
        --prefill 2048,8192 --batch 1,32,256 --prompt 512 --steps 32 > "$out/e2e_${m}_fused$v.txt" 2>&1
      echo "e2e $m fused=$v: rc $?"; grep -v "^\[atom" "$out/e2e_${m}_fused$v.txt" | tail -7
    done
  done
fi
if [[ "$steps" == *",throughput,"* ]]; then
  for v in 1 0; do
    fuse $v
    m=llama-3.1-8b-fp8-dynamic
    timeout "${ATOM_TP_TIMEOUT:-110}" ./build-gpu/bin/atom bench throughput --model bench/models/$m \
      --load-format dummy --device cuda --input-len 1000 --output-len 1000 --num-prompts 512 \
      --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
      --kv-cache-dtype fp8 --output-json "$out/throughput_${m}_fused$v.json" > "$out/throughput_${m}_fused$v.log" 2>&1
    echo "throughput $m fused=$v: rc $?"; grep -E "^Throughput|^Engine|^TTFT" "$out/throughput_${m}_fused$v.log"
  done
fi
