#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/dispatch.h"

namespace atom::kernels {

// The gated activations of the MLPs and experts, out = act(gate, up), all in fp32:
enum class MoeActivation : int {
  kSiluMul = 0,    // silu(gate) * up (transformers' layout)
  kSwigluOai = 1,  // GPT-OSS: g = min(gate, limit), u = clamp(up, -limit, limit),
                   // (u + 1) * g * sigmoid(alpha * g)
  // DeepSeek-V4, GLM-5.3 (swiglu_limit): silu(min(gate, limit)) * clamp(up, -limit, limit).
  kSiluMulClamped = 2,
  // Kimi-K3's SiTU (hidden_act "situ"): beta · tanh(gate / beta) · sigmoid(gate) times up, the up
  // soft-capped to linear_beta · tanh(up / linear_beta) when linear_beta > 0
  // (activation_situ_beta, activation_situ_linear_beta).
  kSitu = 3,
};

// An activation with its constants.
struct Glu {
  MoeActivation kind = MoeActivation::kSiluMul;
  float alpha = 1.702f;      // kSwigluOai
  float limit = 7.0f;        // kSwigluOai, kSiluMulClamped
  float beta = 1.0f;         // kSitu (> 0)
  float linear_beta = 0.0f;  // kSitu: 0 leaves up as it is

  static Glu silu() { return {}; }
  // limit > 0: kSiluMulClamped; else plain SiLU.
  static Glu silu_clamped(float limit) {
    Glu g;
    if (limit > 0.0f) {
      g.kind = MoeActivation::kSiluMulClamped;
      g.limit = limit;
    }
    return g;
  }
  static Glu situ(float beta, float linear_beta) {
    Glu g;
    g.kind = MoeActivation::kSitu;
    g.beta = beta;
    g.linear_beta = linear_beta;
    return g;
  }
};

// An Error naming `what` unless the constants fit the kind (finite; beta, limit positive).
inline void glu_check(const char* what, const Glu& a) {
  const int k = static_cast<int>(a.kind);
  ATOM_CHECK(k >= 0 && k <= 3, "{}: unknown activation {}", what, k);
  if (a.kind == MoeActivation::kSwigluOai || a.kind == MoeActivation::kSiluMulClamped)
    ATOM_CHECK(a.limit > 0.0f && std::isfinite(a.limit) && std::isfinite(a.alpha),
               "{}: clamped SwiGLU needs a finite positive limit, got {} (alpha {})", what, a.limit,
               a.alpha);
  if (a.kind == MoeActivation::kSitu)
    ATOM_CHECK(a.beta > 0.0f && std::isfinite(a.beta) && a.linear_beta >= 0.0f &&
                   std::isfinite(a.linear_beta),
               "{}: SiTU needs beta > 0 and linear_beta >= 0 (0: none), got {} and {}", what,
               a.beta, a.linear_beta);
}

// act(g, u) in fp32 as the CPU computes it (NaN passes through the clamps as min/max order it).
inline float glu_value(float g, float u, const Glu& a) {
  switch (a.kind) {
    case MoeActivation::kSiluMul:
      return g / (1.0f + std::exp(-g)) * u;
    case MoeActivation::kSwigluOai: {
      const float gc = std::min(g, a.limit), uc = std::clamp(u, -a.limit, a.limit);
      return (uc + 1.0f) * (gc / (1.0f + std::exp(-a.alpha * gc)));
    }
    case MoeActivation::kSiluMulClamped: {
      const float gc = std::min(g, a.limit);
      return gc / (1.0f + std::exp(-gc)) * std::clamp(u, -a.limit, a.limit);
    }
    case MoeActivation::kSitu: {
      const float sg = a.beta * std::tanh(g / a.beta) / (1.0f + std::exp(-g));
      return sg * (a.linear_beta > 0.0f ? a.linear_beta * std::tanh(u / a.linear_beta) : u);
    }
  }
  return 0.0f;
}

// out = act(g, u) with g = x[:, :I], u = x[:, I:]
//   out [M, I]    x [M, 2I]
namespace cpu {
void glu(Tensor& out, const Tensor& x, const Glu& a);
}
namespace cuda {
void glu(Tensor& out, const Tensor& x, const Glu& a);
}

inline void glu(Tensor& out, const Tensor& x, const Glu& a) {
  check_same_device("glu", out.device(), {&x});
  glu_check("glu", a);
  if (out.device().is_cpu()) return cpu::glu(out, x, a);
  ATOM_KERNEL_CUDA("glu", cuda::glu(out, x, a));
}

// silu(g) * u; limit > 0: the clamped SwiGLU of DeepSeek-V4 and GLM-5.3 (swiglu_limit),
// silu(min(g, limit)) * clamp(u, -limit, limit).
inline void silu_mul(Tensor& out, const Tensor& x, float limit = 0.0f) {
  glu(out, x, Glu::silu_clamped(limit));
}

}  // namespace atom::kernels
