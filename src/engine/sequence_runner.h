// Single-sequence helpers over a ModelRunner (or a tensor-parallel TpRunner) for `atom score` and
// `atom generate`: a sequence's pages are allocated contiguously, its prompt is prefilled
// (optionally in chunks), then decoded one token at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/model_runner.h"
#include "models/model_group.h"

namespace atom {

// Logits [T, vocab] F32 for every position of `tokens`. chunk > 0 prefills in chunks of that
// many tokens (each chunk attends to the cached context of the previous ones). kv_cache_dtype:
// the KV cache's element type (unset: the activation dtype).
// embeds: embedding rows replaced (a multimodal prompt's image features), rows of `tokens`.
Tensor score_tokens(Model& model, const std::vector<int32_t>& tokens, int chunk = 0,
                    int block_size = 16, std::optional<DType> kv_cache_dtype = std::nullopt,
                    const InputEmbeds* embeds = nullptr);
// The same over every rank of a tensor-parallel group (rank 0's logits).
Tensor score_tokens(ModelGroup& models, const std::vector<int32_t>& tokens, int chunk = 0,
                    int block_size = 16, std::optional<DType> kv_cache_dtype = std::nullopt);

struct GreedyResult {
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "length" or "stop"
};

// Greedy decoding: up to max_tokens new tokens; stops at any of `eos` unless ignore_eos.
GreedyResult generate_greedy(Model& model, const std::vector<int32_t>& prompt, int max_tokens,
                             const std::vector<int64_t>& eos, bool ignore_eos, int block_size = 16,
                             std::optional<DType> kv_cache_dtype = std::nullopt,
                             const InputEmbeds* embeds = nullptr);
GreedyResult generate_greedy(ModelGroup& models, const std::vector<int32_t>& prompt, int max_tokens,
                             const std::vector<int64_t>& eos, bool ignore_eos, int block_size = 16,
                             std::optional<DType> kv_cache_dtype = std::nullopt);

}  // namespace atom
