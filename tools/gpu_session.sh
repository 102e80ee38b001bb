#!/usr/bin/env bash
# One GPU session on the device machine, after tools/gpu_build.sh built build-gpu/ there (it runs this):
# GPU tests (one process per suite, so a crash cannot hide the rest), the CLI on the GPU,
# kernel and end-to-end benchmarks, the transformers baseline, compute-sanitizer. Logs go to
# $OUT; the last lines printed are a summary.
#   bash tools/gpu_build.sh [steps]   (or bash tools/gpu_session.sh [steps] on a built build-gpu/); steps: comma list of tests,cli,kernels,e2e,hf,memcheck
#   (also engine, serve, fp8check: the FP8 KV cache's tests under memcheck and e2e; fp8 and bf16:
#   bench throughput with that KV cache dtype at ATOM_FP8_SEQS / ATOM_BF16_SEQS sequences; mla: the
#   latent attention and indexer kernel tests, the MLA models' GPU parity and engine tests, the
#   MLA decode kernel bench with its PyTorch peer; mla_e2e: the DeepSeek-V2-Lite shape end to end
#   with transformers; spec: speculative decoding's GPU tests and bench/cuda_spec_bench on the
#   DeepSeek-V2-Lite shape with one MTP layer; decode:
#   decode steps under the environments of ATOM_DECODE_VARIANTS; ncu: per-kernel durations of a
#   batch-1 decode step; gptoss: GPT-OSS's MXFP4 tests and benchmarks; fp8gemm: the FP8
#   linear's tests, bench/cuda_fp8_bench's GEMMs (cuBLASLt beside atom's kernels), the torch peer)
set -u
stage="$(cd "$(dirname "$0")/.." && pwd)"
# The binaries and the libraries the image lacks: tools/gpu_build.sh's build-gpu/ (bin/, lib/).
build="${ATOM_GPU_STAGE:-$stage/build-gpu}"
bin="$build/bin"
out="${OUT:-/tmp/atom-out}"
mkdir -p "$out"
steps=",${1:-tests,cli,kernels,e2e,hf,memcheck},"
export ATOM_SOURCE_DIR="$stage" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
# The binaries link libnccl.so.2 (tensor parallelism): from the CUDA folders, else the image's wheel.
if ! ldd "$bin/atom" | grep -q "libnccl.so.2 => /"; then
  nccl="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2>/dev/null)"
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:$LD_LIBRARY_PATH"
fi
export NCCL_NVLS_ENABLE=0
summary="$out/summary.log"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
has() { [[ "$steps" == *",$1,"* ]]; }
# Per-test outcomes of gtest logs, skipped tests counted apart from passed ones (a GTEST_SKIP,
# e.g. a tensor-parallel test on one GPU, is not a pass), with the skipped tests' names.
gtest_summary() {
  local ok skipped failed
  ok=$(grep -cE '^\[       OK \] .*\([0-9]+ ms\)$' "$@")
  skipped=$(grep -cE '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$@")
  failed=$(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$@")
  note "tests: $ok passed, $skipped skipped, $failed failed"
  grep -hE '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$@" | sed 's/^/  /' | tee -a "$summary"
}

cat "$build/COMMIT" | head -1 | sed 's/^/commit /' | tee -a "$summary"
cat "$build/BUILD_TIME" 2>/dev/null | tee -a "$summary"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv | tee -a "$summary"

if has tests; then
  for f in 'GpuDevice.*' 'GpuElementwise.*' 'GpuRmsNorm.*:GpuRope.*:GpuKvCacheWrite.*' 'GpuLinear.*' \
           'GpuSampling.*' 'GpuMla.*:GpuIndexer.*' 'GpuAttention.*:-GpuAttention.Fp8*' 'GpuAttention.Fp8*' '*GpuParity*' \
           'GpuRunner.*' 'GpuEngine.*'; do
    echo "##### $f" >> "$out/tests.log"
    timeout 150 "$bin/gpu_test" --gtest_filter="$f" >> "$out/tests.log" 2>&1
    note "tests $f: rc=$?"
  done
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual|error:|Skipped|rel err|agree for|max \|" "$out/tests.log" \
    | grep -v "listed below" | head -80 | tee -a "$summary"
  gtest_summary "$out/tests.log"
fi

if has mla; then
  for f in 'GpuMla.*:GpuIndexer.*' '*GpuMoeParity*deepseek*:*GpuMoeParity*glm_moe_dsa*' \
           '*GpuMoeEngine*'; do
    echo "##### $f" >> "$out/mla_tests.log"
    timeout 150 "$bin/gpu_test" --gtest_filter="$f" >> "$out/mla_tests.log" 2>&1
    note "mla tests $f: rc=$?"
  done
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual|error:|rel err|agree for|equal|median row" \
    "$out/mla_tests.log" | grep -v "listed below" | head -80 | tee -a "$summary"
  gtest_summary "$out/mla_tests.log"
  timeout 150 "$bin/cuda_mla_bench" --torch "$out/mla_atom.txt" > "$out/mla_bench.log" 2>&1
  note "mla bench: rc=$?"
  grep -E "MLA|bandwidth;" "$out/mla_bench.log" | tee -a "$summary"
  ATOM_MLA_PIPELINE=1 timeout 60 "$bin/cuda_mla_bench" --ctx 8192 --batch 1,32,128 --sparse 0 \
    > "$out/mla_bench_overlap.log" 2>&1
  note "mla bench, overlapped loop (ATOM_MLA_PIPELINE=1): rc=$?"
  grep -E "MLA" "$out/mla_bench_overlap.log" | sed 's/^/  overlap /' | tee -a "$summary"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$bin/gpu_test" \
    --gtest_filter='GpuMla.*:GpuIndexer.*' > "$out/mla_memcheck.log" 2>&1
  note "mla memcheck: rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" "$out/mla_memcheck.log" | head -10 | tee -a "$summary"
  timeout 120 python3 "$stage/bench/mla_decode_torch.py" "$out/mla_atom.txt" > "$out/mla_torch.log" 2>&1
  note "mla torch peer: rc=$?"
  grep -E "torch" "$out/mla_torch.log" | tee -a "$summary"
fi

if has gptoss; then
  # GPT-OSS with MXFP4 experts kept packed (W4A16): the fused-expert kernel tests (dense and
  # MXFP4, every path), the fixtures' GPU parity and packing test, memcheck over the MXFP4 kernel
  # test, the expert kernels alone, both shapes end to end (dummy weights), bench throughput
  # 1000/1000 on the 20b shape and a 32k-token request on the 120b shape.
  for f in 'GpuMoe.*' '*GpuMoeParity*gpt_oss*:GpuGptOssMxfp4.*'; do
    echo "##### $f" >> "$out/gptoss_tests.log"
    timeout 200 "$bin/gpu_test" --gtest_filter="$f" >> "$out/gptoss_tests.log" 2>&1
    note "gptoss tests $f: rc=$?"
  done
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|error:|mxfp4 .*(auto|decode ) |rel err|agree for|median row" \
    "$out/gptoss_tests.log" | grep -v "listed below" | head -60 | tee -a "$summary"
  gtest_summary "$out/gptoss_tests.log"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 10 "$bin/gpu_test" \
    --gtest_filter='GpuMoe.FusedMxfp4MatchesCpu' > "$out/gptoss_memcheck.log" 2>&1
  note "gptoss memcheck (FusedMxfp4MatchesCpu): rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$out/gptoss_memcheck.log" | head -5 | tee -a "$summary"
  timeout 150 "$bin/cuda_moe_bench" > "$out/gptoss_moe_bench.log" 2>&1
  note "moe bench: rc=$?"
  grep -E "gpt-oss" "$out/gptoss_moe_bench.log" | tee -a "$summary"
  for m in gpt-oss-20b gpt-oss-120b; do
    timeout 200 "$bin/cuda_e2e_bench" --model "$stage/bench/models/$m" --load-format dummy \
      --prefill 2048 --batch 1,32,128 > "$out/gptoss_e2e_$m.log" 2>&1
    note "e2e bench $m: rc=$?"
    tail -n 9 "$out/gptoss_e2e_$m.log" | tee -a "$summary"
  done
  timeout "${ATOM_GPTOSS_TP_TIMEOUT:-150}" "$bin/atom" bench throughput \
    --model "$stage/bench/models/gpt-oss-20b" --load-format dummy --input-len 1000 --output-len 1000 \
    --num-prompts "${ATOM_GPTOSS_PROMPTS:-512}" --max-num-seqs "${ATOM_GPTOSS_SEQS:-256}" \
    --output-json "$out/gptoss_throughput_20b.json" > "$out/gptoss_throughput_20b.log" 2>&1
  note "bench throughput gpt-oss-20b 1000/1000: rc=$?"
  tail -n 6 "$out/gptoss_throughput_20b.log" | tee -a "$summary"
  timeout 150 "$bin/atom" bench latency --model "$stage/bench/models/gpt-oss-120b" \
    --load-format dummy --input-len 32000 --output-len 32 --batch-size 1 --num-iters 1 \
    --num-iters-warmup 0 --max-model-len 32768 > "$out/gptoss_120b_32k.log" 2>&1
  note "bench latency gpt-oss-120b, a 32k-token request: rc=$?"
  grep -iE "latency|memory|blocks|GiB|error" "$out/gptoss_120b_32k.log" | tail -n 8 | tee -a "$summary"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee -a "$summary"
fi

if has mla_e2e; then
  m="$stage/bench/models/deepseek-v2-lite"
  timeout 200 "$bin/cuda_e2e_bench" --model "$m" --load-format dummy --prefill 2048 --batch 1,32 \
    > "$out/mla_e2e.log" 2>&1
  note "mla e2e bench (DeepSeek-V2-Lite shape): rc=$?"
  tail -n 8 "$out/mla_e2e.log" | tee -a "$summary"
  if [ "${ATOM_MLA_HF:-1}" = 1 ]; then
    timeout 240 python3 "$stage/bench/hf_baseline.py" "$m" --batch 1,32 --prefill 2048 --new 32 \
      > "$out/mla_hf.log" 2>&1
    note "mla hf baseline: rc=$?"
    grep -E "^hf |transformers|Error|error" "$out/mla_hf.log" | tail -n 8 | tee -a "$summary"
  fi
fi

if has spec; then
  timeout 150 "$bin/gpu_test" --gtest_filter='GpuSpecDecode.*:GpuHybridSpecDecode.*' > "$out/spec_tests.log" 2>&1
  note "spec tests: rc=$?"
  grep -E "^\[  FAILED|Failure|Expected|Which is|K=" "$out/spec_tests.log" | head -60 | tee -a "$summary"
  gtest_summary "$out/spec_tests.log"
  timeout 240 "$bin/cuda_spec_bench" --model "$stage/bench/models/deepseek-v2-lite-mtp" \
    --load-format dummy --batch 1,32 --new 128 > "$out/spec_bench.log" 2>&1
  note "spec bench: rc=$?"
  grep -vE "^\[atom" "$out/spec_bench.log" | tee -a "$summary"
fi

# The FP8 linear: its GPU tests (cuBLASLt's answers per scaling printed), then the torch peer
# (the measured FP8 peak, rowwise and blockwise _scaled_mm) and bench/cuda_fp8_bench's GEMMs
# (atom's kernels and cuBLASLt) against that peak, in the same run.
if has fp8gemm; then
  timeout 200 "$bin/gpu_test" --gtest_filter='GpuLinearFp8.*' > "$out/fp8_tests.log" 2>&1
  note "fp8 tests: rc=$?"
  grep -E "cuBLASLt|worst rel err|graph replay|^\[  FAILED|Failure|Expected|Which is" \
    "$out/fp8_tests.log" | head -60 | tee -a "$summary"
  gtest_summary "$out/fp8_tests.log"
  timeout 240 python3 "$stage/bench/fp8_gemm_torch.py" ${ATOM_FP8_QUICK:+--quick} \
    > "$out/fp8_torch.log" 2>&1
  note "fp8 torch peer: rc=$?"
  peak="$(sed -n 's/^PEAK_FLOPS //p' "$out/fp8_torch.log")"
  grep -E "^peak|^blockwise|PEAK" "$out/fp8_torch.log" | tee -a "$summary"
  timeout 300 "$bin/cuda_fp8_bench" gemm --peak "${peak:-0}" ${ATOM_FP8_QUICK:+--quick} \
    > "$out/fp8_bench.log" 2>&1
  note "fp8 bench (peak ${peak:-unknown}): rc=$?"
fi

if has cli; then
  {
    "$bin/atom" generate --model "$stage/tests/fixtures/models/llama3_gqa" --prompt-tokens 1,2,3,4,5 \
      --max-tokens 8 --device cuda --json
    "$bin/atom" generate --model "$stage/tests/fixtures/models/llama3_gqa" --prompt-tokens 1,2,3,4,5 \
      --max-tokens 8 --device cpu --json
    "$bin/atom" score --model "$stage/tests/fixtures/models/qwen3_tied" --tokens 1,2,3,4 \
      --out /tmp/score.safetensors --device cuda
  } > "$out/cli.log" 2>&1
  note "cli: rc=$?"
  tail -n 5 "$out/cli.log" | tee -a "$summary"
fi

if has kernels; then
  timeout 200 "$bin/cuda_kernel_bench" all > "$out/kernels.log" 2>&1
  note "kernel bench: rc=$?"
  grep -E "prefill|decode" "$out/kernels.log" | tee -a "$summary"
fi

if has e2e; then
  timeout 240 "$bin/cuda_e2e_bench" --model "$stage/bench/models/llama-3.1-8b" --load-format dummy \
    > "$out/e2e.log" 2>&1
  note "e2e bench: rc=$?"
  tail -n 14 "$out/e2e.log" | tee -a "$summary"
  for v in "ATOM_SKINNY_GEMM_MAX_M=2" "ATOM_PDL=0"; do
    env $v timeout 120 "$bin/cuda_e2e_bench" --model "$stage/bench/models/llama-3.1-8b" --load-format dummy \
      --prefill "" --batch 1,32 > "$out/e2e_variant.log" 2>&1
    note "e2e $v: rc=$?"
    grep -E "decode batch" "$out/e2e_variant.log" | sed "s/^/$v /" | tee -a "$summary"
  done
fi

# Per-kernel durations of the last batch-1 decode step (ncu, each graph node on its own).
# Under each environment of $ATOM_NCU_VARIANTS (as ATOM_DECODE_VARIANTS).
if has ncu; then
  for v in ${ATOM_NCU_VARIANTS:-default}; do
    [ "$v" = default ] && e="" || e="${v//,/ }"
    f="$out/ncu_${v//[=,]/_}"
    env $e timeout 300 ncu --graph-profiling node --metrics gpu__time_duration.sum --csv \
      "$bin/cuda_e2e_bench" --model "$stage/bench/models/llama-3.1-8b" --load-format dummy \
      --prefill "" --batch ${ATOM_NCU_BATCH:-1} --steps 6 > "$f.csv" 2> "$f.err"
    note "ncu $v: rc=$?"
    python3 "$stage/tools/ncu_step_summary.py" "$f.csv" | tee -a "$summary"
  done
fi

# Decode steps only (batch 1, 32, 128) under each environment of $ATOM_DECODE_VARIANTS
# (space-separated; commas separate the assignments of one variant; "default" is none), twice over.
if has decode; then
  for round in 1 2; do
    for v in ${ATOM_DECODE_VARIANTS:-default ATOM_L2_PREFETCH_MB=0}; do
      [ "$v" = default ] && e="" || e="${v//,/ }"
      env $e timeout 120 "$bin/cuda_e2e_bench" --model "$stage/bench/models/llama-3.1-8b" \
        --load-format dummy --prefill "" --batch ${ATOM_DECODE_BATCHES:-1,32,128} > "$out/decode_${round}_${v//[=,]/_}.log" 2>&1
      note "decode $v (round $round): rc=$?"
      grep -E "decode batch" "$out/decode_${round}_${v//[=,]/_}.log" | sed "s/^/  $v /" | tee -a "$summary"
    done
  done
fi

if has hf; then
  timeout 200 python3 "$stage/bench/hf_baseline.py" "$stage/bench/models/llama-3.1-8b" --new 64 \
    > "$out/hf.log" 2>&1
  note "hf baseline: rc=$?"
  grep -E "^hf |transformers" "$out/hf.log" | tee -a "$summary"
fi

if has memcheck; then
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$bin/gpu_test" \
    --gtest_filter='GpuAttention.*:GpuLinear.*:GpuRope.*:GpuElementwise.*:GpuRmsNorm.*:GpuKvCacheWrite.*:GpuSampling.*:-GpuAttention.Fp8*' \
    > "$out/memcheck.log" 2>&1
  note "memcheck: rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" "$out/memcheck.log" | head -20 | tee -a "$summary"
fi

if has engine; then
  m="$stage/bench/models/llama-3.1-8b"
  timeout 300 "$bin/atom" bench throughput --model "$m" --load-format dummy --device cuda \
    --input-len 1000 --output-len 1000 --num-prompts 512 --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --output-json "$out/throughput.json" \
    > "$out/engine.log" 2>&1
  note "bench throughput 512x1000/1000: rc=$?"
  grep -vE "^\[atom" "$out/engine.log" | tail -n 8 | tee -a "$summary"
  grep -E "KV|engine:|preempt" "$out/engine.log" | head -5 | tee -a "$summary"
  timeout 120 "$bin/atom" bench prefix --model "$m" --load-format dummy --device cuda \
    --prefix-len 2000 --suffix-len 16 --num-iters 10 --output-json "$out/prefix.json" >> "$out/engine.log" 2>&1
  note "bench prefix: rc=$?"
  grep -vE "^\[atom" "$out/engine.log" | tail -n 6 | tee -a "$summary"
fi

if has fp8check; then
  timeout 300 compute-sanitizer --tool memcheck --print-limit 20 "$bin/gpu_test" \
    --gtest_filter='GpuAttention.Fp8CacheDecodeSplitsAndMerges:*Fp8*Cpu*' > "$out/fp8_memcheck.log" 2>&1
  note "fp8 memcheck: rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" "$out/fp8_memcheck.log" | head -20 | tee -a "$summary"
  timeout 240 "$bin/cuda_e2e_bench" --model "$stage/bench/models/llama-3.1-8b" --load-format dummy \
    --batch 1,32,128,256 --kv-cache-dtype fp8 > "$out/e2e_fp8.log" 2>&1
  note "e2e bench, fp8 KV cache: rc=$?"
  tail -n 8 "$out/e2e_fp8.log" | tee -a "$summary"
fi

# `atom bench throughput` of the 8B shape, 512 x 1000/1000, with KV cache dtype $1 at each
# --max-num-seqs in $2 (steps fp8 and bf16).
kv_throughput() {
  local m="$stage/bench/models/llama-3.1-8b"
  for seqs in $2; do
    timeout 300 "$bin/atom" bench throughput --model "$m" --load-format dummy --device cuda \
      --input-len 1000 --output-len 1000 --num-prompts 512 --max-num-seqs $seqs \
      --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --kv-cache-dtype "$1" \
      --output-json "$out/throughput_$1_$seqs.json" > "$out/engine_$1_$seqs.log" 2>&1
    note "bench throughput 512x1000/1000, $1 KV cache, max-num-seqs $seqs: rc=$?"
    grep -vE "^\[atom" "$out/engine_$1_$seqs.log" | tail -n 8 | tee -a "$summary"
    grep -E "KV|engine on|preempt" "$out/engine_$1_$seqs.log" | head -5 | tee -a "$summary"
  done
}
if has fp8; then kv_throughput fp8 "${ATOM_FP8_SEQS:-256 512}"; fi
if has bf16; then kv_throughput bf16 "${ATOM_BF16_SEQS:-256 512}"; fi

if has serve; then
  m="$stage/bench/models/llama-3.1-8b-tok"
  # Offline baseline on the served workload: 256 requests of 1000/1000 at 64 sequences.
  timeout 200 "$bin/atom" bench throughput --model "$m" --load-format dummy --device cuda \
    --input-len 1000 --output-len 1000 --num-prompts 256 --max-num-seqs 64 \
    --output-json "$out/throughput64.json" > "$out/serve.log" 2>&1
  note "bench throughput 256x1000/1000 @64: rc=$?"
  grep -vE "^\[atom" "$out/serve.log" | tail -n 4 | tee -a "$summary"
  "$bin/atom" serve "$m" --load-format dummy --device cuda --host 127.0.0.1 --port 8011 \
    --max-model-len 4096 --max-num-seqs 64 --served-model-name llama > "$out/server.log" 2>&1 &
  spid=$!
  for i in $(seq 1 240); do grep -q "serving llama" "$out/server.log" && break; sleep 0.5; done
  grep -E "ready in|serving" "$out/server.log" | tee -a "$summary"
  timeout 200 "$bin/atom" bench serve --port 8011 --num-prompts 256 --random-input-len 1000 \
    --random-output-len 1000 --max-concurrency 64 --percentile-metrics ttft,tpot,itl,e2el \
    --metric-percentiles 50,99 --result-filename "$out/serve64.json" >> "$out/serve.log" 2>&1
  note "bench serve 256x1000/1000 @64: rc=$?"
  timeout 100 "$bin/atom" bench serve --port 8011 --num-prompts 20 --random-input-len 1000 \
    --random-output-len 16 --max-concurrency 1 --percentile-metrics ttft,e2el --metric-percentiles 50,99 \
    --result-filename "$out/serve_lowload.json" >> "$out/serve.log" 2>&1
  note "bench serve low load: rc=$?"
  grep -E "Successful|Failed|duration|Output token|Mean TTFT|Median TTFT|P99 TTFT|Mean TPOT|Median ITL" "$out/serve.log" | tee -a "$summary"
  kill -TERM $spid; wait $spid; note "server exit: $?"
fi

echo "================ summary"
cat "$summary"
if has kernels; then echo "================ kernels"; grep -vE "^$" "$out/kernels.log" | cut -c1-140 | tail -n 60; fi
