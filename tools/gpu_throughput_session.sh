#!/usr/bin/env bash
# One GPU call for issue 34's end-to-end targets: builds `atom` and runs `atom bench throughput`
# (1,000 in / 1,000 out, 512 prompts, --max-num-seqs 256, random weights in the checkpoint's own
# format) on each model named, printing output tok/s, steps and preemptions; JSON and logs to $OUT.
# Run from the repository root: bash tools/gpu_throughput_session.sh [models]
#   models: comma-separated folders of bench/models (default: llama-3.1-8b-fp8-dynamic,
#   gpt-oss-120b,qwen3-30b-a3b,deepseek-v2-lite). An FP8 checkpoint also gets the FP8 KV cache.
# Each run is capped at ATOM_TP_TIMEOUT seconds (default 120) so that one slow model leaves the
# others their time within the call's 600 s.
set -u
out="${OUT:-/tmp/throughput-out}"
models="${1:-llama-3.1-8b-fp8-dynamic,gpt-oss-120b,qwen3-30b-a3b,deepseek-v2-lite}"
source tools/gpu_preamble.sh "atom"
IFS=, read -r -a list <<< "$models"
for m in "${list[@]}"; do
  kv=()
  case "$m" in *fp8*) kv=(--kv-cache-dtype fp8) ;; esac
  timeout "${ATOM_TP_TIMEOUT:-120}" ./build-gpu/bin/atom bench throughput --model "bench/models/$m" \
    --load-format dummy --device cuda --input-len 1000 --output-len 1000 --num-prompts 512 \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 "${kv[@]}" \
    --output-json "$out/throughput_$m.json" > "$out/throughput_$m.log" 2>&1
  echo "throughput $m ${kv[*]}: rc $?"
  grep -E "^Throughput|^Engine|^TTFT" "$out/throughput_$m.log"
done
