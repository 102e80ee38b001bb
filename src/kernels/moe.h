// Mixture of experts: the router (which experts each token goes to, with what weight) and the
// fused experts (every token through its chosen experts, weighted and summed).
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/dispatch.h"

namespace atom::kernels {

// How router logits become (expert, weight) choices. The families:
//   softmax top-k (Qwen3-MoE, Mixtral with renormalize, Qwen3-Next):
//     p = softmax(logits); (w, idx) = topk(p, k); renormalize: w /= Σw
//   sigmoid + correction bias, group-limited (DeepSeek-V3, GLM-4.5, Kimi):
//     s = sigmoid(logits); c = s + correction_bias (the choice only)
//     n_group > 1: group score = sum of the top 2 (kTop2Sum) or the max (kMax) of c per group;
//       the topk_group best groups are kept, the other experts' c set to -inf (as transformers
//       5.17's DeepSeek-V3, GLM-4.5 and Kimi routers; DeepSeek-V2's softmax scores, masked to 0
//       there, are positive, so the choice is the same);
//     idx = topk(c, k); w = s[idx]; renormalize: w /= Σw
//   top-k then softmax (GPT-OSS): (v, idx) = topk(logits, k); w = softmax(v)
//   sqrt-softplus (DeepSeek-V4): s = sqrt(softplus(logits)), then as sigmoid (correction bias
//     for the choice only, no groups there; renormalize adds 1e-20 to the sum as transformers)
// then w *= routed_scaling_factor. Ties go to the lower expert index, on every device.
// With fixed_ids (DeepSeek-V4's hash layers: tid2eid of each token) the choices are given and only
// the weights are computed from the scores.
enum class RouterScoring : int {
  kSoftmax = 0,
  kSigmoid = 1,
  kTopKThenSoftmax = 2,
  kSqrtSoftplus = 3,
};
enum class GroupScore : int { kTop2Sum = 0, kMax = 1 };

struct RouterArgs {
  RouterScoring scoring = RouterScoring::kSoftmax;
  int top_k = 0;
  bool renormalize = false;
  int n_group = 1;     // experts split into n_group equal groups (1: no group limit)
  int topk_group = 1;  // groups kept
  GroupScore group_score = GroupScore::kTop2Sum;
  float routed_scaling_factor = 1.0f;
  // Fused shared experts: after the top_k routed choices, every token also goes to slots
  // shared_slot_first .. shared_slot_first + num_fused_shared - 1 with weight 1 (not scaled).
  int num_fused_shared = 0;
  int shared_slot_first = 0;
  // Expert parallelism: a routed choice e is written as slot e - local_first when this rank holds
  // the expert (local_first <= e < local_first + local_count), else as -1 with its weight (an
  // expert of another rank: fused_moe skips it). local_count -1: every expert, slot e.
  int local_first = 0;
  int local_count = -1;
  // EPLB's redundant replicas (expert parallelism): a routed choice of expert e in token row t
  // goes to physical expert replicas[e, t % replica_count[e]], which local_first / local_count
  // then map to this rank's slot or -1 (physical expert p lives on one rank, in slot p - its
  // first). replicas [E, R] I32 and replica_count [E] I32 (each in [1, R]) on the call's device;
  // expert_load [E] I64, when set, adds each routed choice of expert e (every rank routes every
  // token, so every rank counts the same).
  const Tensor* replicas = nullptr;
  const Tensor* replica_count = nullptr;
  Tensor* expert_load = nullptr;
  // The routed choices given per token row ([T, top_k] I32, each in [0, E)) instead of chosen by
  // score: DeepSeek-V4's hash routing. On CUDA an id outside [0, E) is written as -1.
  const Tensor* fixed_ids = nullptr;
};

// moe_route's argument rules, the same for every backend (an Error naming the tensor otherwise).
// Defined with the CPU reference; each backend adds its own limits.
void moe_route_check(const Tensor& topk_ids, const Tensor& topk_weights, const Tensor& logits,
                     const Tensor& correction_bias, const RouterArgs& a);

// Routes every token.
//   logits          [T, E] F32 (rows may be strided)
//   correction_bias [E] F32, or undefined (only with kSigmoid)
//   topk_ids        [T, top_k + num_fused_shared] I32, contiguous: routed choices in
//                   descending score order (ties: lower index first), then the shared slots
//   topk_weights    [T, top_k + num_fused_shared] F32, contiguous
// Every id written is a valid slot, or -1 for another rank's expert (RouterArgs::local_count),
// whatever the logits hold (NaN included).
namespace cpu {
void moe_route(Tensor& topk_ids, Tensor& topk_weights, const Tensor& logits,
               const Tensor& correction_bias, const RouterArgs& a);
}
namespace cuda {
void moe_route(Tensor& topk_ids, Tensor& topk_weights, const Tensor& logits,
               const Tensor& correction_bias, const RouterArgs& a);
}

inline void moe_route(Tensor& topk_ids, Tensor& topk_weights, const Tensor& logits,
                      const Tensor& correction_bias, const RouterArgs& a) {
  check_same_device("moe_route", topk_ids.device(),
                    {&topk_weights, &logits, &correction_bias, a.replicas, a.replica_count,
                     a.expert_load, a.fixed_ids});
  if (topk_ids.device().is_cpu())
    return cpu::moe_route(topk_ids, topk_weights, logits, correction_bias, a);
  ATOM_KERNEL_CUDA("moe_route",
                   cuda::moe_route(topk_ids, topk_weights, logits, correction_bias, a));
}

// The expert MLP's activation on its [gate | up] product (gate = the first half of w13's rows).

// The stacked expert weights of one layer on this rank (S slots: routed experts, then fused
// shared experts, then redundant copies). I may be padded past the checkpoint's width: the
// padding rows of w13 and columns of w2 are zero (their biases too), so they add nothing.
struct MoeExperts {
  const Tensor* w13 = nullptr;       // [S, 2 * I, H]: rows [0, I) gate, [I, 2I) up
  const Tensor* w2 = nullptr;        // [S, H, I]
  const Tensor* w13_bias = nullptr;  // [S, 2 * I] or null
  const Tensor* w2_bias = nullptr;   // [S, H] or null (each expert's output bias, weighted too)
  // MXFP4 experts (W4A16, CUDA only; the CPU reference dequantises at load): w13 and w2 then hold
  // U8 blocks, two e2m1 values a byte, the low nibble first: w13 [S, 2I, H/2], w2 [S, H, I/2];
  // the scales are U8 e8m0 exponents (value = e2m1 * 2^(e - 127)), one per 32 consecutive k,
  // stored k-group-major so that a tile's rows of one group are contiguous: w13_scales
  // [S, H/32, 2I], w2_scales [S, I/32, H]. Both set, or neither.
  //
  // FP8 experts (W8A16 on CUDA; the CPU computes the same weights in fp32, as its reference does
  // when it dequantises at load): w13 and w2 hold F8E4M3
  // codes [S, 2I, H] and [S, H, I], and the scales are F32 per block of fp8_block_n rows and
  // fp8_block_k columns (0: the whole row), w13_scales [S, 2I / bn, ceil(H / bk)] (2I a multiple
  // of bn: the gate rows' blocks, then the up rows') and w2_scales [S, ceil(H / bn), ceil(I / bk)];
  // weight = bf16(float(code) * scale), the value the loader writes when it dequantises the same
  // checkpoint at load. DeepSeek-V3's and Qwen3-FP8's 128x128 blocks; per-channel scales are
  // blocks of 1 row and the whole k.
  const Tensor* w13_scales = nullptr;
  const Tensor* w2_scales = nullptr;
  int fp8_block_n = 0, fp8_block_k = 0;
  Glu activation;  // act(gate, up) (kernels/activation.h)

  bool fp8() const { return w13 != nullptr && w13->dtype() == DType::kF8E4M3; }
  // FP8 scale blocks of b along an extent of n (b 0: one block, the whole extent).
  static int64_t fp8_blocks(int64_t n, int64_t b) { return b == 0 ? 1 : (n + b - 1) / b; }
  bool mxfp4() const { return !fp8() && (w13_scales != nullptr || w2_scales != nullptr); }
  bool quantized() const { return fp8() || mxfp4(); }
  int64_t hidden() const;        // H, from w2's rows
  int64_t intermediate() const;  // I, from w13's rows
};

// fused_moe's argument rules, as moe_route_check.
void fused_moe_check(const Tensor& out, const Tensor& x, const MoeExperts& w,
                     const Tensor& topk_ids, const Tensor& topk_weights);

// out [T, H] = Σ_j topk_weights[t, j] · (w2[e] · act(w13[e] · x[t] + b13[e]) + b2[e]),
// e = topk_ids[t, j]
//   x [T, H] (rows may be strided); topk_ids, topk_weights [T, K] as moe_route writes them (an
//   id of -1, an expert another rank holds, adds nothing)
//   workspace: scratch of fused_moe_workspace_bytes() bytes (U8), or null when that is 0
// Accumulates in fp32. The CPU sums each token's experts in j order.
namespace cpu {
void fused_moe(Tensor& out, const Tensor& x, const MoeExperts& w, const Tensor& topk_ids,
               const Tensor& topk_weights, Tensor* workspace);
}
namespace cuda {
void fused_moe(Tensor& out, const Tensor& x, const MoeExperts& w, const Tensor& topk_ids,
               const Tensor& topk_weights, Tensor* workspace);
// Bytes of scratch fused_moe needs for T tokens of K choices each.
int64_t fused_moe_workspace_bytes(int64_t num_tokens, int64_t k, const MoeExperts& w,
                                  DType act_dtype);
}  // namespace cuda

inline int64_t fused_moe_workspace_bytes(Device device, int64_t num_tokens, int64_t k,
                                         const MoeExperts& w, DType act_dtype) {
  if (device.is_cpu()) return 0;
#ifdef ATOM_HAVE_CUDA
  return cuda::fused_moe_workspace_bytes(num_tokens, k, w, act_dtype);
#else
  return 0;
#endif
}

inline void fused_moe(Tensor& out, const Tensor& x, const MoeExperts& w, const Tensor& topk_ids,
                      const Tensor& topk_weights, Tensor* workspace) {
  check_same_device("fused_moe", out.device(),
                    {&x, w.w13, w.w2, w.w13_bias, w.w2_bias, w.w13_scales, w.w2_scales, &topk_ids,
                     &topk_weights});
  if (out.device().is_cpu()) return cpu::fused_moe(out, x, w, topk_ids, topk_weights, workspace);
  ATOM_KERNEL_CUDA("fused_moe", cuda::fused_moe(out, x, w, topk_ids, topk_weights, workspace));
}

}  // namespace atom::kernels
