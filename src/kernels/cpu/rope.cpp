#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

namespace {
void rotate(Tensor& x, int64_t t, int heads, const float* cs, const float* sn, const RopeArgs& a) {
  char* row = row_ptr(x, t);
  const DType dt = x.dtype();
  const int half = a.rot_dim / 2;
  for (int h = 0; h < heads; ++h) {
    const int64_t base = static_cast<int64_t>(h) * a.head_dim;
    for (int i = 0; i < half; ++i) {
      const int64_t i1 = base + (a.interleaved ? 2 * i : i);
      const int64_t i2 = base + (a.interleaved ? 2 * i + 1 : i + half);
      const float x1 = load(row, dt, i1), x2 = load(row, dt, i2);
      store(row, dt, i1, x1 * cs[i] - x2 * sn[i]);
      store(row, dt, i2, x2 * cs[i] + x1 * sn[i]);
    }
  }
}
}  // namespace

void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq,
          const RopeArgs& a) {
  check_rows("rope", q, "q");
  check_rows("rope", k, "k");
  const int64_t T = q.size(0);
  ATOM_CHECK(k.size(0) == T && positions.numel() == T, "rope: q {} k {} positions {}", q.str(),
             k.str(), positions.str());
  ATOM_CHECK(a.rot_dim > 0 && a.rot_dim % 2 == 0 && a.rot_dim <= a.head_dim &&
                 inv_freq.numel() == a.rot_dim / 2 && inv_freq.dtype() == DType::kF32,
             "rope: rot_dim {} head_dim {} inv_freq {}", a.rot_dim, a.head_dim, inv_freq.str());
  ATOM_CHECK(q.size(1) % a.head_dim == 0 && k.size(1) % a.head_dim == 0, "rope: widths");
  const int hq = static_cast<int>(q.size(1) / a.head_dim),
            hk = static_cast<int>(k.size(1) / a.head_dim);
  const int32_t* pos = positions.ptr<int32_t>();
  const float* f = inv_freq.ptr<float>();
  const int half = a.rot_dim / 2;
#pragma omp parallel if (T * (q.size(1) + k.size(1)) > kParallelMin)
  {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[t]) * f[i];  // fp32, as transformers
        cs[i] = std::cos(angle) * a.scale;
        sn[i] = std::sin(angle) * a.scale;
      }
      rotate(q, t, hq, cs.data(), sn.data(), a);
      rotate(k, t, hk, cs.data(), sn.data(), a);
    }
  }
}

void rope_kv_cache_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& inv_freq, const RopeArgs& a, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot_mapping, KvScales scales,
                         const QkNorm* norm) {
  if (norm) {
    cpu::rms_norm(q, q, nullptr, *norm->q_weight, norm->eps, norm->kind);
    cpu::rms_norm(k, k, nullptr, *norm->k_weight, norm->eps, norm->kind);
  }
  cpu::rope(q, k, positions, inv_freq, a);
  cpu::kv_cache_write(k_cache, v_cache, k, v, slot_mapping, scales);
}

}  // namespace atom::kernels::cpu
