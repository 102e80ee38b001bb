// Engine options (vLLM's names) and how the KV cache is sized from them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "models/model_group.h"

namespace atom {

struct EngineConfig {
  int max_num_seqs = 256;                // sequences running at once
  int max_num_batched_tokens = 8192;     // tokens per step (prefill chunks + decodes)
  int long_prefill_token_threshold = 0;  // > 0: cap on one prompt's chunk per step
  int block_size = 16;                   // tokens per KV block
  int max_model_len = 0;                 // 0: the model's max_position_embeddings
  // Bytes for the KV cache and the state pool. 0: 4 GiB on the CPU (vLLM's VLLM_CPU_KVCACHE_SPACE
  // default), on CUDA whatever gpu_memory_utilization leaves (measured by the runner).
  int64_t kv_cache_memory = 0;
  // CUDA: the share of the GPU's memory the runner may use; the KV cache gets what the weights,
  // the profiled activations, decode graphs and workspaces leave of it.
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;       // CUDA: decode without CUDA graphs
  int num_gpu_blocks_override = 0;  // > 0: exactly this many KV blocks, whatever the memory
  bool enable_prefix_caching = true;
  // Draft tokens per step with speculative decoding (K; also the rollback state slots per
  // request of recurrent models).
  int num_speculative_tokens = 0;
  // Speculative decoding (--speculative-config, engine/spec_decode.h): "mtp" (the drafter in the
  // target's checkpoint), or empty: off.
  std::string speculative_method;
  // DSpark (--speculative-config's confidence_schedule, engine/verify_schedule.h): each step, how
  // many of its K drafts each sequence verifies, from the drafter's confidence head and the
  // engine's throughput profile, instead of all K. sts_temperatures: empty or K positive
  // per-position temperatures calibrating the confidences; sps_table: (tokens, forward steps per
  // second) points of the profile, empty: measured as the engine runs.
  bool spec_confidence_schedule = false;
  std::vector<float> spec_sts_temperatures;
  std::vector<std::pair<int, double>> spec_sps_table;
  // Benchmarking only (--spec-decode-acceptance-rate): in [0, 1], each draft token is accepted
  // with this probability whatever the target says (random weights accept nothing), so outputs are
  // not the model's; < 0: off.
  double spec_decode_acceptance_rate = -1;
  // Recurrent models: > 0 (a multiple of block_size) turns prefix caching on for them by
  // checkpointing each sequence's state every this many tokens (ATOM's
  // --state-checkpoint-interval-tokens); 0: their prefix caching stays off.
  int state_checkpoint_interval_tokens = 0;
  // State slots kept for those checkpoints (each as large as a request's state); 0: max_num_seqs.
  int num_state_checkpoints = 0;
  uint64_t seed = 0;  // draws the seeds of requests that bring none
  // KV cache element type, vLLM's --kv-cache-dtype: "auto" (the activation dtype), "fp8" or
  // "fp8_e4m3" (e4m3 with per-tensor scales of 1: half the bytes of BF16), "bf16" or "bfloat16".
  std::string kv_cache_dtype = "auto";
};

struct KvCachePlan {
  int num_blocks = 0;  // 0 while from_gpu_memory: the runner measures, the engine fills it in
  bool from_gpu_memory = false;
  int block_size = 16;
  int num_state_slots = 0;
  int state_slots_per_request = 0;  // 0: the model keeps no recurrent state
  // Of num_state_slots, the last this many hold prefix checkpoints of the recurrent state.
  int num_checkpoint_slots = 0;
  DType kv_cache_dtype = DType::kF32;  // what the attention layers' caches store
  size_t block_bytes = 0;              // one block over all attention layers
  size_t state_slot_bytes = 0;         // one slot over all recurrent layers
  int max_model_len = 0;
};

// The state pool is reserved first (max_num_seqs requests x (1 + num_speculative_tokens) slots),
// then the rest of kv_cache_memory becomes blocks, never more than max_num_seqs sequences of
// max_model_len can fill. Refuses (Error with the numbers) when one sequence of max_model_len does
// not fit, or when max_model_len exceeds the model's. For a model on CUDA with neither
// num_gpu_blocks_override nor kv_cache_memory the blocks are left to the ModelRunner, which sizes
// them from free GPU memory (from_gpu_memory, num_blocks 0).
// With a group (tensor and pipeline ranks), a block and a state slot are the largest any rank
// holds (a pipeline stage holds only its layers' caches), and the plan keeps state slots when any
// rank's layers are recurrent.
KvCachePlan kv_cache_plan(const Model& model, const EngineConfig& config,
                          ModelGroup* group = nullptr);

// A worker node's answer to the plan's question (its "plan" command, engine/tp_runner.h): the
// largest block and state slot among its ranks, which the head's kv_cache_plan takes into its own.
std::string kv_cache_plan_reply(ModelGroup& group, Wire& command);

// --kv-cache-dtype: "auto" -> nullopt (the activation dtype); "fp8", "fp8_e4m3" -> F8E4M3; "bf16",
// "bfloat16" -> BF16. Anything else is an Error naming the flag and the accepted values.
std::optional<DType> kv_cache_dtype_parse(const std::string& name);
// The KV cache dtype for `model` under --kv-cache-dtype `name`; an Error naming the flag when the
// model's device cannot attend over it (CUDA: the activation dtype or F8E4M3).
DType kv_cache_dtype_for(const Model& model, const std::string& name);

inline constexpr int64_t kCpuKvCacheMemory = int64_t{4} << 30;

// "4GiB", "512MiB", "1G", "1000000" -> bytes; an Error naming `flag` otherwise.
int64_t byte_size_parse(const std::string& s, const std::string& flag);
// vLLM's human-readable counts (--max-model-len 32k): a number with k, m, g (powers of 1000,
// decimals allowed: 25.6k = 25600) or K, M, G (powers of 1024, whole numbers); an error naming
// `flag` on anything else, on a non-integral result and on values past int32.
int64_t token_count_parse(const std::string& s, const std::string& flag);

}  // namespace atom
