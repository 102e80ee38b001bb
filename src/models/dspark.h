// DSpark (DeepSeek-AI, 2026; ROCm/ATOM's atom/models/deepseek_v4_dspark.py and
// atom/spec_decode/dspark_proposer.py, read, not copied): the block drafter a DeepSeek-V4 / V4.1
// checkpoint carries as its mtp.{0..S-1} stages, drafting a whole block of tokens in one
// parallel pass. On the CPU in F32, for DeepseekV41ForCausalLM (models/dspark.cpp;
// docs/deepseek_v41.md#dspark).
//
// For a sequence whose last target-computed position is p and whose next token x0 (the anchor)
// the target has just chosen:
//   * absorb: main[j] = main_norm(main_proj(concat of the target's outputs of
//     dspark_target_layer_ids at position j)), each output the hyper-connection streams after
//     that layer averaged (the definition's hidden_states[L + 1]); every stage keeps its context
//     row rope(kv_norm(wkv main[j]), j) in its cache plane.
//   * draft_block: the tokens [x0, noise, ..., noise] (dspark_noise_token_id) at positions
//     p + 1 .. p + width through the stages, each a DeepSeek-V4 decoder layer (V4's mHC and MoE)
//     whose attention reads the stage's context rows of the sliding window [p - W + 1, p] and the
//     whole block (bidirectional; q per-head RMS-normed, a sink per head, the output rotated back,
//     grouped wo_a); the last stage's hc_head and norm, the target's head: base logits U. The
//     Markov head drafts left to right, x_{k+1} = argmax U_k + W1[x_k] W2^T; the confidence head
//     gives sigmoid(proj([h_k ; W1[x_k]])), h before the norm.
// Config: dspark_block_size (its presence says the checkpoint has DSpark stages),
// dspark_target_layer_ids, dspark_noise_token_id, dspark_markov_rank, dspark_num_layers (else the
// mtp.N stages counted in the checkpoint), dspark_n_routed_experts and dspark_num_experts_per_tok
// (the stages' mixture; else the target's). The Markov tables load as markov_head.markov_w{1,2} or
// as the release's markov_head.embed / .head. RoPE: rope_theta on the last qk_rope_head_dim
// channels. Not modelled: the definition's FP8 fake-quantisation of the key rows (QAT; F32 here, as
// the V4.1 target keeps its window keys). The confidences drive the engine's verify lengths when
// asked (engine/verify_schedule.h).
#pragma once

#include <cstdint>
#include <vector>

#include "loader/hf_config.h"

namespace atom {

struct DSparkConfig {
  int64_t block_size = 0, noise_token_id = 0, markov_rank = 0, num_stages = 0;
  std::vector<int64_t> target_layer_ids;

  // The dspark_* fields of a DeepSeek-V4.1 config (text fields), checked against its layers and
  // vocabulary; an error naming dspark_block_size when the checkpoint carries no DSpark stages.
  static DSparkConfig parse(const ModelConfig& c, int64_t num_hidden_layers, int64_t vocab);
};

}  // namespace atom
