#!/usr/bin/env bash
# One GPU call for issue 38's Kimi-K3 text model: builds gpu_test and cuda_e2e_bench, makes the
# kimi_k3 and kimi_k3_mxfp4 fixtures with tools/make_fixtures.py (PyTorch on the GPU machine) and copies it to
# $OUT/fixture for this machine to commit, then runs gpu_test (every kernel and model against the
# CPU, kimi_k3 included) and, time left, GLM-5.3's real-width diagnosis.
# Run from the repository root: bash tools/gpu_k3_session.sh [steps]   steps: fixture,test,glm53
set -u
out="${OUT:-/tmp/k3-out}"
mkdir -p "$out"
steps=",${1:-fixture,test,glm53},"
ATOM_GPU_TARGETS="${ATOM_GPU_TARGETS:-gpu_test cuda_e2e_bench}" bash tools/gpu_build.sh none > "$out/build.txt" 2>&1
echo "build: rc $? $(tail -1 "$out/build.txt")"
export LD_LIBRARY_PATH=/tmp/atom-deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [[ "$steps" == *",fixture,"* ]]; then
  timeout 240 python3 tools/make_fixtures.py tests/fixtures kimi_k3 kimi_k3_mxfp4 > "$out/fixture.txt" 2>&1
  echo "fixture: rc $?"; tail -4 "$out/fixture.txt"
  mkdir -p "$out/fixture/models" "$out/fixture/references"
  for n in kimi_k3 kimi_k3_mxfp4; do
    cp -r tests/fixtures/models/$n "$out/fixture/models/" 2>/dev/null
    cp tests/fixtures/references/$n.safetensors "$out/fixture/references/" 2>/dev/null
  done
fi
if [[ "$steps" == *",test,"* ]]; then
  timeout 300 ./build-gpu/tests/kernels/gpu_test ${GPU_TEST_ARGS:-} > "$out/gpu_test.txt" 2>&1
  echo "gpu_test: rc $?"; grep -E "^\[  (PASSED|FAILED) |tests ran" "$out/gpu_test.txt" | head -30
fi
if [[ "$steps" == *",glm53,"* ]]; then
  OUT="$out" timeout 240 bash tools/gpu_glm53_session.sh diag 2>&1 | tail -20
fi
