#pragma once

#include "kernels/attention.h"
#include "kernels/dispatch.h"
#include "kernels/rms_norm.h"

namespace atom::kernels {

// Rotary embedding, in place, on the first `rot_dim` channels of each head of q and k.
//   q [T, Hq * head_dim], k [T, Hk * head_dim]  (rows may be strided)
//   positions [T] I32
//   inv_freq  [rot_dim / 2] F32     angle = float(pos) * inv_freq[i], computed in fp32
//   scale: multiplies cos and sin (YaRN's attention factor)
//   interleaved: rotate pairs (2i, 2i+1) (GPT-J) instead of halves (i, i + rot_dim/2) (NeoX)
struct RopeArgs {
  int head_dim = 0;
  int rot_dim = 0;
  float scale = 1.0f;
  bool interleaved = false;
};

namespace cpu {
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, const RopeArgs& a);
}
namespace cuda {
void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, const RopeArgs& a);
}

inline void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq,
                 const RopeArgs& a) {
  check_same_device("rope", q.device(), {&k, &positions, &inv_freq});
  if (q.device().is_cpu()) return cpu::rope(q, k, positions, inv_freq, a);
  ATOM_KERNEL_CUDA("rope", cuda::rope(q, k, positions, inv_freq, a));
}

// Per-head RMSNorm of q and k before the rotation (Qwen3's q_norm and k_norm): every head_dim-wide
// head of q normalised with q_weight, of k with k_weight, as rms_norm(q, q, nullptr, q_weight,
// eps, kind) and the same on k would.
struct QkNorm {
  const Tensor* q_weight = nullptr;  // [head_dim]
  const Tensor* k_weight = nullptr;  // [head_dim]
  float eps = 0.0f;
  RmsNormKind kind = RmsNormKind::kLlama;
};

// rope(q, k) followed by kv_cache_write(k_cache, v_cache, k, v, slot_mapping, scales), in one
// kernel on CUDA (the rotated keys go to the cache without another pass), with the per-head
// norms first when `norm` is given (in the same kernel where the vectorised RoPE applies: 16-bit
// q and cache, half-split rotation of whole heads). Shapes as in rope and kv_cache_write
// (kernels/attention.h).
namespace cpu {
void rope_kv_cache_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& inv_freq, const RopeArgs& a, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot_mapping, KvScales scales = {},
                         const QkNorm* norm = nullptr);
}
namespace cuda {
void rope_kv_cache_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& inv_freq, const RopeArgs& a, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot_mapping, KvScales scales = {},
                         const QkNorm* norm = nullptr);
}

inline void rope_kv_cache_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                                const Tensor& inv_freq, const RopeArgs& a, Tensor& k_cache,
                                Tensor& v_cache, const Tensor& slot_mapping, KvScales scales = {},
                                const QkNorm* norm = nullptr) {
  check_same_device("rope_kv_cache_write", q.device(),
                    {&k, &v, &positions, &inv_freq, &k_cache, &v_cache, &slot_mapping});
  if (norm) {
    ATOM_CHECK(norm->q_weight && norm->k_weight, "rope_kv_cache_write: q and k norm weights");
    check_same_device("rope_kv_cache_write", q.device(), {norm->q_weight, norm->k_weight});
  }
  if (q.device().is_cpu())
    return cpu::rope_kv_cache_write(q, k, v, positions, inv_freq, a, k_cache, v_cache, slot_mapping,
                                    scales, norm);
  ATOM_KERNEL_CUDA("rope_kv_cache_write",
                   cuda::rope_kv_cache_write(q, k, v, positions, inv_freq, a, k_cache, v_cache,
                                             slot_mapping, scales, norm));
}

}  // namespace atom::kernels
