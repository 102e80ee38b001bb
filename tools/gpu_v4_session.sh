#!/usr/bin/env bash
# One GPU call for DeepSeek-V4 on CUDA (issue 35): builds gpu_test and cuda_e2e_bench, runs the
# compressed-attention kernels' tests and the model's (GPU vs CPU and transformers, chunked,
# token by token, decode graphs, the engine), then the real-width benchmark
# (bench/models/deepseek-v4-flash-2l: one CSA and one HCA layer of V4-Flash) and transformers on
# the same config in the same call.
# Run from the repository root: bash tools/gpu_v4_session.sh [steps]   steps: test,bench,hf
set -u
out="${OUT:-/tmp/v4-out}"
steps=",${1:-test,bench,hf},"
source tools/gpu_preamble.sh "gpu_test cuda_e2e_bench atom"
if [[ "$steps" == *",test,"* ]]; then
  timeout 240 ./build-gpu/tests/kernels/gpu_test \
    --gtest_filter='GpuPp*:GpuCompressedKv*:GpuDeepseekV4*:*deepseek_v4*:GpuIndexer*:GpuKpool*:GpuMla*:GpuGatedDelta*:GpuKimiDelta*' > "$out/gpu_test_v4.txt" 2>&1
  echo "gpu_test v4: rc $?"
  grep -E "rel err|agree|argmax|requests equal|decode graphs|lists equal|^\[  (PASSED|FAILED)|Failure|Expected|Which is|actual|error" "$out/gpu_test_v4.txt" | head -50
fi
m=bench/models/deepseek-v4-flash-2l
if [[ "$steps" == *",bench,"* ]]; then
  timeout 200 ./build-gpu/bench/cuda_e2e_bench --model $m --prefill 2048,8192 --batch 1,32 --prompt 4096 --steps 16 > "$out/v4_atom.txt" 2>&1
  echo "atom v4: rc $?"; grep -v "^\[atom" "$out/v4_atom.txt" | tail -12
fi
if [[ "$steps" == *",hf,"* ]]; then
  timeout 200 python3 bench/hf_baseline.py $m --batch 1 --prompt 4096 --new 16 --prefill 2048,8192 > "$out/v4_hf.txt" 2>&1
  echo "hf v4: rc $?"; grep -v "^  \|^    " "$out/v4_hf.txt" | tail -10
fi
if [[ "$steps" == *",llamafp8,"* ]]; then
  for m in llama-3.1-8b-fp8-dynamic llama-3.1-8b; do
    timeout 200 ./build-gpu/bin/atom bench throughput --model bench/models/$m --load-format dummy --device cuda \
      --input-len 1000 --output-len 1000 --num-prompts 512 --max-num-seqs 256 \
      --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --kv-cache-dtype fp8 \
      --output-json "$out/throughput_$m.json" > "$out/throughput_$m.log" 2>&1
    echo "throughput $m: rc $?"; grep -vE "^\[atom" "$out/throughput_$m.log" | tail -6
  done
fi
