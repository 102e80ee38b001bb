#!/usr/bin/env bash
# One device session of the gated delta net work (issue 19): GPU kernel tests, hybrid model and
# engine tests, cuda_gdn_bench and its PyTorch peer. Run from the repository root with the stage
# folder (stripped, xz-compressed gpu_test and cuda_gdn_bench, gdn_torch.py) as $1.
#   bash run.sh STAGE [steps]   steps: comma list of kernels,mutant,models,regress,bench,torch
set -u
stage="$1"
steps=",${2:-kernels,mutant,models,regress,bench,torch},"
out="${OUT:-/tmp/gdn-out}"
mkdir -p "$out"
cd "$stage" && for f in *.xz; do [ -f "$f" ] && xz -dkf "$f"; done; chmod +x gpu_test gpu_test_mutant cuda_gdn_bench 2>/dev/null; cd - >/dev/null
export ATOM_SOURCE_DIR="$PWD" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$PWD/$stage/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nccl="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2>/dev/null)"
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$out/gpu.txt"
if [[ "$steps" == *",kernels,"* ]]; then
  timeout 120 "$stage/gpu_test" --gtest_filter='GpuGatedDelta*:GpuKimiDelta*' 2>&1 | tee "$out/kernels.log" | grep -E "rel err|OK|FAILED|Failure|Expected|Which is|actual" | head -80
fi
if [[ "$steps" == *",mutant,"* ]]; then
  # gpu_test_mutant: the chunked kernel does not reset a new sequence's state (planted bug).
  timeout 60 "$stage/gpu_test_mutant" --gtest_filter='GpuGatedDelta.Rule*:GpuKimiDelta.Rule*' 2>&1 | tee "$out/mutant.log" | grep -E "OK \]|FAILED \]" | head -6
fi
if [[ "$steps" == *",models,"* ]]; then
  timeout 240 "$stage/gpu_test" --gtest_filter='*GpuHybrid*' 2>&1 | tee "$out/models.log" | grep -E "rel err|agree|equal|resumed|OK|FAILED|Failure|Expected|Which is" | head -80
fi
if [[ "$steps" == *",regress,"* ]]; then
  # Decode graphs now pad with state slot -1 and warm up without state: the other models'
  # graph-replaying GPU tests.
  timeout 150 "$stage/gpu_test" --gtest_filter='GpuEngine.*:*GpuMoeEngine*:GpuRunner.*' 2>&1 | tee "$out/regress.log" | grep -E "OK \]|FAILED \]|PASSED|tests ran" | tail -8
fi
if [[ "$steps" == *",bench,"* ]]; then
  timeout 120 "$stage/cuda_gdn_bench" all 2>&1 | tee "$out/bench.log"
fi
if [[ "$steps" == *",torch,"* ]]; then
  timeout 150 python3 "$stage/gdn_torch.py" 2>&1 | tee "$out/torch.log"
fi
