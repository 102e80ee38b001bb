// DeepSeek-V4.1's Engram read (layers/engram.h), its gate: for token t and stream j of the
// residual streams x [T, hc, H] F32, with kv = wkv(e) [T, (hc + 1) H] (hc keys, then v) in any
// float dtype (rows may be strided), in place:
//   g_j = <rms(k_j) ⊙ k_weight_j, rms(x_j) ⊙ q_weight_j> / √H,  rms(y) = y / √(mean y² + eps)
//   g_j = sign(g_j) · √max(|g_j|, 1e-6)
//   x_j += sigmoid(g_j) · v
// k_weight, q_weight [hc, H] F32. fp32 arithmetic.
#pragma once

#include "kernels/dispatch.h"

namespace atom::kernels {

inline void engram_gate_check(const Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                              const Tensor& q_weight) {
  ATOM_CHECK(streams.dtype() == DType::kF32 && streams.is_contiguous() && streams.dim() == 3,
             "engram_gate_add: streams {} must be contiguous F32 [T, hc, H]", streams.str());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  ATOM_CHECK(kv.dim() == 2 && kv.size(0) == T && kv.size(1) == (hc + 1) * H &&
                 (kv.size(1) <= 1 || kv.stride(1) == 1),
             "engram_gate_add: kv {} must be [{}, {}] with contiguous rows", kv.str(), T,
             (hc + 1) * H);
  for (const Tensor* w : {&k_weight, &q_weight})
    ATOM_CHECK(w->dtype() == DType::kF32 && w->is_contiguous() && w->shape() == Shape({hc, H}),
               "engram_gate_add: gain {} must be F32 [{}, {}]", w->str(), hc, H);
}

namespace cpu {
void engram_gate_add(Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                     const Tensor& q_weight, float eps);
}
namespace cuda {
void engram_gate_add(Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                     const Tensor& q_weight, float eps);
}

inline void engram_gate_add(Tensor& streams, const Tensor& kv, const Tensor& k_weight,
                            const Tensor& q_weight, float eps) {
  check_same_device("engram_gate_add", streams.device(), {&kv, &k_weight, &q_weight});
  if (streams.device().is_cpu()) return cpu::engram_gate_add(streams, kv, k_weight, q_weight, eps);
  ATOM_KERNEL_CUDA("engram_gate_add", cuda::engram_gate_add(streams, kv, k_weight, q_weight, eps));
}

}  // namespace atom::kernels
