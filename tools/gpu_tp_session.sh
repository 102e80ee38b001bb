#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (nvidia-h200-x2), after tools/gpu_build.sh built
# build-gpu/ there (ATOM_GPU_SESSION=tp bash tools/gpu_build.sh STEPS runs this): the TP GPU tests,
# the CLI on two GPUs, `atom bench throughput` of the
# Llama-3.1-8B shape (dummy weights, 512 x 1000/1000) at tensor-parallel size 2 then 1, and
# `atom serve --tensor-parallel-size 2` under `atom bench serve`. About 5 minutes; steps are
# skipped once 7 have passed, so the whole run stays inside one 10-minute device command. Logs go
# to $OUT (8 files at most); the last lines printed are a summary.
#   bash tools/gpu_tp_session.sh [steps]   steps: comma list of tests,cli,tp2,serve,tp1
set -u
stage="$(cd "$(dirname "$0")/.." && pwd)"
# The binaries and the libraries the image lacks: tools/gpu_build.sh's build-gpu/ (bin/, lib/).
build="${ATOM_GPU_STAGE:-$stage/build-gpu}"
bin="$build/bin"
out="${OUT:-/tmp/atom-out}"
mkdir -p "$out"
steps=",${1:-tests,cli,tp2,serve,tp1},"
start=$SECONDS
export ATOM_SOURCE_DIR="$stage" PYTHONUNBUFFERED=1
# NVLink multicast (NVLS) stays off: it can take the host's shared GPUs out of service.
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
# libnccl.so.2 from the CUDA folders, else from the Python image's NCCL wheel.
if ! ldd "$bin/atom" | grep -q "libnccl.so.2 => /"; then
  nccl="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0] + "/lib")' 2>/dev/null)"
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:$LD_LIBRARY_PATH"
fi
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
# Whether a step still fits: none starts after 420 s.
fits() {
  if (( SECONDS - start > 420 )); then note "$1: skipped (time budget)"; return 1; fi
  return 0
}

head -1 "$build/COMMIT" | sed 's/^/commit /' | tee -a "$summary"
cat "$build/BUILD_TIME" 2>/dev/null | tee -a "$summary"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv | tee -a "$summary"
ldd "$bin/atom" | grep -E "nccl|not found" | tee -a "$summary"
gpus=$(nvidia-smi -L | wc -l)
(( gpus >= 2 )) || note "only $gpus GPU(s): the TP tests skip and --tensor-parallel-size 2 fails"
m="$stage/bench/models/llama-3.1-8b"

if has tests && fits tests; then
  timeout 240 "$bin/gpu_test" --gtest_filter='GpuTp*:*GpuTpParity*:GpuRunner.*' > "$out/tests.log" 2>&1
  note "tests GpuTp*, GpuTpParity, GpuRunner: rc=$?"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|error:|Skipped|rel err|agree for" "$out/tests.log" \
    | grep -v "listed below" | head -40 | tee -a "$summary"
  gtest_summary "$out/tests.log"
fi

if has cli && fits cli; then
  {
    for tp in 1 2; do
      "$bin/atom" generate --model "$stage/tests/fixtures/models/llama3_gqa" --prompt-tokens 1,2,3,4,5 \
        --max-tokens 8 --device cuda --tensor-parallel-size $tp --json
    done
    "$bin/atom" score --model "$stage/tests/fixtures/models/qwen3_tied" --tokens 1,2,3,4 \
      --out /tmp/score_tp2.safetensors --device cuda --tp 2
  } > "$out/cli.log" 2>&1
  note "cli (generate tp 1 and 2, score tp 2): rc=$?"
  grep -E "^\{" "$out/cli.log" | tee -a "$summary"
  grep -E "NCCL|error|Error" "$out/cli.log" | head -5 | tee -a "$summary"
fi

throughput() {  # throughput TP JSON_NAME
  timeout 170 "$bin/atom" bench throughput --model "$m" --load-format dummy --device cuda \
    --tensor-parallel-size "$1" --input-len 1000 --output-len 1000 --num-prompts 512 \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
    --output-json "$out/$2" >> "$out/engine.log" 2>&1
  note "bench throughput tp $1 512x1000/1000: rc=$?"
  grep -E "KV cache:|captured|engine on" "$out/engine.log" | tail -n 4 | tee -a "$summary"
  grep -vE "^\[atom" "$out/engine.log" | tail -n 5 | tee -a "$summary"
}
if has tp2 && fits tp2; then throughput 2 throughput_tp2.json; fi

if has serve && fits serve; then
  ms="$stage/bench/models/llama-3.1-8b-tok"
  [ -d "$ms" ] || ms="$m"
  "$bin/atom" serve "$ms" --load-format dummy --device cuda --tensor-parallel-size 2 \
    --host 127.0.0.1 --port 8012 --max-model-len 4096 --max-num-seqs 64 --served-model-name llama \
    > "$out/server.tmp" 2>&1 &
  spid=$!
  for i in $(seq 1 240); do
    grep -q "serving llama" "$out/server.tmp" && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.5
  done
  grep -E "NCCL|ready in|engine on|serving|error" "$out/server.tmp" | tee -a "$summary"
  if grep -q "serving llama" "$out/server.tmp"; then
    timeout 150 "$bin/atom" bench serve --port 8012 --num-prompts 64 --random-input-len 1000 \
      --random-output-len 200 --max-concurrency 16 --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,99 --result-filename "$out/serve_tp2.json" > "$out/serve.log" 2>&1
    note "bench serve tp 2, 64 x 1000/200 @16: rc=$?"
    grep -E "Successful|Failed|duration|Output token|Mean TTFT|Median TTFT|Mean TPOT|Median ITL" \
      "$out/serve.log" | tee -a "$summary"
  else
    note "server did not start"
  fi
  kill -TERM $spid 2>/dev/null; wait $spid; note "server exit: $?"
  { echo "##### server log"; cat "$out/server.tmp"; } >> "$out/serve.log"
  rm -f "$out/server.tmp"
fi

if has tp1 && fits tp1; then throughput 1 throughput_tp1.json; fi

note "total $((SECONDS - start)) s"
echo "================ summary"
cat "$summary"
