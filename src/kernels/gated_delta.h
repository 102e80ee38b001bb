// Gated delta net ops (Qwen3-Next, Qwen3.5: transformers' Qwen3NextGatedDeltaNet), Kimi delta
// attention's rule (Kimi-Linear: transformers' KimiLinearDeltaAttention) and the sigmoid output
// gate of the Qwen full-attention layers: the CPU reference (kernels/cpu/gated_delta.cpp) and the
// CUDA kernels (kernels/cuda/gated_delta.cu), which compute the same values up to fp32 rounding.
//
// Per-request state lives in the state slot pool (layers/context.h, StateCacheSpec): a step's
// sequence s uses slot state_slots[s]; a sequence whose step starts at context index 0
// (context_lens[s] == its query length) is new, and its slot is reset first. Slot -1 marks a
// padding sequence (decode graphs' padding rows, a graph's warm-up run): no state is read or
// written and its outputs are zeros. With rollback slots (StateRows::rollback_slots) the state
// after each marked row is kept too (both backends; on CUDA the slots' values are not checked
// against the pool, which Batch::validate does on the host).
#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

// Which rows of a step belong to which sequence, and where their state lives (batch views).
struct StateRows {
  const Tensor& query_start;   // [S + 1] I32
  const Tensor& context_lens;  // [S] I32
  const Tensor& state_slots;   // [S] I32
  // The step's longest query, when the caller knows it (the batch's host copy); -1: unknown. On
  // CUDA, 1 skips the chunked kernel's launch (a decode step).
  int max_query_len = -1;
  // [T] I32 or empty (batch.state_rollback_slots): row r's state (after its token) is also
  // written to slot rollback_slots[r] when >= 0 (speculative decoding's verification rows; such a
  // sequence runs the recurrence token by token). The sequence's own slot still ends with the
  // state after its last row.
  const Tensor* rollback_slots = nullptr;
  bool has_rollback() const { return rollback_slots && rollback_slots->numel() > 0; }
};

// The delta rule's shape, and the chunk size of the chunked form used for prefill.
struct GatedDeltaArgs {
  int num_k_heads = 0, num_v_heads = 0;  // v-head h reads k-head h / (num_v_heads / num_k_heads)
  int k_dim = 0, v_dim = 0;
  // > 0: a sequence with more than one new token runs the chunked form (chunks of this many
  // tokens: the same values up to fp32 rounding, as transformers' torch_chunk_gated_delta_rule);
  // 0: every token through the recurrence.
  int chunk_size = 64;
};

// Kimi delta attention's shape: as many key as value heads, one head dim for q, k and v.
struct KdaArgs {
  int num_heads = 0, head_dim = 0;
  // > 0: a sequence with more than one new token runs the chunked form (transformers'
  // chunk_kimi_delta_attention, chunks of this many tokens); 0: every token through the
  // recurrence (recurrent_kimi_delta_attention).
  int chunk_size = 64;
  // < 0: GLM-5.3's safe gate, g = gate_lower_bound · sigmoid(exp(A_log) · (f + dt_bias)), in
  // (gate_lower_bound, 0); 0: Kimi's g = -exp(A_log) · softplus(f + dt_bias). Both backends.
  float gate_lower_bound = 0.0f;
};

// The activation of the gated RMSNorm's gate.
enum class NormGate {
  kSilu,     // Qwen3-Next: weight * rmsnorm(x) rounded to the activation dtype first, * silu(z)
  kSigmoid,  // Kimi-Linear (KimiLinearRMSNormGated): all in fp32, * sigmoid(z)
};

// The operand checks both backends make (shapes, row layouts, F32 parameters and state); each
// backend adds what its own kernels need besides.
void check_gated_delta_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& b, const Tensor& a, const Tensor& A_log,
                            const Tensor& dt_bias, const Tensor& state, const GatedDeltaArgs& args);
void check_kda_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                    const Tensor& v, const Tensor& f, const Tensor& b, const Tensor& A_log,
                    const Tensor& dt_bias, const Tensor& state, const KdaArgs& args);

namespace cpu {
// Depthwise causal conv1d with SiLU (kernel K, no bias): per channel c and token t,
//   out[t, c] = silu(Σ_{i<K} w[c, i] · x_{t-K+1+i}[c]),
// the K-1 inputs before a sequence's step coming from its conv state, which is left holding the
// last K-1 inputs (zeros before the first token).
//   out [T, C]   x [T, C] (rows may be strided)   w [C, K] F32
//   conv_state [slots, C, K-1] F32
void short_conv(Tensor& out, const Tensor& x, const Tensor& w, Tensor& conv_state,
                const StateRows& rows);
// The gated delta rule with transformers' gating: per token t and v-head h (k-head j),
//   q̂ = l2norm(q_t,j) · k_dim^-½,  k̂ = l2norm(k_t,j),  β = sigmoid(b_t,h),
//   g = -exp(A_log[h]) · softplus(a_t,h + dt_bias[h]),
//   S ← exp(g) S;  S ← S + k̂ ⊗ β (v_t,h − Sᵀk̂);  out_t,h = Sᵀq̂,
// S [k_dim, v_dim] in fp32, carried in the sequence's state slot.
//   out [T, Hv * v_dim]   q, k [T, Hk * k_dim]   v [T, Hv * v_dim]   b, a [T, Hv]
//   (inputs' rows may be strided)   A_log, dt_bias [Hv] F32   state [slots, Hv, k_dim, v_dim] F32
void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& b, const Tensor& a, const Tensor& A_log, const Tensor& dt_bias,
                      Tensor& state, const StateRows& rows, const GatedDeltaArgs& args);
// Kimi delta attention (KDA): the delta rule with a per-channel decay. Per token t and head h,
//   q̂ = l2norm(q_t,h) · d^-½,  k̂ = l2norm(k_t,h),  β = sigmoid(b_t,h),
//   g[c] = -exp(A_log[h]) · softplus(f_t,h[c] + dt_bias[h d + c])   (c < d),
//   S ← diag(exp(g)) S;  S ← S + k̂ ⊗ β (v_t,h − Sᵀk̂);  out_t,h = Sᵀq̂,
// S [d, d] in fp32 (rows indexed by the key channel), carried in the sequence's state slot.
//   out, q, k, v, f [T, H * d]   b [T, H]   (inputs' rows may be strided)
//   A_log [H] F32   dt_bias [H * d] F32   state [slots, H, d, d] F32
void kda_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& f,
              const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& state,
              const StateRows& rows, const KdaArgs& args);
// out = (w ⊙ rmsnorm(x)) · act(z) over each group of w.numel() channels (the gated RMSNorm).
//   out, x, z [T, N] (rows may be strided; out may alias x)   w [D], N % D == 0
void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                    NormGate gate = NormGate::kSilu);
// out = x · sigmoid(gate) elementwise.   out, x, gate [T, N] (rows may be strided; out may alias x)
void mul_sigmoid(Tensor& out, const Tensor& x, const Tensor& gate);
}  // namespace cpu

namespace cuda {
void short_conv(Tensor& out, const Tensor& x, const Tensor& w, Tensor& conv_state,
                const StateRows& rows);
void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& b, const Tensor& a, const Tensor& A_log, const Tensor& dt_bias,
                      Tensor& state, const StateRows& rows, const GatedDeltaArgs& args);
void kda_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& f,
              const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& state,
              const StateRows& rows, const KdaArgs& args);
void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                    NormGate gate);
void mul_sigmoid(Tensor& out, const Tensor& x, const Tensor& gate);
}  // namespace cuda

inline void short_conv(Tensor& out, const Tensor& x, const Tensor& w, Tensor& conv_state,
                       const StateRows& rows) {
  check_same_device("short_conv", out.device(), {&x, &w, &conv_state, &rows.state_slots});
  if (out.device().is_cpu()) return cpu::short_conv(out, x, w, conv_state, rows);
  ATOM_KERNEL_CUDA("short_conv", cuda::short_conv(out, x, w, conv_state, rows));
}

inline void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& b, const Tensor& a, const Tensor& A_log,
                             const Tensor& dt_bias, Tensor& state, const StateRows& rows,
                             const GatedDeltaArgs& args) {
  check_same_device("gated_delta_rule", out.device(),
                    {&q, &k, &v, &b, &a, &A_log, &dt_bias, &state, &rows.state_slots});
  if (out.device().is_cpu())
    return cpu::gated_delta_rule(out, q, k, v, b, a, A_log, dt_bias, state, rows, args);
  ATOM_KERNEL_CUDA("gated_delta_rule",
                   cuda::gated_delta_rule(out, q, k, v, b, a, A_log, dt_bias, state, rows, args));
}

inline void kda_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& f, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                     Tensor& state, const StateRows& rows, const KdaArgs& args) {
  check_same_device("kda_rule", out.device(),
                    {&q, &k, &v, &f, &b, &A_log, &dt_bias, &state, &rows.state_slots});
  if (out.device().is_cpu())
    return cpu::kda_rule(out, q, k, v, f, b, A_log, dt_bias, state, rows, args);
  ATOM_KERNEL_CUDA("kda_rule",
                   cuda::kda_rule(out, q, k, v, f, b, A_log, dt_bias, state, rows, args));
}

inline void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                           float eps, NormGate gate = NormGate::kSilu) {
  check_same_device("gated_rms_norm", out.device(), {&x, &z, &w});
  if (out.device().is_cpu()) return cpu::gated_rms_norm(out, x, z, w, eps, gate);
  ATOM_KERNEL_CUDA("gated_rms_norm", cuda::gated_rms_norm(out, x, z, w, eps, gate));
}

inline void mul_sigmoid(Tensor& out, const Tensor& x, const Tensor& gate) {
  check_same_device("mul_sigmoid", out.device(), {&x, &gate});
  if (out.device().is_cpu()) return cpu::mul_sigmoid(out, x, gate);
  ATOM_KERNEL_CUDA("mul_sigmoid", cuda::mul_sigmoid(out, x, gate));
}

}  // namespace atom::kernels
