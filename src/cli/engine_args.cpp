#include "cli/engine_args.h"

#include "core/error.h"
#include "engine/spec_decode.h"

namespace atom::cli {

void engine_args_add(CLI::App* cmd, EngineArgs& a) {
  EngineConfig& c = a.config;
  cmd->add_option("--max-num-seqs", c.max_num_seqs, "sequences running at once")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--max-num-batched-tokens",
         [&c](const std::string& v) {
           c.max_num_batched_tokens =
               static_cast<int>(token_count_parse(v, "--max-num-batched-tokens"));
         },
         "tokens per engine step (prefill chunks and decodes together), e.g. 8192 or 8k")
      ->default_str(std::to_string(c.max_num_batched_tokens));
  cmd->add_option("--long-prefill-token-threshold", c.long_prefill_token_threshold,
                  "cap on one prompt's chunk per step (0: none)")
      ->capture_default_str();
  cmd->add_option("--block-size", c.block_size, "tokens per KV cache block")->capture_default_str();
  cmd->add_option_function<std::string>(
      "--max-model-len",
      [&c](const std::string& v) {
        c.max_model_len = static_cast<int>(token_count_parse(v, "--max-model-len"));
      },
      "longest sequence (prompt + output), e.g. 32768, 32k or 32K; default: the model's "
      "max_position_embeddings");
  cmd->add_option(
      "--kv-cache-memory", a.kv_cache_memory,
      "bytes for the KV cache and state pool, e.g. 4GiB (default: 4GiB on the CPU; on CUDA "
      "what --gpu-memory-utilization leaves)");
  cmd->add_option("--gpu-memory-utilization", c.gpu_memory_utilization,
                  "CUDA: share of the GPU's memory for weights, activations and the KV cache, "
                  "which gets what the others leave")
      ->capture_default_str();
  cmd->add_flag("--enforce-eager", c.enforce_eager, "CUDA: decode without CUDA graphs");
  cmd->add_option("--num-gpu-blocks-override", c.num_gpu_blocks_override,
                  "use exactly this many KV cache blocks, whatever the memory");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", c.enable_prefix_caching,
                "reuse the KV of shared prompt prefixes (default on)");
  cmd->add_option("--state-checkpoint-interval-tokens", c.state_checkpoint_interval_tokens,
                  "recurrent (hybrid) models: checkpoint each sequence's state every this many "
                  "tokens (a multiple of --block-size) so that prefix caching can resume it; 0 "
                  "keeps their prefix caching off")
      ->capture_default_str();
  cmd->add_option("--num-state-checkpoints", c.num_state_checkpoints,
                  "state checkpoints kept for that (each the size of one request's state, "
                  "reserved with the state pool); 0: --max-num-seqs")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
      "--speculative-config", [&c](const std::string& v) { speculative_config_parse(v, c); },
      "speculative decoding with the checkpoint's MTP layers, vLLM's JSON: "
      "'{\"method\": \"mtp\", \"num_speculative_tokens\": K}', K in 1..4; or with "
      "DeepSeek-V4.1's DSpark block drafter: '{\"method\": \"dspark\", "
      "\"num_speculative_tokens\": K}', K in 1..8, with \"confidence_schedule\": true to verify "
      "per sequence only the drafts its confidence head and the engine's throughput make worth "
      "it (optional \"sts_temperatures\": [K numbers], \"sps_table\": [[tokens, steps per "
      "second], ...], measured as it runs when absent)");
  cmd->add_option("--spec-decode-acceptance-rate", c.spec_decode_acceptance_rate,
                  "benchmarking: accept each draft token with this probability in [0, 1] whatever "
                  "the model says (outputs are then not the model's)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", c.seed, "seeds the requests that bring none")->capture_default_str();
  cmd->add_option(
         "--kv-cache-dtype", c.kv_cache_dtype,
         "KV cache element type: auto (the activation dtype), fp8 / fp8_e4m3 (e4m3, scales "
         "1.0: half the bytes of bf16), bf16 / bfloat16")
      ->capture_default_str()
      ->check([](const std::string& v) {  // refused before the model loads
        try {
          kv_cache_dtype_parse(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
}

EngineConfig engine_args_config(const EngineArgs& a) {
  EngineConfig c = a.config;
  if (!a.kv_cache_memory.empty())
    c.kv_cache_memory = byte_size_parse(a.kv_cache_memory, "--kv-cache-memory");
  return c;
}

}  // namespace atom::cli
