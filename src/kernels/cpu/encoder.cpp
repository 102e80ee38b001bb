#include "kernels/encoder.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

void encoder_attention(Tensor& out, const Tensor& qkv, const std::vector<int64_t>& starts,
                       const EncoderAttention& a) {
  check_rows("encoder_attention", out, "out");
  check_rows("encoder_attention", qkv, "qkv");
  const int64_t H = a.heads, D = a.head_dim, Q = H * D;
  ATOM_CHECK(H > 0 && D > 0 && qkv.size(1) == 3 * Q && out.size(1) == Q &&
                 out.size(0) == qkv.size(0) && starts.size() >= 2 && starts.front() == 0 &&
                 starts.back() == qkv.size(0),
             "encoder_attention: qkv {} out {}, {} heads of {}, {} sequence starts", qkv.str(),
             out.str(), H, D, starts.size());
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    ATOM_CHECK(starts[s] < starts[s + 1], "encoder_attention: sequence {} is empty", s);
  const DType qt = qkv.dtype(), ot = out.dtype();
  ParallelErrors errors;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t s0 = starts[s], len = starts[s + 1] - s0;
    // The sequence's q, k and v in F32, [len, Q] each.
    std::vector<float> qf(static_cast<size_t>(len * Q)), kf(qf.size()), vf(qf.size());
#pragma omp parallel for schedule(static) if (len * 3 * Q > kParallelMin)
    for (int64_t j = 0; j < len; ++j) {
      const char* row = row_ptr(qkv, s0 + j);
      for (int64_t c = 0; c < Q; ++c) {
        qf[j * Q + c] = load(row, qt, c);
        kf[j * Q + c] = load(row, qt, Q + c);
        vf[j * Q + c] = load(row, qt, 2 * Q + c);
      }
    }
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < len; ++i)
        errors.guard([&] {
          std::vector<float> o(static_cast<size_t>(D), 0.0f), p(static_cast<size_t>(len));
          const float* q = qf.data() + i * Q + h * D;
          float mx = -INFINITY;
          for (int64_t j = 0; j < len; ++j) {
            const float* k = kf.data() + j * Q + h * D;
            float dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
            p[j] = dot * a.scale;
            mx = std::max(mx, p[j]);
          }
          float sum = 0;
          for (int64_t j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int64_t j = 0; j < len; ++j) {
            const float* v = vf.data() + j * Q + h * D;
            const float pj = p[j] / sum;
            for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
          }
          char* orow = row_ptr(out, s0 + i);
          for (int64_t d = 0; d < D; ++d) store(orow, ot, h * D + d, o[d]);
        });
  }
  errors.rethrow();
}

void rotate_pairs(Tensor& x, const Tensor& cos, const Tensor& sin, int head_dim) {
  check_rows("rotate_pairs", x, "x");
  const int64_t T = x.size(0), pairs = head_dim / 2;
  ATOM_CHECK(head_dim > 0 && head_dim % 2 == 0 && x.size(1) % head_dim == 0 &&
                 cos.shape() == Shape({T, pairs}) && sin.shape() == cos.shape() &&
                 cos.dtype() == DType::kF32 && sin.dtype() == DType::kF32 && cos.is_contiguous() &&
                 sin.is_contiguous(),
             "rotate_pairs: x {} cos {} sin {} head_dim {}", x.str(), cos.str(), sin.str(),
             head_dim);
  const int64_t heads = x.size(1) / head_dim;
  const float* cs = cos.ptr<float>();
  const float* sn = sin.ptr<float>();
  const DType t = x.dtype();
#pragma omp parallel for schedule(static) if (T * x.size(1) > kParallelMin)
  for (int64_t r = 0; r < T; ++r) {
    char* row = row_ptr(x, r);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t m = 0; m < pairs; ++m) {
        const int64_t c0 = h * head_dim + 2 * m;
        const float re = load(row, t, c0), im = load(row, t, c0 + 1);
        const float c = cs[r * pairs + m], s = sn[r * pairs + m];
        store(row, t, c0, re * c - im * s);
        store(row, t, c0 + 1, re * s + im * c);
      }
  }
}

void gelu(Tensor& out, const Tensor& x, bool tanh_approx) {
  check_rows("gelu", out, "out");
  check_rows("gelu", x, "x");
  ATOM_CHECK(out.shape() == x.shape(), "gelu: {} -> {}", x.str(), out.str());
  const int64_t R = x.size(0), C = x.size(1);
#pragma omp parallel for schedule(static) if (R * C > kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const char* px = row_ptr(x, r);
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < C; ++c) {
      const float v = load(px, x.dtype(), c);
      const float g =
          tanh_approx
              ? 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)))
              : 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
      store(po, out.dtype(), c, g);
    }
  }
}

void gather_mean_rows(Tensor& out, const Tensor& x, const Tensor& indices, int n) {
  check_rows("gather_mean_rows", out, "out");
  check_rows("gather_mean_rows", x, "x");
  ATOM_CHECK(n > 0 && indices.dtype() == DType::kI32 && indices.is_contiguous() &&
                 indices.numel() == out.size(0) * n && out.size(1) == x.size(1),
             "gather_mean_rows: x {} indices {} out {} n {}", x.str(), indices.str(), out.str(), n);
  const int32_t* idx = indices.ptr<int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i)
    ATOM_CHECK(idx[i] >= 0 && idx[i] < x.size(0), "gather_mean_rows: index {} of {} rows", idx[i],
               x.size(0));
  const int64_t R = out.size(0), C = out.size(1);
  const float inv = 1.0f / static_cast<float>(n);
#pragma omp parallel for schedule(static) if (R * C * n > kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    char* po = row_ptr(out, r);
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0;
      for (int j = 0; j < n; ++j) acc += load(row_ptr(x, idx[r * n + j]), x.dtype(), c);
      store(po, out.dtype(), c, n == 1 ? acc : acc * inv);
    }
  }
}

}  // namespace atom::kernels::cpu
