#!/usr/bin/env python3
"""Plants known bugs in a scratch copy of atom, one at a time, and reports which CPU tests catch each.

A test suite that passes with a bug planted in the code it covers cannot fail for that bug. Each
mutation below is a small textual patch of one source file (the `old` text must occur exactly once,
so a mutation that no longer applies is reported, not skipped). For each mutation the script:
  1. copies the tree (the files git tracks or would track) into SCRATCH/src, changing only files
     whose bytes differ, so the build there stays incremental across runs and mutations;
  2. applies the patch, builds CPU-only into SCRATCH/build (cmake -G Ninja -DATOM_CUDA=OFF),
  3. runs the CPU suite (ctest -LE "gpu|fuzz" -j<cores> --timeout 900), records the failing tests,
  4. restores the file.
A baseline run without any mutation comes first; tests that fail there are reported and left out
of the mutations' counts. A mutation that no test catches, or that does not apply or build, makes
the script exit with status 1.

Usage: python3 tools/mutate.py [--scratch DIR] [--only NAME[,NAME...]] [--list] [--markdown FILE]
                               [--no-baseline] [--report] [--check] [--quick]
--check only verifies that every mutation's text occurs exactly once in the tree (no build; CI
runs it, so a mutation that stops applying fails CI instead of silently planting nothing).
--quick stops each suite at its first failing test (ctest --stop-on-failure; the tests that failed
last come first): it shows that a mutation is caught, and by which test, not how many catch it.
Python 3 standard library only. Takes about 2-3 minutes per mutation on 2 cores (--quick: about
100 s, mostly the incremental build; the whole table 56 min at e6eaa17).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, what it plants, file, old text, new text
MUTATIONS = [
    ("fp8_weight_block_by_activation_group",
     "FP8 linear reference: the weight's k block taken from the activation group index",
     "src/kernels/cpu/linear_fp8.cpp",
     "acc += part * (a * wscale(n, k0 / bk));",
     "acc += part * (a * wscale(n, k0 / ga));"),
    ("fused_norm_quant_drops_the_residual_add",
     "RMSNorm written as the next product's FP8 input: the residual add left out",
     "src/layers/norm.cpp",
     "if (!kernels::rms_norm_fp8(in, x, residual, weight_->data(), eps_, kind_)) {",
     "if (!kernels::rms_norm_fp8(in, x, nullptr, weight_->data(), eps_, kind_)) {"),
    ("fused_q_norm_quant_with_the_kv_norm",
     "DeepSeek q_a_layernorm written as q_b_proj's FP8 input: q_a normalised by another norm",
     "src/layers/mla.cpp",
     "step, LinearInput(q_a_layernorm_->forward_fp8(step, q_a, nullptr, *q_b_proj_)));",
     "step, LinearInput(kv_a_layernorm_.forward_fp8(step, q_a, nullptr, *q_b_proj_)));"),
    ("qk_norm_apart_normalises_k_with_q_norm",
     "Qwen3 with ATOM_ENABLE_QK_NORM_ROPE_CACHE_QUANT_FUSION=0: k normalised by q_norm's weight",
     "src/models/qwen3.cpp",
     "  k_norm_.forward_heads_inplace(step, k);",
     "  q_norm_.forward_heads_inplace(step, k);"),
    ("fused_silu_mul_quant_clamps",
     "SiLU·mul written as down_proj's FP8 input: another activation (clamped at 1)",
     "src/layers/mlp.cpp",
     "if (!kernels::glu_fp8(q, gate_up, act_)) {",
     "if (!kernels::glu_fp8(q, gate_up, kernels::Glu::silu_clamped(1.0f))) {"),
    ("fp8_amax_floor_dropped",
     "FP8 linear reference: an all-zero activation group without the amax floor (0 / 0)",
     "src/kernels/cpu/linear_fp8.cpp",
     "s = std::max(amax, kFp8AmaxFloor) / kFp8Max;",
     "s = amax / kFp8Max;"),
    # FP8 checkpoints (layers/linear.cpp): the dequantisation at load and the scale grid's cut.
    ("fp8_dequant_block_index_transposed",
     "FP8 dequantisation at load: the scale grid indexed [k block, n block] (transposed)",
     "src/layers/linear.cpp",
     "if (q.scales == Fp8Scales::kBlock) sc = sp[(n / q.block_n) * grid_k + k / q.block_k];",
     "if (q.scales == Fp8Scales::kBlock) sc = sp[(k / q.block_k) * grid_k + n / q.block_n];"),
    ("fp8_scale_grid_cut_from_column_0",
     "FP8 weights kept FP8: a row-parallel rank's scale grid cut from column block 0",
     "src/layers/linear.cpp",
     "const int64_t r0 = part.src_row / q.block_n, c0 = L->col_start / q.block_k;",
     "const int64_t r0 = part.src_row / q.block_n, c0 = 0 * L->col_start / q.block_k;"),
    ("fp8_experts_scale_rows_of_rank_0",
     "FP8 experts kept FP8: a rank's gate/up scale rows taken from the first rank's blocks",
     "src/layers/moe.cpp",
     "tensor_assign(rows, sf.narrow(0, start / bn, nr).contiguous());",
     "tensor_assign(rows, sf.narrow(0, 0, nr).contiguous());"),
    ("fp8_experts_cpu_scale_ignored",
     "FP8 experts on the CPU: the w2 codes taken without their block scales",
     "src/kernels/cpu/moe.cpp",
     "fp8_scale_slot(w2f.data(), *w.w2_scales, e, H, I, w.fp8_block_n, w.fp8_block_k);",
     ""),
    ("fp8_fused_tensor_scale_of_first_part",
     "FP8 per-tensor scales of fused parts: every row given the first part's scale",
     "src/layers/linear.cpp",
     "tensor_assign(dst, full_f32(part.rows, s.ptr<float>()[0]));",
     "tensor_assign(dst, full_f32(part.rows, part.dst_row == 0 ? s.ptr<float>()[0] : d.ptr<float>()[0]));"),
    ("rmsnorm_eps_dropped", "RMSNorm without its epsilon", "src/kernels/cpu/rms_norm.cpp",
     "std::sqrt(ss / static_cast<float>(dim) + eps)",
     "std::sqrt(ss / static_cast<float>(dim))"),
    ("rmsnorm_eps_x10", "RMSNorm with 10 x epsilon", "src/kernels/cpu/rms_norm.cpp",
     "std::sqrt(ss / static_cast<float>(dim) + eps)",
     "std::sqrt(ss / static_cast<float>(dim) + 10.0f * eps)"),
    ("gemma_norm_without_one", "Gemma RMSNorm scaling by w instead of (1 + w)",
     "src/kernels/cpu/rms_norm.cpp",
     "vg[i] = n * (1.0f + wf[i]);",
     "vg[i] = n * wf[i];"),
    ("rope_sign_flipped", "RoPE rotating by -theta", "src/kernels/cpu/rope.cpp",
     "sn[i] = std::sin(angle) * a.scale;",
     "sn[i] = -std::sin(angle) * a.scale;"),
    ("rope_interleaved_as_halves", "interleaved RoPE rotating halves (NeoX pairs)",
     "src/kernels/cpu/rope.cpp",
     "const int64_t i1 = base + (a.interleaved ? 2 * i : i);\n"
     "      const int64_t i2 = base + (a.interleaved ? 2 * i + 1 : i + half);",
     "const int64_t i1 = base + i;\n"
     "      const int64_t i2 = base + i + half;"),
    ("partial_rope_pairs_by_head_dim", "partial RoPE pairing i with i + head_dim / 2",
     "src/kernels/cpu/rope.cpp",
     "const int64_t i2 = base + (a.interleaved ? 2 * i + 1 : i + half);",
     "const int64_t i2 = base + (a.interleaved ? 2 * i + 1 : i + a.head_dim / 2);"),
    ("nan_after_first_chunk", "NaN logits for every row of a prefill chunk after the first",
     "src/engine/model_runner.cpp",
     "    return Tensor();\n"
     "  }\n"
     "  return model_.compute_logits(step, hidden_);\n",
     "    return Tensor();\n"
     "  }\n"
     "  Tensor mutated = model_.compute_logits(step, hidden_);\n"
     "  if (mutated.device().is_cpu())\n"
     "    for (size_t r = 0; r < batch.logits_indices.size(); ++r) {\n"
     "      const int t = batch.logits_indices[r];\n"
     "      size_t s = 0;\n"
     "      while (batch.query_start[s + 1] <= t) ++s;\n"
     "      const int q0 = batch.query_start[s], qn = batch.query_start[s + 1] - q0;\n"
     "      if (qn > 1 && batch.positions[q0] > 0)\n"
     "        for (int64_t v = 0; v < mutated.size(1); ++v)\n"
     "          mutated.ptr<float>()[static_cast<int64_t>(r) * mutated.size(1) + v] =\n"
     "              __builtin_nanf(\"\");\n"
     "    }\n"
     "  return mutated;\n"),
    ("top_p_drops_crossing_token", "top-p dropping the token whose mass crosses top_p",
     "src/kernels/cpu/sampling.cpp",
     "        keep_at_least(cand, s.key, c);\n      }\n    }\n",
     "        keep_at_least(cand, s.key, c);\n      }\n    }\n"
     "    keep_at_least(cand, s.key, k + 1);\n"),
    ("sampling_temperature_ignored", "sampling from the raw logits, not divided by the temperature",
     "src/kernels/cpu/sampling.cpp",
     "kNegInf : x[i] / p.temperature;",
     "kNegInf : x[i];"),
    ("block_hash_ignores_parent", "a block hash that ignores its parent block",
     "src/engine/block_manager.cpp",
     "  XXH64_update(&st, &parent, sizeof(parent));\n",
     ""),
    ("router_ignores_correction_bias", "a sigmoid router choosing without e_score_correction_bias",
     "src/kernels/cpu/moe.cpp",
     "choice[e] = score[e] + (bias ? bias[e] : 0.0f);",
     "choice[e] = score[e] + (bias ? 0.0f * bias[e] : 0.0f);"),
    ("router_groups_masked_to_zero", "dropped groups' experts scored 0 instead of -inf",
     "src/kernels/cpu/moe.cpp",
     "if (!group_taken[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();",
     "if (!group_taken[e / per_group]) choice[e] = 0.0f;"),
    ("routed_scaling_dropped", "routed_scaling_factor not applied",
     "src/kernels/cpu/moe.cpp",
     "for (int64_t k = 0; k < K; ++k) w[k] *= a.routed_scaling_factor;",
     "for (int64_t k = 0; k < K; ++k) w[k] *= 1.0f;"),
    ("swiglu_oai_without_plus_one", "GPT-OSS's SwiGLU without its (up + 1)",
     "src/kernels/activation.h",
     "return (uc + 1.0f) * (gc / (1.0f + std::exp(-a.alpha * gc)));",
     "return uc * (gc / (1.0f + std::exp(-a.alpha * gc)));"),
    ("expert_tp_slice_from_rank_0", "every rank loading rank 0's slice of each expert",
     "src/layers/moe.h",
     "return expert_parallel() ? 0 : ctx_.tp_rank * inter_rank_;",
     "return expert_parallel() ? 0 : 0 * ctx_.tp_rank * inter_rank_;"),
    # Expert parallelism (layers/moe.cpp, loader/weight_loading.cpp).
    ("ep_expert_bias_on_rank_0_only",
     "expert parallelism: an expert's output bias kept only on rank 0 (as tensor parallelism does)",
     "src/layers/moe.cpp",
     "if (m_.expert_parallel() || m_.ctx_.tp_rank == 0)\n",
     "if (m_.ctx_.tp_rank == 0)\n"),
    ("eplb_replica_table_row_stride_dropped",
     "EPLB: the replica table read without its row stride (another expert's replica)",
     "src/kernels/cpu/moe.cpp",
     "for (int64_t k = 0; k < K; ++k) ids[k] = rep[ids[k] * R + t % cnt[ids[k]]];",
     "for (int64_t k = 0; k < K; ++k) ids[k] = rep[ids[k] + 0 * R + t % cnt[ids[k]]];"),
    ("eplb_moved_slot_not_fetched",
     "EPLB re-placement: a moved slot given zeros instead of its expert's weights",
     "src/layers/moe.cpp",
     "if (src / L == me) kernels::cast(buf, slot.view({1, n}));",
     "if (src / L == me && false) kernels::cast(buf, slot.view({1, n}));"),
    ("ep_loader_reads_other_ranks_experts",
     "expert parallelism: the loader reading the experts other ranks hold",
     "src/loader/weight_loading.cpp",
     "d.kind = m->expert >= 0 && p->holds_expert && !p->holds_expert(m->expert)",
     "d.kind = false && m->expert >= 0 && p->holds_expert && !p->holds_expert(m->expert)"),
    # Gated delta net (Qwen3-Next, Qwen3.5).
    ("gdn_state_not_reset", "a new sequence's recurrent state not reset (the slot's last owner's)",
     "src/kernels/cpu/gated_delta.cpp",
     "    if (s.fresh) std::memset(st, 0, sizeof(float) * static_cast<size_t>(per_slot));",
     "    if (s.fresh && false) std::memset(st, 0, sizeof(float) * static_cast<size_t>(per_slot));"),
    ("gdn_conv_state_dropped", "the conv state not carried from one step to the next",
     "src/kernels/cpu/gated_delta.cpp",
     "      for (int64_t i = 0; i < K - 1; ++i) win[i] = st[c * (K - 1) + i];",
     "      for (int64_t i = 0; i < K - 1; ++i) win[i] = 0.0f * st[c * (K - 1) + i];"),
    ("gdn_chunk_state_decay_dropped", "the chunked delta rule not decaying the carried state",
     "src/kernels/cpu/gated_delta.cpp",
     "    for (int64_t i = 0; i < static_cast<int64_t>(dk) * dv; ++i) S[i] *= el;",
     "    for (int64_t i = 0; i < static_cast<int64_t>(dk) * dv; ++i) S[i] *= 1.0f + 0.0f * el;"),
    ("gdn_k_head_not_repeated", "value head h reading key head h % Hk instead of h / (Hv / Hk)",
     "src/kernels/cpu/gated_delta.cpp",
     "      const int j = h / r;  // repeat_interleave: v-head h reads k-head h / r",
     "      const int j = h % Hk + 0 * r;"),
    # Kimi delta attention (Kimi-Linear).
    ("kda_state_not_reset", "a new sequence's KDA state not reset (the slot's last owner's)",
     "src/kernels/cpu/gated_delta.cpp",
     "    if (s.fresh) std::fill(st, st + per_slot, 0.0f);",
     "    if (s.fresh && false) std::fill(st, st + per_slot, 0.0f);"),
    ("kda_chunk_decay_per_head", "the chunked KDA rule decaying the carried state by channel 0's "
     "decay for every channel", "src/kernels/cpu/gated_delta.cpp",
     "      const float el = std::exp(last[c]);",
     "      const float el = std::exp(last[0]);"),
    ("kda_dt_bias_per_head", "the forget gate adding one dt_bias per head, not per channel",
     "src/kernels/cpu/gated_delta.cpp",
     "const float pre = load(row_ptr(f, row), f.dtype(), col) + bias[c];",
     "const float pre = load(row_ptr(f, row), f.dtype(), col) + bias[0];"),
    ("kda_norm_gate_silu", "Kimi's gated output norm gating by silu instead of sigmoid",
     "src/kernels/cpu/gated_delta.cpp",
     "xv[g0 + i] = wf[i] * (xv[g0 + i] * inv) * sigmoid(zi);",
     "xv[g0 + i] = wf[i] * (xv[g0 + i] * inv) * zi * sigmoid(zi);"),
    ("kimi_mla_with_rope", "Kimi-Linear's MLA rotating q_pe and k_pe (it has no RoPE)",
     "src/models/kimi_linear.cpp",
     "  o.apply_rope = false;",
     "  o.apply_rope = true;"),
    # Prefix caching of recurrent models through state checkpoints (engine/scheduler.cpp).
    ("state_checkpoint_not_restored", "a prefix served from a state checkpoint without restoring "
     "the state", "src/engine/scheduler.cpp",
     "      out_.state_copies.push_back({config_.checkpoint_slot_begin + restore, seq->state_slot()});",
     "      (void)seq->state_slot();"),
    ("state_checkpoint_chunks_uncapped", "prefill chunks not ended at checkpoint boundaries",
     "src/engine/scheduler.cpp",
     "  return std::min(n, boundary - start);",
     "  return n + 0 * boundary;"),
    ("state_checkpoint_hits_not_cut", "KV hits past the last checkpoint kept (the state resumed "
     "from an earlier point)", "src/engine/scheduler.cpp",
     "      hits_.resize(keep);",
     "      (void)keep;"),
    ("gated_attention_gate_dropped", "the gated attention's sigmoid output gate not applied",
     "src/models/qwen3_next.cpp",
     "  kernels::mul_sigmoid(o, o, gate);",
     "  (void)gate;"),
    # Speculative decoding of the hybrids: the Qwen MTP drafters and the recurrent state's rollback.
    ("qwen_mtp_concat_swapped", "the Qwen MTP drafters' fc over concat(hidden, embedding)",
     "src/models/qwen3_next_mtp.h",
     "mtp_concat_columns(step, e, h)",
     "mtp_concat_columns(step, h, e)"),
    ("spec_state_not_rolled_back", "rejected drafts' recurrent state kept (no commit_rows)",
     "src/engine/llm_engine.cpp",
     "    if (!seq.state_slots.empty()) StatePool::commit_rows(seq, d + 1, accepted + 1);",
     "    (void)accepted;"),
    ("rollback_conv_state_one_row_early", "a rollback slot's conv state taken one row early",
     "src/kernels/cpu/gated_delta.cpp",
     "kept[c * (K - 1) + i] = win[t + 1 + i];",
     "kept[c * (K - 1) + i] = win[t + i];"),
    ("attention_online_softmax_not_rescaled",
     "CPU paged attention: the running output not rescaled when a later key tile raises the maximum",
     "src/kernels/cpu/attention.cpp",
     "for (int d = 0; d < D; ++d) ai[d] *= c;",
     "for (int d = 0; d < D; ++d) ai[d] *= 1.0f;"),
    ("attention_window_one_short",
     "CPU paged attention: a sliding window that sees one key fewer",
     "src/kernels/cpu/attention.cpp",
     "return a.sliding_window > 0 ? std::max(0, qpos(r) - a.sliding_window + 1) : 0;",
     "return a.sliding_window > 0 ? std::max(0, qpos(r) - a.sliding_window + 2) : 0;"),
    # DeepSeek-V4 (issue 35): hyper-connections, the compressors, the attention and the MoE.
    ("v4_hc_comb_not_transposed",
     "mHC: the streams mixed by comb[k, j] instead of comb[j, k] (transformers' transpose)",
     "src/kernels/cpu/hyper_connection.cpp",
     "for (int64_t j = 0; j < hc; ++j) acc += cb[j * hc + k] * old[j * D + d];",
     "for (int64_t j = 0; j < hc; ++j) acc += cb[k * hc + j] * old[j * D + d];"),
    ("v4_csa_overlap_from_second_halves",
     "CSA compressor: the next window's overlap slots fed from the second halves (Cb), not Ca",
     "src/layers/compressed_kv.cpp",
     "next.add(z.data(), c);         // Ca: the next window's",
     "next.add(z.data() + D, c + D);  // Ca: the next window's"),
    ("v4_compressor_state_not_reset",
     "compressor: a new request's windows start from the last request's partial sums",
     "src/layers/compressed_kv.cpp",
     "if (p == 0) {  // a new request: no window in progress",
     "if (p < 0) {  // a new request: no window in progress"),
    ("v4_entry_visible_before_complete",
     "DeepSeek-V4 attention: the entry of the window in progress visible (not yet written)",
     "src/models/deepseek_v4.cpp",
     "const int64_t n = (p + 1) / r;  // complete windows",
     "const int64_t n = (p + r) / r;  // complete windows"),
    ("v4_output_not_derotated",
     "DeepSeek-V4 attention: the output's rope channels not rotated back",
     "src/models/deepseek_v4.cpp",
     "/*inverse=*/true);",
     "/*inverse=*/false);"),
    ("v4_sinks_dropped",
     "DeepSeek-V4 attention: the per-head sink left out of the softmax's sum",
     "src/models/deepseek_v4_parts.cpp",
     "float sum = std::exp(sink - mx);",
     "float sum = 0.0f * std::exp(sink - mx);"),
    ("v4_indexer_keeps_every_entry",
     "DeepSeek-V4 CSA: every complete entry attended instead of the indexer's top-k",
     "src/models/deepseek_v4.cpp",
     "if (n <= v_.index_topk) return all(n);",
     "if (n >= 0) return all(n);"),
    ("v4_hash_routing_ignored",
     "DeepSeek-V4 hash layers: experts chosen by score instead of the tid2eid table",
     "src/models/deepseek_v4_parts.cpp",
     "a.fixed_ids = &fixed;",
     "a.fixed_ids = nullptr;"),
    ("v4_sqrt_softplus_without_sqrt",
     "router: sqrt-softplus scores without the square root",
     "src/kernels/cpu/moe.cpp",
     "for (float& v : score) v = std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v)));",
     "for (float& v : score) v = (v > 20.0f ? v : std::log1p(std::exp(v)));"),
    ("v4_swiglu_clamp_dropped",
     "the clamped SiLU-mul (experts and dense MLPs) without its clamps",
     "src/kernels/activation.h",
     "return gc / (1.0f + std::exp(-gc)) * std::clamp(u, -a.limit, a.limit);",
     "return (gc * 0.0f + g) / (1.0f + std::exp(-g)) * u;"),
    # GLM-5.3 (issue 35): the safe gate, the k-pool indexer, the clamped dense SwiGLU.
    ("glm5_safe_gate_ignored",
     "KDA: GLM-5.3's safe gate replaced by Kimi's softplus gate",
     "src/kernels/cpu/gated_delta.cpp",
     "gh[t * d + c] = args.gate_lower_bound < 0.0f ? args.gate_lower_bound * sigmoid(A * pre)",
     "gh[t * d + c] = args.gate_lower_bound < -1e30f ? args.gate_lower_bound * sigmoid(A * pre)"),
    ("v41_candidates_ignored",
     "Indexer (V4.1): the candidate blocks of the source layer do not bound the later layers' top-k",
     "src/kernels/cpu/mla.cpp",
     "        bool ok = !ci;",
     "        bool ok = true;"),
    ("v41_fp8_query_unrounded",
     "Indexer (V4.1): the query scored unrounded against the FP8 index plane",
     "src/kernels/cpu/mla.cpp",
     "        if (fmt == IndexKeyFormat::kFp8) index_fp8_round_query(qv.data() + h * D, D);",
     "        if (fmt == IndexKeyFormat::kFp8 && D < 0) index_fp8_round_query(qv.data() + h * D, D);"),
    ("v41_candidate_newest_not_kept",
     "Indexer (V4.1): the newest candidate block competes on its score instead of being kept",
     "src/kernels/cpu/mla.cpp",
     "        if (nb > 0) best.back().first = std::numeric_limits<float>::infinity();",
     "        if (nb < 0) best.back().first = std::numeric_limits<float>::infinity();"),
    ("v41_single_pass_own_pre",
     "Hyper-connections (V4.1): a single-pass site collapses by its own pre, not the carried one",
     "src/kernels/cpu/hyper_connection.cpp",
     "collapse(input, t, xt, carry.by ? carry.by->ptr<float>() + t * hc : pre.data(), hc, D);",
     "collapse(input, t, xt, pre.data(), hc, D);"),
    ("v41_index_key_unrotated",
     "Index plane (V4.1): the keys stored without their RoPE",
     "src/kernels/cpu/index_plane.cpp",
     "    for (int64_t i = 0; i < R / 2; ++i) {",
     "    for (int64_t i = 0; i < 0; ++i) {"),
    ("glm5_kpool_tail_dropped",
     "k-pool indexer: the incomplete tail pool's tokens not attended",
     "src/kernels/cpu/mla.cpp",
     "        for (int v = n * P; v <= i; ++v) o[m++] = v;",
     "        for (int v = n * P; v < i; ++v) o[m++] = v;"),
    ("glm5_kpool_ape_dropped",
     "k-pool indexer: the pools' position bias left out of the gated softmax",
     "src/kernels/cpu/mla.cpp",
     "const float e = std::exp(row[u * 2 * D + D + d] + ap[u * D + d] - mx);",
     "const float e = std::exp(row[u * 2 * D + D + d] - mx);"),
    ("glm5_kpool_key_norm_bias_dropped",
     "k-pool indexer: the keys' LayerNorm without its bias",
     "src/models/glm5_next.cpp",
     "k_norm_w_->data(), k_norm_b_->data(), 1e-6f);",
     "k_norm_w_->data(), Tensor(), 1e-6f);"),
    ("glm5_dense_swiglu_unclamped",
     "dense SwiGLU: the gate not clamped at swiglu_limit",
     "src/kernels/activation.h",
     "      const float gc = std::min(g, a.limit);\n",
     "      const float gc = std::min(g, 1e30f);\n"),
    ("kda_tp_heads_of_rank_0",
     "Kimi delta attention under tensor parallelism: every rank given rank 0's conv weights, A_log "
     "and dt_bias",
     "src/layers/kimi_delta_attention.cpp",
     "const WeightLoader heads = rank_slice_loader(ctx.tp_rank, ctx.tp_size);",
     "const WeightLoader heads = rank_slice_loader(0 * ctx.tp_rank, ctx.tp_size);"),
    ("gdn_tp_conv_of_rank_0",
     "The gated delta net under tensor parallelism: every rank given rank 0's q/k/v conv weights",
     "src/layers/gated_delta_net.cpp",
     "rank_slice_loader(ctx.tp_rank, ctx.tp_size, {all_key * K, all_key * K, all_value * K})",
     "rank_slice_loader(0 * ctx.tp_rank, ctx.tp_size, {all_key * K, all_key * K, all_value * K})"),
    ("merged_blocks_cut_whole_part",
     "A merged column projection with blocks (Qwen3.5's in_proj_qkv): each rank cut from the "
     "part's first block only",
     "src/layers/linear.cpp",
     "l.parts.push_back({std::to_string(i), \"\", start + ctx.tp_rank * per, out_, per, rows});",
     "l.parts.push_back({std::to_string(i), \"\", 0 * start + ctx.tp_rank * per, out_, per, rows});"),
    ("kv_head_linear_not_replicated",
     "k_proj / v_proj cut by kv heads: the ranks' heads swapped",
     "src/layers/linear.cpp",
     "l.parts = {{\"\", \"\", (ctx.tp_rank / kv.replicas) * out_, 0, out_, total_kv_heads * head_dim}};",
     "l.parts = {{\"\", \"\", ((ctx.tp_rank + 1) % ctx.tp_size / kv.replicas) * out_, 0, out_, total_kv_heads * head_dim}};"),
    ("pp_stage_drops_hidden",
     "Pipeline parallelism: a later stage starts from the residual stream alone, dropping the "
     "previous stage's last layer output",
     "src/models/llama.h",
     "      h = step.pp_in->hidden;",
     "      h = Tensor();"),
    ("pp_remainder_on_first_stages",
     "Pipeline parallelism: the remainder layers on the first stages instead of vLLM's (the "
     "stages before the last)",
     "src/layers/context.cpp",
     "++n[static_cast<size_t>(size - 2 - i)];",
     "++n[static_cast<size_t>(i)];"),
    ("micro_batch_pages_of_first_slice",
     "Pipeline micro-batches: every slice given the pages at the start of the batch's page list",
     "src/layers/batch.cpp",
     "b.page_indices = cut(page_indices, p0, p1);",
     "b.page_indices = cut(page_indices, 0 * p0, p1 - p0);"),
    ("pp_layer_state_not_handed_on",
     "Pipeline parallelism: a stage starting with GLM-5's shared layer not given the previous "
     "stage's selection",
     "src/models/llama.h",
     "if (step.pp_in) state.from_stage(step.pp_in->extra);",
     "if (step.pp_in && false) state.from_stage(step.pp_in->extra);"),
    ("glm5_pp_selection_not_handed_on",
     "Pipeline parallelism: GLM-5.3's stage that opens with a shared layer not given the previous "
     "stage's selection",
     "src/models/glm5_next.cpp",
     "      topk = extra[0];  // the step's own copy (Step::pp_in)",
     "      (void)extra;  // the step's own copy (Step::pp_in)"),
    ("v4_tp_experts_not_reduced",
     "DeepSeek-V4 under tensor parallelism: the routed experts' partial sums not all-reduced",
     "src/models/deepseek_v4_parts.cpp",
     "if (ctx_.tp_size > 1) ctx_.comm->all_reduce_sum(out);",
     "if (ctx_.tp_size > 100) ctx_.comm->all_reduce_sum(out);"),
    ("compressor_rollback_rows_dropped",
     "Compressed KV: a speculative verification row's rollback slot never receives the windows "
     "in progress after it",
     "src/layers/compressed_kv.cpp",
     "if (to >= 0)",
     "if (to >= 0 && false)"),
    ("verify_schedule_confidence_as_survival",
     "DSpark's verify lengths: a draft's survival is its own confidence instead of the product "
     "of its block's confidences up to it",
     "src/engine/verify_schedule.cpp",
     "a *= std::max(0.0f, confidence[i]);",
     "a = std::max(0.0f, confidence[i]);"),
    ("verify_schedule_no_early_stop",
     "DSpark's verify lengths: a draft that lowers the rate is skipped instead of ending the "
     "admission (later, faster sizes admitted)",
     "src/engine/verify_schedule.cpp",
     "if (!(next > theta)) break;",
     "if (!(next > theta)) continue;"),
    # Data-parallel attention (layers/dp_attention.h) and the block partitions behind it.
    ("dp_attention_no_all_reduce",
     "Data-parallel attention: each rank keeps only its own sequences' rows (no all-reduce)",
     "src/layers/dp_attention.cpp",
     "  ctx.comm->all_reduce_sum(out);",
     "  (void)ctx.comm;"),
    ("dp_runner_every_rank_is_rank_0",
     "Data-parallel attention: every rank takes partition 0's sequences as its own",
     "src/models/model.h",
     "return data_parallel_attention() ? ctx_.tp_rank / ctx_.data_parallel_attention->tp_size : 0;",
     "return data_parallel_attention() ? 0 * ctx_.tp_rank : 0;"),
    ("dp_attention_every_group_rank_adds_its_rows",
     "Data-parallel attention over groups of tensor-parallel ranks: every rank of a group adds the "
     "group's rows (counted once per rank)",
     "src/layers/dp_attention.cpp",
     "if (ctx.data_parallel_attention->tp_rank == 0)",
     "if (ctx.data_parallel_attention->tp_rank >= 0)"),
    ("scheduler_victim_of_any_partition",
     "Block partitions: a sequence short of blocks preempts a sequence of another partition",
     "src/engine/scheduler.cpp",
     "if (!s->finished() && !s->in_step && s->partition == partition) {",
     "if (!s->finished() && !s->in_step) {"),
    ("scheduler_partition_ignores_cached_prefix",
     "Block partitions: a new sequence goes to the most free partition before its cached prefix's",
     "src/engine/scheduler.cpp",
     "if (h > best_hits || (h == best_hits && f > best_free)) {",
     "if (f > best_free || (f == best_free && h > best_hits)) {"),
    ("image_cache_trusts_the_hash",
     "Image feature cache: a candidate with the same 64-bit hash is a hit without comparing pixels",
     "src/engine/multimodal.cpp",
     "return std::memcmp(pixels.data(), p.data(), p.nbytes()) == 0;",
     "return true;"),
    ("tp_drafter_shard_rows_overlap",
     "Speculative decoding under tensor parallelism: every rank's vocabulary shard gathered into "
     "the drafter's first rows",
     "src/models/draft_model.cpp",
     "const int64_t rows = shard.size(0), start = t * rows;",
     "const int64_t rows = shard.size(0), start = 0 * t * rows;"),
    ("hc_sinkhorn_one_iteration",
     "Hyper-connections: the Sinkhorn normalisation stopped after its first column pass",
     "src/kernels/cpu/hyper_connection.cpp",
     "    for (int it = 1; it < a.sinkhorn_iters; ++it) {",
     "    for (int it = 1; it < 1; ++it) {"),
    ("pp_spec_hidden_not_gathered",
     "Speculative decoding over pipeline stages: the last stage keeps no hidden states of a step "
     "run as micro-batches",
     "src/engine/model_runner.cpp",
     "  bool hidden_whole = gather_hidden;",
     "  bool hidden_whole = false;"),
    ("k3_situ_linear_cap_dropped",
     "SiTU (Kimi-K3): the up half not soft-capped by activation_situ_linear_beta",
     "src/kernels/activation.h",
     "return sg * (a.linear_beta > 0.0f ? a.linear_beta * std::tanh(u / a.linear_beta) : u);",
     "return sg * u;"),
    ("k3_attn_res_current_block_left_out",
     "Attention residuals (Kimi-K3): the attention's mix leaves out the current block's running "
     "sum",
     "src/models/kimi_linear.cpp",
     "    attn_site_->mix(x, bank, n);",
     "    attn_site_->mix(x, bank, std::max<int64_t>(1, n - 1));"),
    ("k3_latent_moe_not_reduced_before_norm",
     "Latent MoE (Kimi-K3) under tensor parallelism: the routed experts' partial sums normed "
     "unreduced",
     "src/layers/moe.cpp",
     "    if (reduce) ctx_.comm->all_reduce_sum(z);",
     "    if (false && reduce) ctx_.comm->all_reduce_sum(z);"),
    ("k3_mla_output_gate_dropped",
     "Gated MLA output (Kimi-K3): o_proj reads the heads without sigmoid(g_proj(x))",
     "src/layers/mla.cpp",
     "    kernels::mul_sigmoid(o, o, p.gate);",
     "    (void)p.gate;"),
    ("kda_a_log_padding_read_as_heads",
     "KDA's A_log padded past the heads (Kimi-K3's [128] for 96): the values read from the end",
     "src/layers/kimi_delta_attention.cpp",
     "heads(p, f.narrow(0, 0, H), shard, expert);",
     "heads(p, f.narrow(0, f.numel() - H, H), shard, expert);"),
    ("nodes_remote_slot_not_filled",
     "Several nodes: a group's exchange reads the other nodes' tensors but leaves their slots as "
     "they were (the remote ranks' contributions missing from the sum)",
     "src/dist/comm_group.cpp",
     "          slots[static_cast<size_t>(t)] = wire_tensor(theirs);",
     "          (void)wire_tensor(theirs);"),
    ("nodes_step_state_copies_dropped",
     "Several nodes: a worker's copy of the step loses the recurrent state copies (prefix "
     "checkpoints and restores)",
     "src/engine/tp_runner.cpp",
     "    b.state_copies.emplace_back(from, static_cast<int32_t>(w.i64()));",
     "    (void)from;\n    (void)w.i64();"),
    ("image_block_hash_not_mixed",
     "Prompts with images: a block holding an image's placeholders hashes like its tokens alone, "
     "so a prompt with the same tokens and another image reuses the first image's cached KV",
     "src/engine/block_manager.cpp",
     "      v = prompt_images_hash(*seq.request->images, v, lo, lo + block_size_);",
     "      (void)lo;"),
    ("image_rows_shifted_by_one",
     "Prompts with images: the features land one row after their placeholders",
     "src/engine/multimodal.cpp",
     "        {row0 + lo - start, images.features.narrow(",
     "        {row0 + lo - start + (lo + 1 < hi ? 1 : 0), images.features.narrow("),
    ("nodes_step_input_embeds_dropped",
     "Several nodes: a worker's copy of the step loses the image features (its ranks embed the "
     "placeholder tokens as text)",
     "src/engine/tp_runner.cpp",
     "  w.put_i64(b.input_embeds ? static_cast<int64_t>(b.input_embeds->runs.size()) : 0);\n"
     "  if (b.input_embeds)",
     "  w.put_i64(0);\n  if (false)"),
    ("micro_batch_input_embeds_dropped",
     "Pipeline stages: a micro-batch cut from a step with images loses their features",
     "src/layers/batch.cpp",
     "  if (input_embeds) b.input_embeds = input_embeds_window(*input_embeds, t0, t1 - t0);",
     "  (void)t1;"),
    ("moonvit3d_bicubic_instead_of_bilinear",
     "Kimi-K3's MoonViT3d: the position grid resized bicubically (K2.5's) instead of bilinearly",
     "src/models/moonvit.cpp",
     "  m.bilinear = interp == \"bilinear\";",
     "  m.bilinear = false;"),
    ("moonvit_video_time_table_dropped",
     "MoonViT videos: the frames get no fixed time embedding (every frame the same positions)",
     "src/models/moonvit.cpp",
     "          for (int64_t k = 0; k < D; ++k) dst[n * D + k] += te[static_cast<size_t>(k)];",
     "          (void)n;"),
    ("moonvit_rope_axes_swapped",
     "MoonViT: the 2D rotary embedding turns pair 2i by the patch's row instead of its column",
     "src/models/moonvit.cpp",
     "            const float ax = static_cast<float>(x) * fi, ay = static_cast<float>(y) * fi;",
     "            const float ax = static_cast<float>(y) * fi, ay = static_cast<float>(x) * fi;"),
    ("encoder_attention_crosses_sequences",
     "Encoder attention (CPU): every sequence attends over the whole batch's rows",
     "src/kernels/cpu/encoder.cpp",
     "    const int64_t s0 = starts[s], len = starts[s + 1] - s0;",
     "    const int64_t s0 = 0, len = starts.back(); (void)s;"),
    ("paged_attention_non_causal_ignored",
     "Paged attention (CPU): causal off still masks by position",
     "src/kernels/cpu/attention.cpp",
     "return a.causal ? L - qlen + (w.t0 + r - qs[w.s]) : L - 1;",
     "return L - qlen + (w.t0 + r - qs[w.s]);"),
    ("video_merge_mean_not_divided",
     "Patch merge: a video's frames summed, not averaged",
     "src/kernels/cpu/encoder.cpp",
     "      store(po, out.dtype(), c, n == 1 ? acc : acc * inv);",
     "      store(po, out.dtype(), c, n == 1 ? acc : acc * inv * static_cast<float>(n));"),
]


def tree_files():
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, check=True, capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def sync_tree(dst):
    """Makes dst a copy of the tree, rewriting only the files whose bytes differ."""
    want = set(tree_files())
    changed = 0
    for rel in want:
        s, d = os.path.join(ROOT, rel), os.path.join(dst, rel)
        with open(s, "rb") as f:
            data = f.read()
        if os.path.isfile(d) and not os.path.islink(d):
            with open(d, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        with open(d, "wb") as f:
            f.write(data)
        shutil.copymode(s, d)
        changed += 1
    for dirpath, dirnames, filenames in os.walk(dst):
        rel_dir = os.path.relpath(dirpath, dst)
        if rel_dir == "tests/node":
            dirnames[:] = [n for n in dirnames if n != "node_modules"]
        for n in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, n))
            if rel not in want and not os.path.islink(os.path.join(dirpath, n)):
                os.remove(os.path.join(dirpath, n))
    # The npm client the server tests run (git-ignored, large): linked, not copied.
    nm = os.path.join(ROOT, "tests/node/node_modules")
    link = os.path.join(dst, "tests/node/node_modules")
    if os.path.isdir(nm) and not os.path.lexists(link):
        os.symlink(nm, link)
    return changed


def run(cmd, cwd, log):
    with open(log, "w") as f:
        return subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode


def build(src, bld, log):
    if not os.path.exists(os.path.join(bld, "build.ninja")):
        rc = run(["cmake", "-S", src, "-B", bld, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                  "-DATOM_CUDA=OFF"], src, log + ".configure")
        if rc:
            return rc
    # Through the machine's build lock (scripts/locked.sh): never two builds at once.
    return run([os.path.join(src, "scripts", "locked.sh"), "cmake", "--build", bld, "-j",
                str(os.cpu_count() or 2)], src, log)


FAILED_LINE = re.compile(r"^\s*\d+ - (\S+)")


def run_suite(bld, log, quick=False):
    cmd = ["ctest", "-LE", "gpu|fuzz", "-j", str(os.cpu_count() or 2), "--timeout", "900"]
    if quick:
        cmd.append("--stop-on-failure")
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=bld, stdout=f, stderr=subprocess.STDOUT)
    return parse_ctest(log)


def parse_ctest(log):
    """The failing tests and the test count of a ctest log; (None, None) if it did not finish."""
    failed, in_list, total = [], False, None
    with open(log, errors="replace") as f:
        for line in f:
            m = re.search(r"tests passed, (\d+) tests failed out of (\d+)", line)
            if m:
                total = int(m.group(2))
            if line.startswith("The following tests FAILED"):
                in_list = True
                continue
            if in_list:
                m = FAILED_LINE.match(line)
                if m:
                    failed.append(m.group(1))
                elif line.strip() and not line.startswith("\t"):
                    in_list = False
    if total is None and "100% tests passed" not in open(log, errors="replace").read():
        return None, None
    return failed, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scratch", default="/tmp/atom-mutate")
    ap.add_argument("--only", default="", help="comma list of mutation names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--markdown", default="", help="also write the table to this file")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--report", action="store_true",
                    help="print the table from the logs of the last run, running nothing")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutation applies to the tree (no build)")
    ap.add_argument("--quick", action="store_true",
                    help="stop each suite at its first failing test")
    args = ap.parse_args()
    if args.check:
        bad = 0
        for name, _, path, old, _ in MUTATIONS:
            with open(os.path.join(ROOT, path)) as f:
                count = f.read().count(old)
            if count != 1:
                print(f"mutate.py: {name} does not apply: its text occurs {count} times in {path}",
                      file=sys.stderr)
                bad += 1
        print(f"mutate.py: {len(MUTATIONS) - bad} of {len(MUTATIONS)} mutations apply")
        return 1 if bad else 0
    if args.list:
        for name, what, path, _, _ in MUTATIONS:
            print(f"{name:34} {path:34} {what}")
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m[0] in args.only.split(",")]
    if args.only and len(chosen) != len(args.only.split(",")):
        print("unknown mutation in --only; --list shows them", file=sys.stderr)
        return 2
    if args.report:
        return report(args, chosen)
    src, bld = os.path.join(args.scratch, "src"), os.path.join(args.scratch, "build")
    logs = os.path.join(args.scratch, "logs")
    os.makedirs(src, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    print(f"synced {sync_tree(src)} files into {src}", flush=True)

    baseline_failed = set()
    if not args.no_baseline:
        t = time.time()
        if build(src, bld, os.path.join(logs, "baseline.build")):
            print(f"baseline does not build: {logs}/baseline.build", file=sys.stderr)
            return 1
        failed, total = run_suite(bld, os.path.join(logs, "baseline.ctest"))
        if failed is None:
            print(f"baseline suite did not run: {logs}/baseline.ctest", file=sys.stderr)
            return 1
        baseline_failed = set(failed)
        print(f"baseline: {len(failed)} of {total} tests fail ({time.time() - t:.0f} s)"
              + (": " + ", ".join(failed) if failed else ""), flush=True)

    rows, bad = [], 0
    for name, what, path, old, new in chosen:
        t = time.time()
        target = os.path.join(src, path)
        with open(target) as f:
            original = f.read()
        count = original.count(old)
        if count != 1:
            rows.append((name, what, path, None, [], f"patch text found {count} times"))
            bad += 1
            print(f"{name}: does not apply ({count} matches of its text in {path})", flush=True)
            continue
        with open(target, "w") as f:
            f.write(original.replace(old, new))
        try:
            if build(src, bld, os.path.join(logs, name + ".build")):
                rows.append((name, what, path, None, [], "does not build"))
                bad += 1
                print(f"{name}: does not build ({logs}/{name}.build)", flush=True)
                continue
            failed, total = run_suite(bld, os.path.join(logs, name + ".ctest"), args.quick)
        finally:
            with open(target, "w") as f:
                f.write(original)
        if failed is None:
            rows.append((name, what, path, None, [], "suite did not run"))
            bad += 1
            continue
        caught = [x for x in failed if x not in baseline_failed]
        rows.append((name, what, path, len(caught), caught, ""))
        bad += not caught
        print(f"{name}: {len(caught)} of {total} tests fail ({time.time() - t:.0f} s)"
              + (": " + ", ".join(caught[:6]) + (" ..." if len(caught) > 6 else "")
                 if caught else "  <-- NOT CAUGHT"), flush=True)
    # Leave the scratch build matching the tree again.
    build(src, bld, os.path.join(logs, "restore.build"))

    write_table(rows, args.markdown)
    return 1 if bad else 0


def examples(caught, n=4):
    """Up to n failing tests, one per test suite first (Fixtures/Parity.X/llama3_gqa: Parity)."""
    def suite(t):
        return (t.split("/")[1] if t.startswith("Fixtures/") else t).split(".")[0]
    picked, suites = [], set()
    for t in caught:
        if suite(t) not in suites:
            suites.add(suite(t))
            picked.append(t)
    picked += [t for t in caught if t not in picked]
    return picked[:n]


def write_table(rows, markdown):
    table = ["| mutation | planted bug | failing CPU tests | examples |", "|---|---|---|---|"]
    for name, what, path, n, caught, note in rows:
        if n is None:
            table.append(f"| `{name}` | {what} (`{path}`) | {note} | |")
            continue
        ex = ", ".join(f"`{c}`" for c in examples(caught)) + (", ..." if len(caught) > 4 else "")
        table.append(f"| `{name}` | {what} (`{path}`) | {n if n else '**0: not caught**'} | {ex} |")
    print("\n".join(table))
    if markdown:
        with open(markdown, "w") as f:
            f.write("\n".join(table) + "\n")


def report(args, chosen):
    """The table again from the logs of an earlier run (no build, no tests)."""
    logs = os.path.join(args.scratch, "logs")
    base = os.path.join(logs, "baseline.ctest")
    baseline_failed = set(parse_ctest(base)[0] or []) if os.path.exists(base) else set()
    rows, bad = [], 0
    for name, what, path, _, _ in chosen:
        log = os.path.join(logs, name + ".ctest")
        failed = parse_ctest(log)[0] if os.path.exists(log) else None
        if failed is None:
            rows.append((name, what, path, None, [], "no finished run in " + logs))
            bad += 1
            continue
        caught = [x for x in failed if x not in baseline_failed]
        rows.append((name, what, path, len(caught), caught, ""))
        bad += not caught
    write_table(rows, args.markdown)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
