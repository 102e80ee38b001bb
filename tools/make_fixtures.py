#!/usr/bin/env python3
"""Builds the tiny reference checkpoints under tests/fixtures/models with Hugging Face transformers.

Runs on the GPU machine (transformers 5.17, PyTorch 2.11). For each fixture it:
  1. builds a random-weight model from a config (hidden 64-128, 2-4 layers, vocab <= 1024), with
     weights scaled so the logits are far from flat (a tied embedding is scaled down so that the
     input token does not dominate its own logits; routers' correction biases are random);
  2. saves it with save_pretrained (bf16 unless the fixture says f32), then rewrites the weights in
     the layout the fixture names (per-expert hub names, Mixtral's block_sparse_moe/w1/w3/w2,
     stacked experts.gate_up_proj/down_proj), sharded when asked, plus extra tensors transformers
     ignores (MTP layers past num_hidden_layers); optionally rewrites config.json into the legacy
     layout (rope_theta + rope_scaling, torch_dtype);
  3. reloads the saved folder fresh in float32 with eager attention (TF32 off), checks that every
     weight arrived with the values the model had (so the rewritten layout is one transformers
     reads), and records the logits for fixed token ids plus 16 greedy tokens from a fixed prompt,
     with each step's top-1/top-2 margin, into OUT_DIR/references/NAME.safetensors (outside the
     model folder, whose every tensor must belong to the model).

A fixture is rejected (no files written) when its references could not fail a test:
  - a greedy run with fewer than MIN_DISTINCT distinct tokens, or one token repeated more than
    MAX_RUN times in a row;
  - more than MAX_SELF_ARGMAX of the logit rows whose top logit is that row's own input token;
  - a greedy step whose top-2 margin is below MIN_MARGIN (rounding could flip it);
  - an MoE router whose choice for some token is within ROUTER_MARGIN of a tie (fp32 rounding
    could route differently);
  - a sparse-attention indexer (DeepSeek-V3.2, GLM-5) whose top-k keys for some query are within
    INDEXER_MARGIN of a tie (fp32 rounding could select other keys).
Ids and prompts are re-drawn (bounded attempts) until these hold.

Checkpoints go to OUT_DIR/models/NAME. Usage: python3 tools/make_fixtures.py tests/fixtures [NAME ...]
"""
import glob
import json
import math
import os
import re
import shutil
import sys
import traceback
import types

import torch
import transformers
from safetensors.torch import load_file, save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FIXTURES = [
    dict(
        name="llama3_gqa",
        cls="LlamaConfig",
        config=dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64)),
        generation_config=dict(bos_token_id=1, eos_token_id=[2, 5]),
        tokens=48, seed=1),
    dict(
        name="llama_yarn_bias_legacy",
        cls="LlamaConfig",
        config=dict(vocab_size=512, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    attention_bias=True, mlp_bias=True, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0,
                                         original_max_position_embeddings=32)),
        legacy_config=True,
        tokens=64, seed=2),
    dict(
        name="llama_linear_sharded_f32",
        cls="LlamaConfig",
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
        save_dtype="float32", shards=2,
        tokens=40, seed=3),
    dict(
        name="qwen3_tied",
        cls="Qwen3Config",
        config=dict(vocab_size=800, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        tokens=48, seed=4),
    dict(
        name="qwen3_sliding",
        cls="Qwen3Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    use_sliding_window=True, sliding_window=8, max_window_layers=1,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        tokens=40, seed=5),
    # Qwen3-MoE: softmax top-2 of 8 with renormalisation, layer 1 dense through mlp_only_layers,
    # per-expert hub names, two shards.
    dict(
        name="qwen3_moe",
        cls="Qwen3MoeConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        router="softmax", experts="per_expert", shards=2,
        tokens=64, seed=6),
    # Qwen3-MoE with stacked experts (experts.gate_up_proj [E, 2I, H], experts.down_proj
    # [E, H, I]), top-4 of 16 without renormalisation, every second layer sparse.
    dict(
        name="qwen3_moe_stacked",
        cls="Qwen3MoeConfig",
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=96,
                    moe_intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, num_experts=16, num_experts_per_tok=4,
                    norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        router="softmax", experts="stacked",
        tokens=64, seed=7),
    # Mixtral: top-2 of 8 (always renormalised), hub names block_sparse_moe.experts.N.w1/w3/w2,
    # a 16-token sliding window on every layer.
    dict(
        name="mixtral",
        cls="MixtralConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=48, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        router="softmax", experts="mixtral",
        tokens=64, seed=8),
    # GLM-4.5 shape: sigmoid scores + e_score_correction_bias, 4 groups keep 2, top-4 of 16,
    # renormalised and scaled by 2.5, one shared expert, the first layer dense, q/k/v bias,
    # QK norm, RoPE on the first half of each head.
    dict(
        name="glm4_moe",
        cls="Glm4MoeConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5,
                    attention_bias=True, use_qk_norm=True, n_routed_experts=16,
                    n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
                    routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True,
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         partial_rotary_factor=0.5)),
        router="sigmoid_grouped", experts="per_expert",
        tokens=64, seed=9),
    # GLM-4.5-Air shape: one group, no QK norm, scale 1, two shared experts, 2 shards, and an MTP
    # layer at model.layers.{num_hidden_layers} that a plain load must skip.
    dict(
        name="glm4_moe_air",
        cls="Glm4MoeConfig",
        config=dict(vocab_size=448, hidden_size=64, intermediate_size=96,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, head_dim=16, partial_rotary_factor=0.5,
                    attention_bias=True, use_qk_norm=False, n_routed_experts=8,
                    n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1,
                    routed_scaling_factor=1.0, first_k_dense_replace=1, norm_topk_prob=True,
                    num_nextn_predict_layers=1,
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         partial_rotary_factor=0.5)),
        router="sigmoid_grouped", experts="per_expert", shards=2, mtp_layers=1,
        tokens=64, seed=10),
]

FIXTURES += [
    # GPT-OSS: q/k/v/o bias, sinks, a 16-token window on even layers, YaRN without truncation,
    # router bias with top-k then softmax, expert biases, clamped SwiGLU; transformers' BF16
    # layout (gate_up_proj [E, H, 2I] interleaved).
    dict(
        name="gpt_oss",
        cls="GptOssConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0,
                                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                                         original_max_position_embeddings=64)),
        router="topk_softmax", experts_transposed=True,
        tokens=64, seed=11),
    # The same family with MXFP4 experts (quant_method mxfp4): blocks [E, out, in/32, 16] U8 and
    # scales [E, out, in/32] U8, dequantised by transformers on load.
    dict(
        name="gpt_oss_mxfp4",
        cls="GptOssConfig",
        config=dict(vocab_size=448, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=12,
                    layer_types=["sliding_attention", "full_attention"],
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0,
                                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                                         original_max_position_embeddings=32)),
        router="topk_softmax", experts_transposed=True, quantize="mxfp4", shards=2,
        tokens=64, seed=12),
]

FIXTURES += [
    # DeepSeek-V2-Lite shape: multi-head latent attention without q LoRA (plain q_proj), YaRN
    # with mscale = mscale_all_dim (cos/sin unscaled, softmax scale times mscale^2), RoPE on
    # complex pairs; softmax top-2 of 8 ("greedy"), never renormalised, two shared experts, the
    # first layer dense.
    dict(
        name="deepseek_v2_lite",
        cls="DeepseekV2Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
                    topk_method="greedy", routed_scaling_factor=1.0, norm_topk_prob=False,
                    first_k_dense_replace=1, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=64,
                                         beta_fast=32.0, beta_slow=1.0,
                                         mscale=0.707, mscale_all_dim=0.707)),
        router="softmax", experts="per_expert",
        tokens=64, seed=13),
    # DeepSeek-V2 shape: q LoRA, softmax scores limited to the best 2 of 4 groups by their max
    # ("group_limited_greedy"), top-3 of 16 scaled by 2, one shared expert, default RoPE, two
    # shards.
    dict(
        name="deepseek_v2",
        cls="DeepseekV2Config",
        config=dict(vocab_size=448, hidden_size=64, intermediate_size=96,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                    n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=3,
                    topk_method="group_limited_greedy", n_group=4, topk_group=2,
                    routed_scaling_factor=2.0, norm_topk_prob=False, first_k_dense_replace=1,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        router="softmax_group_max", experts="per_expert", shards=2,
        tokens=64, seed=14),
    # DeepSeek-V3 shape: q LoRA, YaRN with mscale != mscale_all_dim (cos/sin scaled and the
    # softmax scale corrected), interleaved RoPE, v_head_dim != qk_nope_head_dim; sigmoid +
    # correction bias, 4 groups keep 2, top-4 of 16, renormalised, scaled by 2.5, one shared
    # expert, the first layer dense, and an MTP layer a plain load skips.
    dict(
        name="deepseek_v3",
        cls="DeepseekV3Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                    n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4,
                    n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                    first_k_dense_replace=1, rope_interleave=True,
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                         original_max_position_embeddings=64,
                                         beta_fast=32.0, beta_slow=1.0,
                                         mscale=1.0, mscale_all_dim=0.8)),
        router="sigmoid_grouped", experts="per_expert", mtp_layers=1,
        tokens=64, seed=15),
    # DeepSeek-V3 class with V2-Lite choices: no q LoRA, half-split RoPE (rope_interleave false),
    # default RoPE, one group, no renormalisation, every layer sparse.
    dict(
        name="deepseek_v3_plain",
        cls="DeepseekV3Config",
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=96,
                    moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=24,
                    qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
                    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                    n_group=1, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False,
                    first_k_dense_replace=0, rope_interleave=False,
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        router="sigmoid_grouped", experts="per_expert",
        tokens=64, seed=16),
    # DeepSeek-V3.2 shape: V3's MLA plus the lightning indexer (16 heads of 16, half-split RoPE
    # on its first 8 channels, LayerNorm'd key) keeping the top 12 keys of each query, so most
    # rows of the logits and the later greedy steps attend sparsely; YaRN; 2 groups keep 1. (With
    # few indexer heads many keys score exactly 0 after the ReLUs and tie at the top-k boundary.)
    dict(
        name="deepseek_v32",
        cls="DeepseekV32Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                    n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                    first_k_dense_replace=1, index_topk=12, index_head_dim=16, index_n_heads=16,
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=2.0,
                                         original_max_position_embeddings=128,
                                         beta_fast=32.0, beta_slow=1.0,
                                         mscale=1.0, mscale_all_dim=1.0)),
        router="sigmoid_grouped", experts="per_expert", indexer=True, mtp_layers=1,
        tokens=64, seed=17, more_seeds=[117, 217]),
    # GLM-5 shape: the same with interleaved RoPE in the indexer, qk_nope 24 / v 32, the top 10
    # keys, and layer 1 reusing layer 0's selection (indexer_types), default RoPE, one group.
    dict(
        name="glm_moe_dsa",
        cls="GlmMoeDsaConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                    moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                    qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=32,
                    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                    n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                    first_k_dense_replace=1, index_topk=10, index_head_dim=16, index_n_heads=16,
                    indexer_types=["full", "shared", "full"],
                    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        router="sigmoid_grouped", experts="per_expert", indexer=True,
        tokens=64, seed=18, more_seeds=[118, 218]),
    # DeepSeek-V4 shape (issue 35): every attention kind (HCA with windows of 16, CSA with windows
    # of 4 and its indexer keeping the top 4 entries, pure sliding), a sliding window of 8, RoPE on
    # the last 8 of 32 channels with the plain "main" table and the YaRN "compress" one, grouped
    # output projection (2 groups), 4 mHC streams, a hash-routed first MoE layer then sqrt-softplus
    # routing, SwiGLU clamped at 1 (so the clamp acts). 96 scored tokens complete 6 HCA windows and
    # 24 CSA windows; the 20-token greedy prompt passes the window and the top-k.
    dict(
        name="deepseek_v4",
        cls="DeepseekV4Config",
        config=dict(vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=48,
                    partial_rotary_factor=0.25, n_routed_experts=8, n_shared_experts=1,
                    num_experts_per_tok=2, routed_scaling_factor=1.5, swiglu_limit=1.0,
                    layer_types=["heavily_compressed_attention", "compressed_sparse_attention",
                                 "sliding_attention", "compressed_sparse_attention"],
                    compress_rates={"compressed_sparse_attention": 4,
                                    "heavily_compressed_attention": 16},
                    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, sliding_window=8,
                    o_groups=2, o_lora_rank=16, index_n_heads=4, index_head_dim=16, index_topk=4,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                    compress_rope_theta=160000.0, tie_word_embeddings=False,
                    bos_token_id=0, eos_token_id=1,
                    rope_parameters=dict(rope_type="yarn", factor=4.0,
                                         original_max_position_embeddings=64,
                                         beta_fast=32.0, beta_slow=1.0)),
        router="sqrtsoftplus", indexer=True,
        tokens=96, greedy_prompt=20, seed=50, more_seeds=[150, 250]),
    # GLM-5.3-Flash (Glm5Next) shape, text only: KDA layers (packed q/k/v conv, safe gate) and
    # MLA without RoPE with the k-pool indexer (pools of 4, the top 2 pools + the tail), layer 2
    # reusing layer 1's selection; a dense first layer, then DeepSeek-V3's router; SwiGLU clamped
    # at 1 everywhere; 4 mHC streams, the mean as the head. A tiny vision tower rides along (atom
    # must skip it unread).
    dict(
        name="glm5_next",
        cls="Glm5NextConfig", model_cls="Glm5NextForConditionalGeneration",
        config=dict(
            text_config=dict(
                vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
                routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True,
                kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=0, qk_nope_head_dim=24,
                v_head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=512,
                layer_types=["linear_attention", "deepseek_sparse_attention",
                             "deepseek_sparse_attention", "linear_attention"],
                indexer_types=["full", "full", "shared", "full"],
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                index_topk=8, index_head_dim=16, index_n_heads=4, index_kpool=4,
                index_kpool_always_select_tail=True, swiglu_limit=1.0,
                linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
                linear_lower_bound=-5.0, hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20,
                pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False),
            vision_config=dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64,
                               intermediate_size=32, projection_intermediate_size=32)),
        router="sigmoid_grouped", indexer=True,
        tokens=96, greedy_prompt=20, seed=60, more_seeds=[160, 260]),
]


# FP8 checkpoints (issue 17), each as its real counterpart stores it: F8_E4M3 weights of the linear
# layers with their scales, the rest (embeddings, norms, routers, lm_head, excluded layers) in the
# save dtype. The references are transformers on the dequantised weights (fp32, saved, reloaded
# fresh), so the CPU parity bound is the usual one.
FP8_DEEPSEEK_V3 = dict(vocab_size=512, intermediate_size=256, moe_intermediate_size=32,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                       q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                       v_head_dim=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                       n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                       first_k_dense_replace=1, rope_interleave=True, max_position_embeddings=256,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters=dict(rope_type="default", rope_theta=10000.0))
FIXTURES += [
    # DeepSeek-V3 FP8 as deepseek-ai ships it: 128x128 blocks (weight_scale_inv F32), hidden 128,
    # the experts FP8 one by one, the router and lm_head unquantised.
    dict(
        name="deepseek_v3_fp8",
        cls="DeepseekV3Config",
        config=dict(FP8_DEEPSEEK_V3, hidden_size=128),
        router="sigmoid_grouped", experts="per_expert",
        fp8=dict(kind="block", block=[128, 128]),
        tokens=64, seed=21, more_seeds=[121, 221]),
    # Blocks of 48x48 over a hidden size of 112 and widths 40, 64, 96, ...: partial edge blocks
    # (ceil-sized scale grids) in both directions.
    dict(
        name="deepseek_v3_fp8_partial",
        cls="DeepseekV3Config",
        config=dict(FP8_DEEPSEEK_V3, hidden_size=112, moe_intermediate_size=40,
                    intermediate_size=200),
        router="sigmoid_grouped", experts="per_expert",
        fp8=dict(kind="block", block=[48, 48]),
        tokens=64, seed=22, more_seeds=[122, 222]),
    # Llama compressed-tensors FP8-dynamic (RedHatAI's recipe): per-channel weight_scale [N, 1]
    # BF16, per-token dynamic activations, lm_head and one excluded layer kept BF16.
    dict(
        name="llama_fp8_channel",
        cls="LlamaConfig",
        config=dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        fp8=dict(kind="compressed-tensors", strategy="channel", inputs="dynamic",
                 scale_dtype="bfloat16", ignore=["lm_head", "model.layers.1.mlp.down_proj"]),
        tokens=48, seed=23),
    # Qwen3 compressed-tensors FP8 with static activations: per-tensor weight_scale and
    # input_scale [1] F32.
    dict(
        name="qwen3_fp8_tensor",
        cls="Qwen3Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        fp8=dict(kind="compressed-tensors", strategy="tensor", inputs="static",
                 scale_dtype="float32", ignore=["lm_head"]),
        tokens=48, seed=24),
    # Llama as Meta's FP8 releases store it (fbgemm_fp8): per-channel weight_scale [N, 1] F32.
    dict(
        name="llama_fbgemm_fp8",
        cls="LlamaConfig",
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        fp8=dict(kind="fbgemm"),
        tokens=40, seed=25),
]

KIMI_LINEAR_CONFIG = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    mlp_layer_types=["dense", "sparse", "dense", "sparse"],
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
    num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.446, norm_topk_prob=True,
    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2)

FIXTURES += [
    # Qwen3-Next: Gated DeltaNet layers (grouped in_proj_qkvz / in_proj_ba, 2 key heads shared by
    # 4 value heads, dk 16 != dv 24, a 4-tap conv) around one gated full-attention layer (q_proj
    # with its sigmoid gate, partial RoPE on 8 of 32 channels, zero-centred RMSNorms); softmax
    # top-2 of 8 renormalised plus a sigmoid-gated shared expert, layer 1 dense; per-expert hub
    # names, two shards, and mtp.* tensors transformers ignores. 96 scored tokens cross the
    # 64-token chunk of transformers' chunked delta rule.
    dict(
        name="qwen3_next",
        cls="Qwen3NextConfig",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    layer_types=["linear_attention", "linear_attention", "full_attention",
                                 "linear_attention"],
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[1],
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         partial_rotary_factor=0.25)),
        router="softmax", experts="per_expert", shards=2, extra_mtp=True,
        tokens=96, greedy_prompt=20, seed=19),
    # Qwen3.5 dense (Qwen3_5ForConditionalGeneration): the language model under
    # model.language_model.*, a tiny vision tower under model.visual.* that a text-only load skips,
    # separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a with as many value as key heads,
    # tied embeddings, interleaved M-RoPE sections (plain partial RoPE for text).
    dict(
        name="qwen3_5",
        cls="Qwen3_5Config", model_cls="Qwen3_5ForConditionalGeneration",
        config=dict(
            text_config=dict(vocab_size=448, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=3,
                             layer_types=["linear_attention", "full_attention", "linear_attention"],
                             num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                             linear_num_key_heads=2, linear_num_value_heads=2,
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_conv_kernel_dim=4, max_position_embeddings=512,
                             rms_norm_eps=1e-6,
                             rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                  partial_rotary_factor=0.25,
                                                  mrope_section=[2, 1, 1],
                                                  mrope_interleaved=True)),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, num_position_embeddings=64, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2),
            tie_word_embeddings=True),
        tokens=96, greedy_prompt=20, seed=20),
    # Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration): every layer a softmax top-2 of 8
    # (always renormalised) with a sigmoid-gated shared expert, experts stacked as transformers
    # stores them (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]).
    dict(
        name="qwen3_5_moe",
        cls="Qwen3_5MoeConfig", model_cls="Qwen3_5MoeForConditionalGeneration",
        config=dict(
            text_config=dict(vocab_size=512, hidden_size=64, num_hidden_layers=3,
                             layer_types=["linear_attention", "linear_attention", "full_attention"],
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=32, shared_expert_intermediate_size=32,
                             max_position_embeddings=512, rms_norm_eps=1e-6,
                             rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                  partial_rotary_factor=0.25,
                                                  mrope_section=[1, 1, 0],
                                                  mrope_interleaved=True)),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, num_position_embeddings=64, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2),
            tie_word_embeddings=False),
        router="softmax", experts="stacked", extra_mtp=True,
        tokens=96, greedy_prompt=20, seed=21),
    # The same family with per-expert names (mlp.experts.J.gate_proj/up_proj/down_proj), two
    # shards, linear attention last.
    dict(
        name="qwen3_5_moe_per_expert",
        cls="Qwen3_5MoeConfig", model_cls="Qwen3_5MoeForConditionalGeneration",
        config=dict(
            text_config=dict(vocab_size=384, hidden_size=64, num_hidden_layers=3,
                             layer_types=["linear_attention", "full_attention", "linear_attention"],
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=32, shared_expert_intermediate_size=48,
                             max_position_embeddings=512, rms_norm_eps=1e-6,
                             rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                  partial_rotary_factor=0.25,
                                                  mrope_section=[1, 1, 0],
                                                  mrope_interleaved=True)),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, num_position_embeddings=64, patch_size=16,
                               spatial_merge_size=2, temporal_patch_size=2),
            tie_word_embeddings=False),
        router="softmax", experts="per_expert", shards=2,
        tokens=96, greedy_prompt=20, seed=22),
    # Kimi-Linear (KimiLinearForCausalLM): KDA layers (4 heads of 16, per-channel decay through
    # the low-rank f_a_proj / f_b_proj, 4-tap convs on q, k and v, the sigmoid-gated output norm)
    # around one MLA layer without RoPE (no q LoRA, qk_rope_head_dim 8 still split off and
    # shared); DeepSeek-V3's sigmoid router with a correction bias, top-2 of 8 renormalised and
    # scaled, one shared expert; mlp_layer_types mixes dense and sparse layers in an order
    # first_k_dense_replace cannot express. Saved in fp32. 96 scored tokens cross the 64-token
    # chunk of transformers' chunk_kimi_delta_attention.
    dict(
        name="kimi_linear",
        cls="KimiLinearConfig", model_cls="KimiLinearForCausalLM",
        config=KIMI_LINEAR_CONFIG,
        router="sigmoid_grouped", save_dtype="float32",
        tokens=96, greedy_prompt=20, seed=23, more_seeds=[123, 223]),
    # The same weights in Moonshot's own checkpoint layout (the hub's Kimi-Linear): the forget
    # gate's tensors directly under self_attn, q_conv1d / k_conv1d / v_conv1d apart, the MoE
    # block as block_sparse_moe with experts.J.w1/w3/w2.
    dict(
        name="kimi_linear_moonshot",
        cls="KimiLinearConfig", model_cls="KimiLinearForCausalLM",
        config=KIMI_LINEAR_CONFIG,
        router="sigmoid_grouped", save_dtype="float32", experts="moonshot",
        tokens=96, greedy_prompt=20, seed=23, more_seeds=[123, 223]),
]

GREEDY_PROMPT = 7
GREEDY_TOKENS = 16
MIN_MARGIN = 0.02
MIN_DISTINCT = 8
MAX_RUN = 3
MAX_SELF_ARGMAX = 0.1
ROUTER_MARGIN = 1e-3
INDEXER_MARGIN = 2e-4
ATTEMPTS = 60


class Rejected(Exception):
    pass


def scale_weights(model, seed, tied_embed_scale, experts_transposed=False):
    """Random weights that keep activations O(1) and logits spread over several units."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-1]
            if p.dim() == 3 and experts_transposed:  # GPT-OSS experts: x @ W, [E, in, out]
                fan_in = p.shape[1]
            if name.endswith("A_log"):
                # Linear-attention decay rates exp(A_log) in (0.02, 0.5): per-token decays from
                # about 0.99 to 0.7, so the state carries information across chunks.
                v = torch.log(0.02 + 0.48 * torch.rand(p.shape, generator=g))
            elif name.endswith("norm.weight"):
                v = 0.75 + 0.5 * torch.rand(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                # Tied: the embedding is also the LM head, and an O(1) embedding makes each row's
                # own input token its top logit.
                v = torch.randn(p.shape, generator=g) * tied_embed_scale
            elif name.startswith("lm_head"):
                v = 3.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            else:
                v = 1.2 * torch.randn(p.shape, generator=g) / math.sqrt(fan_in)
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("tid2eid"):  # DeepSeek-V4 hash routing: k distinct experts a token
                E = model.config.get_text_config().n_routed_experts
                b.copy_(torch.stack([torch.randperm(E, generator=g)[: b.shape[1]]
                                     for _ in range(b.shape[0])]))


def to_legacy(config_path):
    """Rewrites a transformers-v5 config.json into the layout older hub files use."""
    with open(config_path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    if rtype != "default":
        rp["type"] = rtype
        c["rope_scaling"] = rp
    else:
        c["rope_scaling"] = None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(config_path, "w") as f:
        json.dump(c, f, indent=2)


# ---- checkpoint layouts -------------------------------------------------------------------------

STACKED_GU = re.compile(r"^(.*\.experts)\.gate_up_proj$")
STACKED_D = re.compile(r"^(.*\.experts)\.down_proj$")
PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
HF_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def to_per_expert(sd):
    """Any expert layout -> model.layers.N.mlp.experts.J.{gate,up,down}_proj.weight."""
    out = {}
    for k, t in sd.items():
        m = STACKED_GU.match(k)
        if m:
            inter = t.shape[1] // 2
            for j in range(t.shape[0]):
                out[f"{m.group(1)}.{j}.gate_proj.weight"] = t[j, :inter].clone()
                out[f"{m.group(1)}.{j}.up_proj.weight"] = t[j, inter:].clone()
            continue
        m = STACKED_D.match(k)
        if m:
            for j in range(t.shape[0]):
                out[f"{m.group(1)}.{j}.down_proj.weight"] = t[j].clone()
            continue
        m = PER_EXPERT.match(k)
        if m:
            out[f"{m.group(1)}.{m.group(2)}.{HF_NAMES.get(m.group(3), m.group(3))}.weight"] = t
            continue
        out[k.replace(".block_sparse_moe.", ".mlp.")] = t
    return out


def to_stacked(sd):
    per = to_per_expert(sd)
    groups, out = {}, {}
    for k, t in per.items():
        m = PER_EXPERT.match(k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[k] = t
    for prefix, g in groups.items():
        n = 1 + max(j for j, _ in g)
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([g[(j, "gate_proj")], g[(j, "up_proj")]], 0) for j in range(n)]).contiguous()
        out[prefix + ".down_proj"] = torch.stack([g[(j, "down_proj")] for j in range(n)]).contiguous()
    return out


def to_mixtral(sd):
    out = {}
    for k, t in to_per_expert(sd).items():
        m = PER_EXPERT.match(k)
        if m:
            k = f"{m.group(1)}.{m.group(2)}.{MIXTRAL_NAMES[m.group(3)]}.weight"
        if ".mlp.gate." in k or ".mlp.experts." in k:
            k = k.replace(".mlp.", ".block_sparse_moe.")
        out[k] = t
    return out


def to_moonshot(sd):
    """Kimi-Linear in Moonshot's checkpoint layout: self_attn.forget_gate.* -> self_attn.*, the
    conv1d over [q | k | v] -> q_conv1d / k_conv1d / v_conv1d, the MoE block -> block_sparse_moe
    with experts.J.w1/w3/w2 (dense layers keep mlp.*)."""
    out = {}
    for k, t in to_per_expert(sd).items():
        m = PER_EXPERT.match(k)
        if m:
            k = f"{m.group(1)}.{m.group(2)}.{MIXTRAL_NAMES[m.group(3)]}.weight"
        for part in (".mlp.gate.", ".mlp.experts.", ".mlp.shared_experts."):
            if part in k:
                k = k.replace(".mlp.", ".block_sparse_moe.")
        k = k.replace(".self_attn.forget_gate.", ".self_attn.")
        if k.endswith(".self_attn.conv1d.weight"):
            for name, piece in zip("qkv", t.chunk(3, dim=0)):
                out[k.replace(".conv1d.", f".{name}_conv1d.")] = piece.clone()
            continue
        out[k] = t
    return out


def add_mtp_layers(sd, cfg, n, g):
    """Tensors of an MTP layer at index num_hidden_layers (GLM-4.5 layout), which transformers
    ignores and a plain load must skip."""
    H = cfg.hidden_size
    src = f"model.layers.{cfg.num_hidden_layers - 1}."
    for i in range(n):
        dst = f"model.layers.{cfg.num_hidden_layers + i}."
        for k in [k for k in sd if k.startswith(src)]:
            sd[dst + k[len(src):]] = sd[k].clone()
        dtype = sd["model.norm.weight"].dtype
        sd[dst + "enorm.weight"] = torch.ones(H, dtype=dtype)
        sd[dst + "hnorm.weight"] = torch.ones(H, dtype=dtype)
        sd[dst + "eh_proj.weight"] = (torch.randn(H, 2 * H, generator=g) / math.sqrt(2 * H)).to(dtype)
        sd[dst + "shared_head.norm.weight"] = torch.ones(H, dtype=dtype)
        sd[dst + "shared_head.head.weight"] = (
            torch.randn(cfg.vocab_size, H, generator=g) / math.sqrt(H)).to(dtype)


def add_mtp_tensors(sd, cfg, g):
    """Qwen3-Next / Qwen3.5 MTP tensors (mtp.*), which transformers ignores."""
    H = cfg.get_text_config().hidden_size
    dtype = next(iter(sd.values())).dtype
    sd["mtp.fc.weight"] = (torch.randn(H, 2 * H, generator=g) / math.sqrt(2 * H)).to(dtype)
    sd["mtp.norm.weight"] = torch.ones(H, dtype=dtype)
    sd["mtp.layers.0.input_layernorm.weight"] = torch.ones(H, dtype=dtype)


def write_checkpoint(out, sd, shards):
    for f in glob.glob(os.path.join(out, "*.safetensors")) + glob.glob(os.path.join(out, "*.index.json")):
        os.remove(f)
    sd = {k: v.contiguous() for k, v in sd.items()}
    if not shards or shards == 1:
        save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        return
    keys = sorted(sd)
    per = math.ceil(len(keys) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in keys[s * per:(s + 1) * per]}
        save_file(part, os.path.join(out, name), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def read_checkpoint(out):
    sd = {}
    for f in sorted(glob.glob(os.path.join(out, "*.safetensors"))):
        sd.update(load_file(f))
    return sd


# ---- MXFP4 -------------------------------------------------------------------------------------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_quantize(w):
    """w [..., K] (K % 32 == 0) -> blocks [..., K/32, 16] U8 (low nibble = even element), scales
    [..., K/32] U8 (e8m0, 2^(s-127)); each 32-value group scaled so its largest |x| fits 6."""
    *pre, K = w.shape
    grp = w.float().reshape(*pre, K // 32, 32)
    amax = grp.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -120)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    q = grp / torch.exp2(e)
    idx = (q.abs().unsqueeze(-1) - E2M1[:8]).abs().argmin(-1) + 8 * (q < 0).long()
    blocks = (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (e.squeeze(-1) + 127).to(torch.uint8)


def mxfp4_dequantize(blocks, scales):
    lo, hi = E2M1[(blocks & 0x0F).long()], E2M1[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], -1).flatten(-2)  # [..., K/32, 32]
    vals = vals * torch.exp2(scales.float() - 127).unsqueeze(-1)
    return vals.flatten(-2)


def quantize_gpt_oss_experts(model):
    """Replaces the model's expert weights by their MXFP4 round trip; returns the checkpoint
    tensors (blocks, scales) in OpenAI's layout, keyed by transformers' parameter names."""
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
                continue
            w = p.detach().float().cpu().transpose(1, 2)  # [E, out, in]
            blocks, scales = mxfp4_quantize(w)
            deq = mxfp4_dequantize(blocks, scales)
            p.copy_(deq.transpose(1, 2).to(p.dtype))
            out[name + "_blocks"] = blocks.contiguous()
            out[name + "_scales"] = scales.contiguous()
    return out


# ---- FP8 -----------------------------------------------------------------------------------------

FP8_MAX = 448.0
# Checkpoint names of the linear layers an FP8 checkpoint stores as FP8 (the routers, embeddings,
# norms and lm_head stay in the save dtype).
FP8_LINEAR = re.compile(r".*\.(q_proj|k_proj|v_proj|o_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|"
                        r"kv_b_proj|gate_proj|up_proj|down_proj)\.weight$")


def fp8_quantize(w, fp8):
    """w [N, K] -> (q float8_e4m3fn [N, K], scale as the checkpoint stores it): amax / 448 per
    block (partial edge blocks included), per row, or per tensor. The scale is rounded to its
    stored dtype first, so that q * scale is exactly what the checkpoint says."""
    w = w.float()
    N, K = w.shape
    if fp8["kind"] == "block":
        bn, bk = fp8["block"]
        R, C = -(-N // bn), -(-K // bk)
        pad = torch.zeros(R * bn, C * bk)
        pad[:N, :K] = w
        amax = pad.reshape(R, bn, C, bk).abs().amax(dim=(1, 3))
        scale = (amax / FP8_MAX).clamp(min=1e-12)
        full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:N, :K]
    elif fp8.get("strategy", "channel") == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        scale = scale.to(getattr(torch, fp8.get("scale_dtype", "float32")))
        full = scale.float().expand(N, K)
    else:
        scale = (w.abs().amax().reshape(1) / FP8_MAX).clamp(min=1e-12)
        scale = scale.to(getattr(torch, fp8.get("scale_dtype", "float32")))
        full = scale.float().expand(N, K)
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_dequantize(q, scale, fp8):
    N, K = q.shape
    s = scale.float()
    if fp8["kind"] == "block":
        bn, bk = fp8["block"]
        s = s.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:N, :K]
    else:
        s = s.reshape(-1, 1) if s.numel() > 1 else s.reshape(1, 1)
    return q.float() * s


def fp8_excluded(name, fp8):
    module = name[: -len(".weight")]
    return any(module == m or module.startswith(m + ".") for m in fp8.get("ignore", ["lm_head"]))


def fp8_quantize_checkpoint(sd, fp8, g):
    """The checkpoint tensors of an FP8 release (quantised linear weights with their scales), and
    the same tensors with each quantised weight dequantised to fp32 (for the reference)."""
    quant, deq = {}, {}
    for k, t in sd.items():
        if not FP8_LINEAR.match(k) or t.dim() != 2 or fp8_excluded(k, fp8):
            quant[k] = t
            deq[k] = t
            continue
        q, scale = fp8_quantize(t, fp8)
        base = k[: -len(".weight")]
        quant[k] = q
        quant[base + (".weight_scale_inv" if fp8["kind"] == "block" else ".weight_scale")] = scale
        if fp8.get("inputs") == "static":  # a calibration's amax / 448 (unused by the reference)
            quant[base + ".input_scale"] = (torch.rand(1, generator=g) * 4 + 2) / FP8_MAX
        deq[k] = fp8_dequantize(q, scale, fp8)
    return quant, deq


def fp8_quantization_config(fp8):
    """quantization_config as the real checkpoints spell it."""
    if fp8["kind"] == "block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": list(fp8["block"])}
    if fp8["kind"] == "fbgemm":
        return {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                "modules_to_not_convert": fp8.get("ignore", ["lm_head"])}
    args = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
            "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
    weights = dict(args, strategy=fp8["strategy"], dynamic=False)
    inputs = None
    if fp8["inputs"] == "dynamic":
        inputs = dict(args, strategy="token", dynamic=True, observer=None)
    elif fp8["inputs"] == "static":
        inputs = dict(args, strategy="tensor", dynamic=False)
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None,
            "kv_cache_scheme": None, "ignore": fp8.get("ignore", ["lm_head"]),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs,
                                          "output_activations": None}}}


def check_fp8_weights(ref, model):
    """The reference holds the dequantised weights: each equal to the built model's or within
    FP8's rounding of it (3 mantissa bits), and some of them changed."""
    want = {k: v.float().cpu() for k, v in model.state_dict().items()}
    got = {k: v.float().cpu() for k, v in ref.state_dict().items()}
    changed, bad = 0, []
    for k in want:
        if k not in got:
            bad.append(k)
        elif not torch.equal(want[k], got[k]):
            changed += 1
            # Relative 2^-4, plus the subnormal step of a block whose largest value is the
            # tensor's (amax / 448 * 2^-9).
            err = (want[k] - got[k]).abs() - (want[k].abs() / 16 + float(want[k].abs().max()) * 2.0 ** -17)
            if float(err.max()) > 0:
                bad.append(k)
    if bad or changed == 0:
        raise Rejected(f"the dequantised reference lost or misplaced weights {bad[:6]} "
                       f"({changed} changed)")


# ---- checks -------------------------------------------------------------------------------------

class RouterWatch:
    """Records, for every MoE block call, how close each token's expert choice came to a tie."""

    def __init__(self, model, kind, cfg):
        self.kind, self.cfg, self.min_margin, self.blocks = kind, cfg, float("inf"), 0
        for _, mod in model.named_modules():
            gate = getattr(mod, "gate", None) or getattr(mod, "router", None)
            if getattr(mod, "experts", None) is not None and gate is not None and hasattr(gate, "weight"):
                mod.register_forward_pre_hook(self.hook)
                self.blocks += 1

    def hook(self, mod, args):
        gate = getattr(mod, "gate", None) or getattr(mod, "router")
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        logits = x @ gate.weight.float().t()
        if getattr(gate, "bias", None) is not None:
            logits = logits + gate.bias.float()
        self.min_margin = min(self.min_margin, self.margin(gate, logits))

    def margin(self, gate, logits):
        c = self.cfg
        k = c.num_experts_per_tok
        if self.kind in ("softmax", "topk_softmax"):  # monotone in the logits: k-th / (k+1)-th gap
            top = torch.topk(logits, k + 1, dim=-1).values
            return float((top[:, k - 1] - top[:, k]).min())
        if self.kind == "softmax_group_max":
            # DeepSeek-V2's group_limited_greedy: groups ranked by their best softmax score, the
            # experts of the kept groups by theirs; softmax is monotone within a row, so both
            # choices are compared in logits.
            E, G, keep = logits.shape[-1], c.n_group, c.topk_group
            gs = logits.view(-1, G, E // G).max(dim=-1).values
            top = torch.topk(gs, keep + 1, dim=-1)
            m = float((top.values[:, keep - 1] - top.values[:, keep]).min())
            mask = torch.zeros_like(gs).scatter_(1, top.indices[:, :keep], 1.0)
            s = logits.masked_fill(~mask.bool().repeat_interleave(E // G, 1), float("-inf"))
            top = torch.topk(s, k + 1, dim=-1).values
            return min(m, float((top[:, k - 1] - top[:, k]).min()))
        if self.kind == "sqrtsoftplus":  # DeepSeek-V4: no groups; hash layers choose by table
            if hasattr(gate, "tid2eid"):
                return float("inf")
            s = torch.sqrt(torch.nn.functional.softplus(logits)) + gate.e_score_correction_bias.float()
            top = torch.topk(s, k + 1, dim=-1).values
            return float((top[:, k - 1] - top[:, k]).min())
        s = torch.sigmoid(logits) + gate.e_score_correction_bias.float()
        E, G, keep = s.shape[-1], c.n_group, c.topk_group
        m = float("inf")
        if G > 1:  # as transformers 5.17: experts of dropped groups score -inf
            gs = s.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
            top = torch.topk(gs, keep + 1, dim=-1)
            m = float((top.values[:, keep - 1] - top.values[:, keep]).min())
            mask = torch.zeros_like(gs).scatter_(1, top.indices[:, :keep], 1.0)
            s = s.masked_fill(~mask.bool().repeat_interleave(E // G, 1), float("-inf"))
        top = torch.topk(s, k + 1, dim=-1).values
        return min(m, float((top[:, k - 1] - top[:, k]).min()))


class IndexerWatch:
    """Records how close each sparse-attention indexer's top-k choice came to a tie: for every
    query with more visible keys than index_topk, the gap between its k-th and (k+1)-th index
    score (as transformers computed them: the indexer's one topk call is observed)."""

    def __init__(self, model):
        self.min_margin, self.blocks = float("inf"), 0
        for _, mod in model.named_modules():
            # DeepSeek-V3.2 / GLM-5 indexers own weights_proj; DeepSeek-V4's has it in a scorer.
            if (hasattr(mod, "weights_proj") or hasattr(mod, "scorer")) and hasattr(mod, "index_topk"):
                mod.forward = types.MethodType(self.wrap(type(mod).forward), mod)
                self.blocks += 1

    def wrap(self, forward):
        watch = self

        def observed(mod, *args, **kwargs):
            seen = []
            orig = torch.Tensor.topk

            def topk(t, *a, **kw):
                seen.append(t)
                return orig(t, *a, **kw)

            torch.Tensor.topk = topk
            try:
                out = forward(mod, *args, **kwargs)
            finally:
                torch.Tensor.topk = orig
            if len(seen) != 1:
                raise Rejected(f"indexer made {len(seen)} topk calls, expected 1")
            # GLM-5.3's k-pool indexer picks index_topk / index_kpool pools.
            watch.observe(seen[0], mod.index_topk // getattr(mod, "index_kpool", 1))
            return out

        return observed

    def observe(self, scores, k):
        s = scores.reshape(-1, scores.shape[-1]).float()
        for row in s:
            valid = row[row > -1e30]
            if valid.numel() <= k:
                continue
            top = torch.topk(valid, k + 1).values
            self.min_margin = min(self.min_margin, float(top[k - 1] - top[k]))


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], device=DEVICE))
    return out.logits[0].float().cpu()


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        last = logits_of(model, ids)[-1]
        top = torch.topk(last, 2)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def longest_run(tokens):
    best = run = 1
    for a, b in zip(tokens, tokens[1:]):
        run = run + 1 if a == b else 1
        best = max(best, run)
    return best


def self_argmax_fraction(logits, ids):
    return float((logits.argmax(-1) == torch.tensor(ids)).float().mean())


def check_weights(ref, model):
    """The reloaded model holds exactly the weights the built one had (after the save dtype)."""
    want = {k: v.float().cpu() for k, v in model.state_dict().items()}
    got = {k: v.float().cpu() for k, v in ref.state_dict().items()}
    bad = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    if bad:
        raise Rejected(f"reload lost or changed {len(bad)} weight(s): {bad[:6]}")


def save_reference(path, ids, logits, prompt, gen, margins, metadata):
    """A fixture's references: the logits of ids, and the greedy tokens of prompt with their
    top-1/top-2 margins; metadata beside the run's own (torch, device, fp32, TF32 off)."""
    save_file({
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "logits": logits.contiguous(),
        "greedy_prompt": torch.tensor(prompt, dtype=torch.int64),
        "greedy_tokens": torch.tensor(gen, dtype=torch.int64),
        "greedy_margins": torch.tensor(margins, dtype=torch.float32),
    }, path, metadata={
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "compute_dtype": "float32", "tf32": "off", "tool": "tools/make_fixtures.py", **metadata})


def build(fx, out_root):
    out = os.path.join(out_root, "models", fx["name"])
    ref_root = os.path.join(out_root, "references")
    os.makedirs(ref_root, exist_ok=True)
    tied = fx["config"].get("tie_word_embeddings", False)
    last_error = None
    # Weights drawn from further seeds when the fixture names some (after every embedding scale).
    for seed in [fx["seed"]] + fx.get("more_seeds", []):
        for embed_scale in ([0.5, 0.35, 0.25] if tied else [1.0]):
            try:
                return build_once(dict(fx, seed=seed), out, ref_root, embed_scale)
            except Rejected as e:
                last_error = e
                print(f"{fx['name']}: rejected with seed {seed}, embedding scale {embed_scale}: {e}")
    shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"{fx['name']}: {last_error}")


def build_once(fx, out, ref_root, embed_scale):
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(fx["seed"])
    cfg = getattr(transformers, fx["cls"])(**fx["config"])
    model_cls = getattr(transformers, fx["model_cls"]) if "model_cls" in fx else None
    if model_cls:
        model = model_cls._from_config(cfg, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    loader_cls = model_cls or transformers.AutoModelForCausalLM
    scale_weights(model, fx["seed"], embed_scale, fx.get("experts_transposed", False))
    save_dtype = getattr(torch, fx.get("save_dtype", "bfloat16"))
    model = model.to(save_dtype)
    quantized = quantize_gpt_oss_experts(model) if fx.get("quantize") == "mxfp4" else {}
    model.save_pretrained(out)
    saved = read_checkpoint(out)
    for name in quantized:  # the dense expert tensors give way to blocks and scales
        saved.pop(name[: -len("_blocks")] if name.endswith("_blocks") else name[: -len("_scales")], None)
    saved.update(quantized)
    if quantized:
        cpath = os.path.join(out, "config.json")
        with open(cpath) as f:
            c = json.load(f)
        c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
        with open(cpath, "w") as f:
            json.dump(c, f, indent=2)
    layout = fx.get("experts")
    convert = {None: lambda sd: sd, "per_expert": to_per_expert, "stacked": to_stacked,
               "mixtral": to_mixtral, "moonshot": to_moonshot}[layout]
    if fx.get("mtp_layers"):
        add_mtp_layers(saved, cfg, fx["mtp_layers"], torch.Generator().manual_seed(fx["seed"]))
    if fx.get("extra_mtp"):
        add_mtp_tensors(saved, cfg, torch.Generator().manual_seed(fx["seed"]))
    fp8 = fx.get("fp8")
    ref_dir = None
    if fp8:
        # atom's folder holds the FP8 checkpoint; transformers reads the dequantised weights
        # (fp32) from a folder beside it, in the same layout, without quantization_config.
        qsd, dsd = fp8_quantize_checkpoint(convert(saved), fp8, torch.Generator().manual_seed(fx["seed"]))
        ref_dir = out + ".dequantized"
        shutil.rmtree(ref_dir, ignore_errors=True)
        shutil.copytree(out, ref_dir)
        write_checkpoint(ref_dir, dsd, None)
        write_checkpoint(out, qsd, fx.get("shards"))
        cpath = os.path.join(out, "config.json")
        with open(cpath) as f:
            c = json.load(f)
        c["quantization_config"] = fp8_quantization_config(fp8)
        with open(cpath, "w") as f:
            json.dump(c, f, indent=2)
    else:
        write_checkpoint(out, convert(saved), fx.get("shards"))
    if "generation_config" in fx:
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump(fx["generation_config"], f, indent=2)
    if fx.get("legacy_config"):
        to_legacy(os.path.join(out, "config.json"))

    read_layout = layout
    load_kw = {}
    if quantized:  # transformers' own MXFP4 dequantisation (convert_moe_packed_tensors)
        load_kw["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    try:
        ref = loader_cls.from_pretrained(
            ref_dir or out, dtype=torch.float32, attn_implementation="eager", **load_kw).to(DEVICE).eval()
        ref = ref.float()
        (check_fp8_weights if fp8 else check_weights)(ref, model)
        if ref_dir:
            shutil.rmtree(ref_dir)
    except Rejected as e:
        if layout is None or fp8:
            raise
        # This transformers does not read the layout atom's folder keeps: it computes the
        # references from the same weights in another layout (the per-expert names for stacked
        # experts, as transformers saved them otherwise), and atom's folder keeps this one.
        other = to_per_expert if layout == "stacked" and not fx.get("model_cls") else (lambda sd: sd)
        read_layout = "per_expert" if other is to_per_expert else "as saved by transformers"
        print(f"{fx['name']}: transformers did not read the {layout} layout ({e}); "
              f"references from the layout {read_layout}")
        write_checkpoint(out, other(saved), fx.get("shards"))
        ref = loader_cls.from_pretrained(
            out, dtype=torch.float32, attn_implementation="eager").to(DEVICE).eval()
        check_weights(ref, model)
        write_checkpoint(out, convert(saved), fx.get("shards"))
    watch = RouterWatch(ref, fx["router"], ref.config.get_text_config()) if fx.get("router") else None
    if watch and watch.blocks == 0:
        raise Rejected("no MoE block found to watch")
    iwatch = IndexerWatch(ref) if fx.get("indexer") else None
    if iwatch and iwatch.blocks == 0:
        raise Rejected("no indexer found to watch")
    V = cfg.get_text_config().vocab_size
    g = torch.Generator().manual_seed(1000 + fx["seed"])
    best = [0.0, 0.0]  # the best router and indexer margins of the rejected attempts
    for attempt in range(ATTEMPTS):
        ids = torch.randint(3, V, (fx["tokens"],), generator=g).tolist()
        if watch:
            watch.min_margin = float("inf")
        if iwatch:
            iwatch.min_margin = float("inf")
        logits = logits_of(ref, ids)
        if watch:
            best[0] = max(best[0], watch.min_margin)
        if iwatch:
            best[1] = max(best[1], iwatch.min_margin)
        if watch and watch.min_margin < ROUTER_MARGIN:
            continue
        if iwatch and iwatch.min_margin < INDEXER_MARGIN:
            continue
        break
    else:
        raise Rejected(f"no token ids with router margins >= {ROUTER_MARGIN} and indexer margins "
                       f">= {INDEXER_MARGIN} (best seen: {best[0]:.2e}, {best[1]:.2e})")
    ids_indexer_margin = iwatch.min_margin if iwatch else None
    self_frac = self_argmax_fraction(logits, ids)
    if self_frac > MAX_SELF_ARGMAX:
        raise Rejected(f"{self_frac:.0%} of rows have their input token as top logit")
    for attempt in range(ATTEMPTS):
        prompt = torch.randint(3, V, (fx.get("greedy_prompt", GREEDY_PROMPT),), generator=g).tolist()
        if watch:
            watch.min_margin = float("inf")
        if iwatch:
            iwatch.min_margin = float("inf")
        gen, margins = greedy(ref, prompt, GREEDY_TOKENS)
        if min(margins) < MIN_MARGIN or len(set(gen)) < MIN_DISTINCT or longest_run(gen) > MAX_RUN:
            continue
        if watch and watch.min_margin < ROUTER_MARGIN:
            continue
        if iwatch and iwatch.min_margin < INDEXER_MARGIN:
            continue
        break
    else:
        raise Rejected(f"no greedy prompt with margins >= {MIN_MARGIN}, >= {MIN_DISTINCT} distinct "
                       f"tokens, runs <= {MAX_RUN}, router margins >= {ROUTER_MARGIN} and indexer "
                       f"margins >= {INDEXER_MARGIN}")
    save_reference(os.path.join(ref_root, fx["name"] + ".safetensors"), ids, logits, prompt, gen,
                   margins, {
        "transformers": transformers.__version__, "attn_implementation": "eager",
        "transformers_read_layout": str(read_layout),
        **({"fp8": json.dumps(fx["fp8"]), "reference_weights": "dequantized FP8, float32"} if fx.get("fp8") else {})})
    std = float(logits.std())
    files = sorted(os.listdir(out))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
    size += os.path.getsize(os.path.join(ref_root, fx["name"] + ".safetensors"))
    router = f", min router margin {watch.min_margin:.2e}" if watch else ""
    if iwatch:
        router += (f", min indexer margin {ids_indexer_margin:.2e} (logits) "
                   f"{iwatch.min_margin:.2e} (greedy)")
    print(f"{fx['name']}: {files} {size/1e6:.2f} MB, logits std {std:.2f}, "
          f"self-argmax rows {self_frac:.0%}, greedy {gen}, distinct {len(set(gen))}, "
          f"min greedy margin {min(margins):.3f}{router}, embedding scale {embed_scale}")


# ---- MTP drafters ------------------------------------------------------------------------------
# transformers does not run MTP layers, so the drafter's forward is written here from its
# definition (the spec's DeepSeekMTP: enorm, hnorm, eh_proj over concat(enorm(emb), hnorm(h)),
# a decoder block, then SharedHead: the norm at the end of the layer's forward, a bare head), with
# transformers' own decoder layer as the block. The target comes from an existing fixture; the MTP
# layer gets weights of its own (the block perturbed away from the last target layer's, norms away
# from one, so swapped or misrouted tensors change the result).

MTP_FIXTURES = [
    dict(name="deepseek_v3_mtp", target="deepseek_v3", shards=3, tokens=40, draft_steps=4,
         seed=40),
]


def rms_norm_module(H, eps, g):
    n = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3RMSNorm(H, eps=eps)
    with torch.no_grad():
        n.weight.copy_(1.0 + 0.3 * torch.randn(H, generator=g))
    return n


@torch.no_grad()
def build_mtp(fx, out_root):
    import copy
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "models", fx["target"])
    out = os.path.join(out_root, "models", fx["name"])
    ref_root = os.path.join(out_root, "references")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    os.makedirs(ref_root, exist_ok=True)
    for f in ["config.json", "generation_config.json"]:
        shutil.copy(os.path.join(src, f), out)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager").to(DEVICE).eval().float()
    cfg = ref.config
    L, H, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    g = torch.Generator().manual_seed(fx["seed"])
    # The MTP layer: the last target layer's block, perturbed; norms, eh_proj and head its own.
    block = copy.deepcopy(ref.model.layers[L - 1]).cpu()
    for name, p in block.named_parameters():
        noise = torch.randn(p.shape, generator=g) * (p.float().std() if p.numel() > 1 else 0.1)
        p.add_(0.5 * noise.to(p.dtype))
    enorm, hnorm, head_norm = (rms_norm_module(H, cfg.rms_norm_eps, g) for _ in range(3))
    eh_proj = torch.nn.Linear(2 * H, H, bias=False)
    eh_proj.weight.copy_(torch.randn(H, 2 * H, generator=g) / math.sqrt(2 * H))
    head = torch.nn.Linear(H, V, bias=False)
    head.weight.copy_(torch.randn(V, H, generator=g) * (3.0 / math.sqrt(H)))
    mods = {"mtp_block": block, "enorm": enorm, "hnorm": hnorm, "shared_head.norm": head_norm,
            "eh_proj": eh_proj, "shared_head.head": head}
    for m in mods.values():  # the weights atom reads are the bf16 ones saved
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        m.to(DEVICE).eval()
    # Checkpoint: the target's tensors (minus any MTP layer it had) plus this layer, as the
    # DeepSeek-V3 hub checkpoints spell it (block tensors directly under model.layers.L).
    sd = {k: v for k, v in read_checkpoint(src).items() if not k.startswith(f"model.layers.{L}.")}
    mtp = {}
    for prefix, m in mods.items():
        for k, v in m.state_dict().items():
            name = k if prefix == "mtp_block" else f"{prefix}.{k}"
            mtp[f"model.layers.{L}.{name}"] = v.detach().cpu().to(torch.bfloat16)
    sd.update(to_per_expert(mtp))
    write_checkpoint(out, sd, fx["shards"])

    def draft(tokens, hidden, positions):
        """The MTP layer over rows (token t_i, hidden h_i) at positions p_i, causally: the
        drafter's post-norm hidden states and logits."""
        e = enorm(ref.model.embed_tokens(tokens))
        x = eh_proj(torch.cat([e, hnorm(hidden)], dim=-1))[None]
        pos = positions[None]
        cos_sin = ref.model.rotary_emb(x, pos)
        n = x.shape[1]
        mask = torch.full((n, n), float("-inf"), device=DEVICE).triu(1)[None, None]
        y = block(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        y = y[0] if isinstance(y, tuple) else y
        y = head_norm(y[0])
        return y, head(y).float()

    T = fx["tokens"]
    best = None
    for attempt in range(ATTEMPTS):
        ids = torch.randint(3, V, (T,), generator=g).tolist()
        t_ids = torch.tensor([ids], device=DEVICE)
        hidden = ref.model(input_ids=t_ids).last_hidden_state[0]  # post final norm
        target_next = int(ref.lm_head(hidden[-1]).argmax())
        # Step 0 over the prompt: row i is (token i + 1, target hidden i) at position i, the last
        # row's token the target's next one.
        tokens = torch.tensor(ids[1:] + [target_next], device=DEVICE)
        hid = hidden
        positions = torch.arange(T, device=DEVICE)
        y, logits = draft(tokens, hid, positions)
        prefill_logits = logits
        drafts, step_logits, margins = [], [], []
        top = torch.topk(logits[-1], 2).values
        margins.append(float(top[0] - top[1]))
        drafts.append(int(logits[-1].argmax()))
        # Steps >= 1: one more row each, (the last draft, the drafter's own post-norm hidden).
        for k in range(1, fx["draft_steps"]):
            tokens = torch.cat([tokens, torch.tensor([drafts[-1]], device=DEVICE)])
            hid = torch.cat([hid, y[-1:]])
            positions = torch.arange(T + k, device=DEVICE)
            y, logits = draft(tokens, hid, positions)
            step_logits.append(logits[-1])
            top = torch.topk(logits[-1], 2).values
            margins.append(float(top[0] - top[1]))
            drafts.append(int(logits[-1].argmax()))
        rows_top = torch.topk(prefill_logits, 2, dim=-1).values
        row_margin = float((rows_top[:, 0] - rows_top[:, 1]).min())
        if min(margins) >= MIN_MARGIN and len(set(drafts)) > 1:
            best = (ids, target_next, prefill_logits, drafts, step_logits, margins, row_margin)
            break
    if best is None:
        raise SystemExit(f"{fx['name']}: no prompt with draft margins >= {MIN_MARGIN}")
    ids, target_next, prefill_logits, drafts, step_logits, margins, row_margin = best
    save_file({
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "target_next": torch.tensor([target_next], dtype=torch.int64),
        "draft_prefill_logits": prefill_logits.cpu().contiguous(),
        "draft_tokens": torch.tensor(drafts, dtype=torch.int64),
        "draft_step_logits": torch.stack(step_logits).cpu().contiguous(),
        "draft_margins": torch.tensor(margins, dtype=torch.float32),
    }, os.path.join(ref_root, fx["name"] + ".safetensors"), metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "attn_implementation": "eager", "compute_dtype": "float32", "tf32": "off",
        "tool": "tools/make_fixtures.py (build_mtp)", "target": fx["target"]})
    print(f"{fx['name']}: {sorted(os.listdir(out))}, drafts {drafts}, margins "
          f"{[round(m, 3) for m in margins]}, min prefill row margin {row_margin:.3f}, "
          f"logits std {float(prefill_logits.std()):.2f}")


# Qwen3-Next / Qwen3.5 MTP (the spec's Qwen3NextMTP and Qwen3_5MTP, as vLLM wires them): the
# checkpoint's mtp.* tensors, read with "mtp." -> "model.":
#   x = fc(concat(pre_fc_norm_embedding(embed_tokens(token)), pre_fc_norm_hidden(hidden)))
#   y = norm(layers[k % n](x))          a full-attention decoder layer, whatever layer_types says
#   logits = lm_head(y)                 the target's lm_head (and embed_tokens), shared
# Every norm is the family's zero-centred RMSNorm. The block is transformers' own decoder layer:
# the target's full-attention layer, perturbed. As for DeepSeekMTP, step 0 reads the target's
# hidden state after its final norm and steps >= 1 the drafter's own normed output.
QWEN_MTP_FIXTURES = [
    dict(name="qwen3_next_mtp", target="qwen3_next", full_layer=2, layout="per_expert", shards=3,
         tokens=40, draft_steps=4, seed=50, router="softmax"),
    dict(name="qwen3_5_mtp", target="qwen3_5", model_cls="Qwen3_5ForConditionalGeneration",
         full_layer=1, layout=None, shards=3, tokens=40, draft_steps=4, seed=51,
         mtp_num_hidden_layers=1),
    dict(name="qwen3_5_moe_mtp", target="qwen3_5_moe", model_cls="Qwen3_5MoeForConditionalGeneration",
         full_layer=2, layout="stacked", shards=3, tokens=40, draft_steps=4, seed=52,
         router="softmax", mtp_num_hidden_layers=1),
]


@torch.no_grad()
def build_qwen_mtp(fx, out_root):
    import copy
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "models", fx["target"])
    out = os.path.join(out_root, "models", fx["name"])
    ref_root = os.path.join(out_root, "references")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    os.makedirs(ref_root, exist_ok=True)
    for f in ["config.json", "generation_config.json"]:
        shutil.copy(os.path.join(src, f), out)
    if fx.get("mtp_num_hidden_layers"):
        cpath = os.path.join(out, "config.json")
        with open(cpath) as f:
            c = json.load(f)
        (c["text_config"] if "text_config" in c else c)["mtp_num_hidden_layers"] = fx["mtp_num_hidden_layers"]
        with open(cpath, "w") as f:
            json.dump(c, f, indent=2)
    loader_cls = getattr(transformers, fx["model_cls"]) if "model_cls" in fx else transformers.AutoModelForCausalLM
    src_model = loader_cls.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    tcfg = src_model.config.get_text_config()
    lm = src_model.model.language_model if hasattr(src_model.model, "language_model") else src_model.model
    H = tcfg.hidden_size
    g = torch.Generator().manual_seed(fx["seed"])
    block = copy.deepcopy(lm.layers[fx["full_layer"]])
    assert getattr(block, "layer_type", "full_attention") == "full_attention", block.layer_type
    for name, p in block.named_parameters():
        noise = torch.randn(p.shape, generator=g) * (p.float().std() if p.numel() > 1 else 0.1)
        p.add_(0.5 * noise.to(p.dtype))
    norm_cls = type(block.input_layernorm)  # the family's zero-centred RMSNorm

    def zc_norm():
        n = norm_cls(H, eps=tcfg.rms_norm_eps)
        n.weight.copy_(0.3 * torch.randn(H, generator=g))  # scale 1 + w
        return n
    fc = torch.nn.Linear(2 * H, H, bias=False)
    fc.weight.copy_(torch.randn(H, 2 * H, generator=g) * (1.2 / math.sqrt(2 * H)))
    mods = {"layers.0": block, "pre_fc_norm_embedding": zc_norm(), "pre_fc_norm_hidden": zc_norm(),
            "fc": fc, "norm": zc_norm()}
    convert = {None: lambda sd: sd, "per_expert": to_per_expert, "stacked": to_stacked}[fx["layout"]]
    mtp = {}
    for prefix, m in mods.items():
        for k, v in m.state_dict().items():
            mtp[f"mtp.{prefix}.{k}"] = v.detach().cpu().to(torch.bfloat16)
    sd = {k: v for k, v in read_checkpoint(src).items() if not k.startswith("mtp.")}
    sd.update(convert(mtp))
    write_checkpoint(out, sd, fx["shards"])
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    shards = set(wm.values())
    with_mtp = {s for k, s in wm.items() if k.startswith("mtp.")}
    assert len(shards - with_mtp) >= 1, f"every shard holds an MTP tensor: {sorted(with_mtp)}"

    # Fresh from the saved folder in fp32: the target (transformers ignores mtp.*), and the MTP
    # modules from the saved mtp.* tensors in transformers' layout (strict: every tensor named).
    ref = loader_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").to(DEVICE).eval().float()
    lm = ref.model.language_model if hasattr(ref.model, "language_model") else ref.model
    saved = {k: v for k, v in read_checkpoint(out).items() if k.startswith("mtp.")}
    fresh = {}
    for prefix, m in mods.items():
        fm = copy.deepcopy(m)
        want = set(fm.state_dict())
        part = {k[len(f"mtp.{prefix}."):]: v for k, v in saved.items() if k.startswith(f"mtp.{prefix}.")}
        if want != set(part):  # the saved layout is not transformers': back to stacked experts
            part = to_stacked(part)
        fm.load_state_dict({k: v.float() for k, v in part.items()}, strict=True)
        for k, v in m.state_dict().items():  # the saved weights are the bf16 of the built ones
            assert torch.equal(fm.state_dict()[k], v.to(torch.bfloat16).float()), f"{prefix}.{k}"
        fresh[prefix] = fm.to(DEVICE).eval().float()
    block, fc = fresh["layers.0"], fresh["fc"]
    e_norm, h_norm, f_norm = fresh["pre_fc_norm_embedding"], fresh["pre_fc_norm_hidden"], fresh["norm"]
    # Routers near a tie, in the MTP layer and in the target (whose hidden states it reads).
    watch = RouterWatch(block, fx["router"], tcfg) if fx.get("router") else None
    twatch = RouterWatch(ref, fx["router"], tcfg) if fx.get("router") else None
    if watch is not None and (watch.blocks == 0 or twatch.blocks == 0):
        raise Rejected("no MoE block in the MTP layer or the target to watch")

    def draft(tokens, hidden, positions):
        e = e_norm(lm.embed_tokens(tokens))
        x = fc(torch.cat([e, h_norm(hidden)], dim=-1))[None]
        pos = positions[None]
        # Qwen3.5's M-RoPE takes (3, batch, n) position streams, all equal for text.
        mrope = hasattr(lm.rotary_emb, "mrope_section")
        cos_sin = lm.rotary_emb(x, pos[None].expand(3, 1, -1) if mrope else pos)
        n = x.shape[1]
        mask = torch.full((n, n), float("-inf"), device=DEVICE).triu(1)[None, None]
        y = block(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        y = y[0] if isinstance(y, tuple) else y
        y = f_norm(y[0])
        return y, ref.lm_head(y).float()

    T, V = fx["tokens"], tcfg.vocab_size
    best = None
    for attempt in range(ATTEMPTS):
        if watch is not None:
            watch.min_margin = twatch.min_margin = float("inf")
        ids = torch.randint(3, V, (T,), generator=g).tolist()
        t_ids = torch.tensor([ids], device=DEVICE)
        hidden = ref.model(input_ids=t_ids).last_hidden_state[0]  # after the final norm
        target_logits = ref.lm_head(hidden[-1])
        target_next = int(target_logits.argmax())
        top = torch.topk(target_logits, 2).values
        target_margin = float(top[0] - top[1])
        tokens = torch.tensor(ids[1:] + [target_next], device=DEVICE)
        hid = hidden
        y, logits = draft(tokens, hid, torch.arange(T, device=DEVICE))
        prefill_logits = logits
        drafts, step_logits, margins = [int(logits[-1].argmax())], [], []
        top = torch.topk(logits[-1], 2).values
        margins.append(float(top[0] - top[1]))
        for k in range(1, fx["draft_steps"]):
            tokens = torch.cat([tokens, torch.tensor([drafts[-1]], device=DEVICE)])
            hid = torch.cat([hid, y[-1:]])
            y, logits = draft(tokens, hid, torch.arange(T + k, device=DEVICE))
            step_logits.append(logits[-1])
            top = torch.topk(logits[-1], 2).values
            margins.append(float(top[0] - top[1]))
            drafts.append(int(logits[-1].argmax()))
        router_ok = watch is None or min(watch.min_margin, twatch.min_margin) >= ROUTER_MARGIN
        if min(margins) >= MIN_MARGIN and target_margin >= MIN_MARGIN and len(set(drafts)) > 1 and router_ok:
            best = (ids, target_next, prefill_logits, drafts, step_logits, margins)
            break
    if best is None:
        raise SystemExit(f"{fx['name']}: no prompt with draft margins >= {MIN_MARGIN}")
    ids, target_next, prefill_logits, drafts, step_logits, margins = best
    save_file({
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "target_next": torch.tensor([target_next], dtype=torch.int64),
        "draft_prefill_logits": prefill_logits.cpu().contiguous(),
        "draft_tokens": torch.tensor(drafts, dtype=torch.int64),
        "draft_step_logits": torch.stack(step_logits).cpu().contiguous(),
        "draft_margins": torch.tensor(margins, dtype=torch.float32),
    }, os.path.join(ref_root, fx["name"] + ".safetensors"), metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "attn_implementation": "eager", "compute_dtype": "float32", "tf32": "off",
        "tool": "tools/make_fixtures.py (build_qwen_mtp)", "target": fx["target"]})
    router = (f", min router margin {watch.min_margin:.2e} (MTP layer) {twatch.min_margin:.2e} "
              f"(target)" if watch is not None else "")
    print(f"{fx['name']}: {sorted(os.listdir(out))}, {len(shards - with_mtp)} of {len(shards)} "
          f"shards without an MTP tensor, drafts {drafts}, margins "
          f"{[round(m, 3) for m in margins]}{router}, logits std {float(prefill_logits.std()):.2f}")


# ---- Kimi-K3 ------------------------------------------------------------------------------------
# transformers has no Kimi-K3: the references come from tools/kimi_k3_reference.py, a PyTorch
# forward written from the public definition, over a random checkpoint saved the way the real one
# is (KimiK3ForConditionalGeneration with text_config; the text model under language_model.*;
# BF16 weights with the KDA convs, A_log, dt_bias, o_norm and the routers' correction biases in
# F32; experts as block_sparse_moe.experts.J.w1/w3/w2), reloaded fresh in float32.
K3_TEXT_CONFIG = dict(
    model_type="kimi_linear", vocab_size=512, hidden_size=64, intermediate_size=96,
    num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    mla_use_nope=True, mla_use_output_gate=True, hidden_act="situ", activation_situ_beta=1.5,
    activation_situ_linear_beta=2.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
    linear_attn_config=dict(kda_layers=[1, 2, 4, 5], full_attn_layers=[3, 6], num_heads=2,
                            head_dim=16, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                            use_full_rank_gate=True),
    attn_res_block_size=2, num_experts=8, num_experts_per_token=2, num_shared_experts=1,
    moe_intermediate_size=16, routed_expert_hidden_size=48, latent_moe_use_norm=True,
    routed_scaling_factor=1.5, moe_renormalize=True, moe_router_activation_func="sigmoid",
    use_grouped_topk=True, num_expert_group=1, topk_group=1, first_k_dense_replace=1,
    moe_layer_freq=1, num_nextn_predict_layers=0, max_position_embeddings=4096,
    bos_token_id=1, eos_token_id=2, pad_token_id=0)

K3_FIXTURES = [
    # 6 layers (KDA, KDA, MLA, KDA, KDA, MLA), attention residuals over blocks of 2 (a bank of 4
    # rows), the latent MoE on layers 1-5; a prompt of 100 tokens passes KDA's 64-token chunks.
    dict(name="kimi_k3", text_config=K3_TEXT_CONFIG, tokens=100, greedy_prompt=20, seed=31,
         more_seeds=[131, 231]),
    # The release's format: routed experts MXFP4 in compressed-tensors' mxfp4-pack-quantized
    # (experts.J.wN.weight_packed [rows, K/2] U8, weight_scale [rows, K/32] U8), its
    # quantization_config in text_config as Kimi-K3's; widths multiples of 32. The reference
    # reads the dequantised values.
    dict(name="kimi_k3_mxfp4",
         text_config=dict(K3_TEXT_CONFIG, routed_expert_hidden_size=32, moe_intermediate_size=32,
                          quantization_config=dict(
                              quant_method="compressed-tensors", format="mxfp4-pack-quantized",
                              config_groups=dict(group_0=dict(
                                  targets=["Linear"],
                                  weights=dict(num_bits=4, type="float", strategy="group",
                                               group_size=32, symmetric=True, dynamic=False),
                                  input_activations=None)),
                              ignore=["re:.*self_attn.*", "re:.*shared_experts.*",
                                      "re:.*mlp\\.(gate|up|down)_proj", "re:.*gate$",
                                      "re:.*routed_expert_.*", "lm_head", "re:vision_tower.*",
                                      "re:mm_projector.*"])),
         mxfp4=True, tokens=100, greedy_prompt=20, seed=37, more_seeds=[137, 237]),
]


def k3_params(t, g):
    """Random weights under the checkpoint's names: (name, tensor, save dtype)."""
    H, la = t["hidden_size"], t["linear_attn_config"]
    nh, nope, rope, vd = (t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"],
                          t["v_head_dim"])
    KH, KD, K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    bf, f32 = torch.bfloat16, torch.float32
    out = []

    def lin(name, n, k, gain=1.0):
        out.append((name + ".weight", torch.randn(n, k, generator=g) * gain / math.sqrt(k), bf))

    def norm(name, n):
        out.append((name + ".weight", 1.0 + 0.3 * torch.randn(n, generator=g), bf))

    def glu(pre, i, n, gate="gate_proj", up="up_proj", down="down_proj"):
        lin(pre + gate, i, n, 2.0)
        lin(pre + up, i, n, 2.0)
        lin(pre + down, n, i)

    root = "language_model.model"
    out.append((root + ".embed_tokens.weight", torch.randn(t["vocab_size"], H, generator=g), bf))
    kda = {i - 1 for i in la["kda_layers"]}
    for i in range(t["num_hidden_layers"]):
        pre = f"{root}.layers.{i}."
        for n in ["input_layernorm", "post_attention_layernorm"]:
            norm(pre + n, H)
        for n in ["self_attention_res", "mlp_res"]:
            norm(pre + n + "_norm", H)
            lin(pre + n + "_proj", 1, H)
        a = pre + "self_attn."
        if i in kda:
            for n in "qkv":
                lin(a + n + "_proj", KH * KD, H)
                out.append((a + n + "_conv1d.weight",
                            torch.randn(KH * KD, 1, K, generator=g) * 0.6, f32))
            lin(a + "g_proj", KH * KD, H)
            lin(a + "f_a_proj", KD, H)
            lin(a + "f_b_proj", KH * KD, KD)
            lin(a + "b_proj", KH, H)
            lin(a + "o_proj", H, KH * KD)
            # Padded past the heads with zeros, as the real checkpoint's [128] for 96 heads.
            out.append((a + "A_log", torch.cat([torch.log(torch.empty(KH).uniform_(1, 16, generator=g)),
                                                torch.zeros(2)]), f32))
            out.append((a + "dt_bias", 0.5 * torch.randn(KH * KD, generator=g), f32))
            out.append((a + "o_norm.weight", 1.0 + 0.3 * torch.randn(KD, generator=g), f32))
        else:
            lin(a + "q_a_proj", t["q_lora_rank"], H)
            norm(a + "q_a_layernorm", t["q_lora_rank"])
            lin(a + "q_b_proj", nh * (nope + rope), t["q_lora_rank"], 2.0)
            lin(a + "kv_a_proj_with_mqa", t["kv_lora_rank"] + rope, H)
            norm(a + "kv_a_layernorm", t["kv_lora_rank"])
            lin(a + "kv_b_proj", nh * (nope + vd), t["kv_lora_rank"], 2.0)
            lin(a + "g_proj", nh * vd, H)
            lin(a + "o_proj", H, nh * vd)
        if i < t["first_k_dense_replace"]:
            glu(pre + "mlp.", t["intermediate_size"], H)
            continue
        m = pre + "block_sparse_moe."
        E, L, I = t["num_experts"], t["routed_expert_hidden_size"], t["moe_intermediate_size"]
        lin(m + "gate", E, H, 2.0)
        out.append((m + "gate.e_score_correction_bias", 0.3 * torch.randn(E, generator=g), f32))
        lin(m + "routed_expert_down_proj", L, H)
        norm(m + "routed_expert_norm", L)
        lin(m + "routed_expert_up_proj", H, L)
        for e in range(E):
            glu(f"{m}experts.{e}.", I, L, "w1", "w3", "w2")
        glu(m + "shared_experts.", I * t["num_shared_experts"], H)
    norm(root + ".norm", H)
    norm(root + ".output_attn_res_norm", H)
    lin(root + ".output_attn_res_proj", 1, H)
    lin("language_model.lm_head", t["vocab_size"], H, 3.0)
    # A vision tower's and projector's tensors, which the text model must skip unread.
    lin("vision_tower.patch_embed.proj", 32, 3 * 14 * 14)
    lin("mm_projector.proj.0", H, 4 * 32)
    return out


@torch.no_grad()
def build_kimi_k3(fx, out_root):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kimi_k3_reference import KimiK3Text
    out = os.path.join(out_root, "models", fx["name"])
    ref_root = os.path.join(out_root, "references")
    os.makedirs(ref_root, exist_ok=True)
    t = fx["text_config"]
    V = t["vocab_size"]
    last = None
    for seed in [fx["seed"]] + fx.get("more_seeds", []):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        g = torch.Generator().manual_seed(seed)
        params = k3_params(t, g)
        tensors = {n: w.to(dt).contiguous() for n, w, dt in params}
        if fx.get("mxfp4"):  # the routed experts' projections packed, compressed-tensors' way
            for n in [n for n in tensors if re.search(r"\.experts\.\d+\.w[123]\.weight$", n)]:
                w = tensors.pop(n)
                blocks, scales = mxfp4_quantize(w.float())
                base = n[: -len(".weight")]
                tensors[base + ".weight_packed"] = blocks.reshape(w.shape[0], -1).contiguous()
                tensors[base + ".weight_scale"] = scales.contiguous()
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        config = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
                  "dtype": "bfloat16", "text_config": t, "tie_word_embeddings": False,
                  "media_placeholder_token_id": V - 1,
                  "vision_config": {"model_type": "kimi_k3_vision", "hidden_size": 32}}
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
        # Fresh from the saved file, in float32 (MXFP4 experts dequantised).
        raw = load_file(os.path.join(out, "model.safetensors"))
        saved = {}
        for k, v in raw.items():
            if k.endswith(".weight_packed"):
                base = k[: -len(".weight_packed")]
                sc = raw[base + ".weight_scale"]
                saved[base + ".weight"] = mxfp4_dequantize(v.reshape(v.shape[0], -1, 16), sc).to(DEVICE)
            elif not k.endswith(".weight_scale"):
                saved[k] = v.float().to(DEVICE)
        ref = KimiK3Text(t, saved)
        gi = torch.Generator().manual_seed(1000 + seed)
        try:
            for _ in range(ATTEMPTS):
                ids = torch.randint(3, V, (fx["tokens"],), generator=gi).tolist()
                ref.min_margin = float("inf")
                logits = logits_of(ref, ids)
                if ref.min_margin >= ROUTER_MARGIN:
                    break
            else:
                raise Rejected(f"no token ids with router margins >= {ROUTER_MARGIN}")
            ids_margin = ref.min_margin
            self_frac = self_argmax_fraction(logits, ids)
            if self_frac > MAX_SELF_ARGMAX:
                raise Rejected(f"{self_frac:.0%} of rows have their input token as top logit")
            for _ in range(ATTEMPTS):
                prompt = torch.randint(3, V, (fx["greedy_prompt"],), generator=gi).tolist()
                ref.min_margin = float("inf")
                gen, margins = greedy(ref, prompt, GREEDY_TOKENS)
                if (min(margins) >= MIN_MARGIN and len(set(gen)) >= MIN_DISTINCT
                        and longest_run(gen) <= MAX_RUN and ref.min_margin >= ROUTER_MARGIN):
                    break
            else:
                raise Rejected("no greedy prompt with the margins, distinct tokens and runs asked")
        except Rejected as e:
            last = e
            print(f"{fx['name']}: rejected with seed {seed}: {e}")
            continue
        save_reference(os.path.join(ref_root, fx["name"] + ".safetensors"), ids, logits, prompt,
                       gen, margins, {"reference": "tools/kimi_k3_reference.py"})
        print(f"{fx['name']}: seed {seed}, logits std {float(logits.std()):.2f}, self-argmax rows "
              f"{self_frac:.0%}, greedy {gen}, distinct {len(set(gen))}, min greedy margin "
              f"{min(margins):.3f}, min router margin {ids_margin:.2e} (logits) "
              f"{ref.min_margin:.2e} (greedy)")
        return
    shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"{fx['name']}: {last}")


def main():
    out_root = sys.argv[1]
    names = set(sys.argv[2:])
    unknown = names - {fx["name"] for fx in FIXTURES + MTP_FIXTURES + QWEN_MTP_FIXTURES + K3_FIXTURES}
    if unknown:
        raise SystemExit(f"unknown fixture(s): {sorted(unknown)}")
    os.makedirs(out_root, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {DEVICE}")
    failed = []
    for fixtures, builder in [(FIXTURES, build), (MTP_FIXTURES, build_mtp),
                              (QWEN_MTP_FIXTURES, build_qwen_mtp), (K3_FIXTURES, build_kimi_k3)]:
        for fx in fixtures:
            if not names or fx["name"] in names:
                try:
                    builder(fx, out_root)
                except (SystemExit, Exception) as e:  # one broken fixture must not hide the others
                    traceback.print_exc()
                    failed.append(f"{fx['name']}: {e}")
    if failed:
        raise SystemExit("failed:\n  " + "\n  ".join(failed))


if __name__ == "__main__":
    main()
