#!/usr/bin/env bash
# One GPU call for DeepSeek-V4.1's CUDA parts (issue 39): builds gpu_test, runs the index plane's
# store, the indexer over FP8 / FP4 planes with candidate blocks and the single-pass
# hyper-connections against the CPU, with the indexers, hyper-connections and models that share
# those kernels (V3.2 / GLM-5's lightning indexer, GLM-5.3's k-pool, DeepSeek-V4) as a regression
# check, then compute-sanitizer memcheck over the new tests.
# Run from the repository root: bash tools/gpu_v41_session.sh [steps]   steps: test,memcheck
set -u
out="${OUT:-/tmp/v41-out}"
steps=",${1:-test,memcheck},"
source tools/gpu_preamble.sh "gpu_test"
if [[ "$steps" == *",test,"* ]]; then
  timeout 300 ./build-gpu/tests/kernels/gpu_test \
    --gtest_filter="${ATOM_V41_FILTER:-GpuIndexPlane*:GpuIndexer*:GpuHyperConnection*:GpuEngram*:GpuKpool*:GpuMla*:GpuCompressedKv*:GpuDeepseekV4*:GpuDeepseekV41*:*deepseek_v4*:*deepseek_v32*:*glm5*}" \
    > "$out/gpu_test_v41.txt" 2>&1
  echo "gpu_test v41: rc $?"
  grep -E "index plane|quantised indexer|single pass|engram gate|lists equal|rel err|argmax|^\[  (PASSED|FAILED)|Failure|Expected|Which is|actual|error" "$out/gpu_test_v41.txt" | head -60
fi
if [[ "$steps" == *",memcheck,"* ]]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 240 "$san" --tool memcheck --error-exitcode 9 ./build-gpu/tests/kernels/gpu_test \
    --gtest_filter='GpuIndexPlane*:GpuIndexer.Quantised*:GpuHyperConnection.Mix*:GpuEngram*' > "$out/memcheck_v41.txt" 2>&1
  echo "memcheck v41: rc $?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)|Invalid" "$out/memcheck_v41.txt" | head -12
fi
