// CUDA entry points of rms_norm, rope and kv_cache_write (kernels in rms_norm.cu and rope.cu).
#include "kernels/rms_norm.h"

#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda/host_common.h"
#include "kernels/cuda_tuning.h"
#include "kernels/rope.h"

namespace atom::kernels::cuda {

void rms_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& w, float eps,
              RmsNormKind kind) {
  check_rows("rms_norm", out, "out");
  check_rows("rms_norm", x, "x");
  const int64_t rows = x.size(0), width = x.size(1), dim = w.numel();
  ATOM_CHECK(dim > 0 && width % dim == 0 && out.size(0) == rows && out.size(1) == width &&
                 out.dtype() == x.dtype() && w.is_contiguous(),
             "rms_norm: x {} out {} w {}", x.str(), out.str(), w.str());
  const Mat res = residual ? residual_mat("rms_norm", *residual, x) : Mat{};
  launch_rms_norm(mat_of(out, "rms_norm"), mat_of(x, "rms_norm"), residual ? &res : nullptr,
                  w.data(), elem_of(w.dtype(), "rms_norm"), dim, eps, static_cast<int>(kind),
                  current_stream());
  launch_check("rms_norm");
}

namespace {
// Checks rope's arguments and fills the launch; false when there is nothing to do.
bool rope_prepare(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq,
                  const RopeArgs& a, RopeLaunch& l) {
  check_rows("rope", q, "q");
  check_rows("rope", k, "k");
  const int64_t T = q.size(0);
  ATOM_CHECK(
      k.size(0) == T && positions.numel() == T && is_i32(positions) && q.dtype() == k.dtype(),
      "rope: q {} k {} positions {}", q.str(), k.str(), positions.str());
  ATOM_CHECK(a.rot_dim > 0 && a.rot_dim % 2 == 0 && a.rot_dim <= a.head_dim &&
                 inv_freq.numel() == a.rot_dim / 2 && inv_freq.dtype() == DType::kF32,
             "rope: rot_dim {} head_dim {} inv_freq {}", a.rot_dim, a.head_dim, inv_freq.str());
  ATOM_CHECK(q.size(1) % a.head_dim == 0 && k.size(1) % a.head_dim == 0, "rope: widths {} {}",
             q.str(), k.str());
  l.q = mat_of(q, "rope");
  l.k = mat_of(k, "rope");
  l.positions = positions.ptr<int32_t>();
  l.inv_freq = inv_freq.ptr<float>();
  l.head_dim = a.head_dim;
  l.rot_dim = a.rot_dim;
  l.scale = a.scale;
  l.interleaved = a.interleaved;
  return T > 0;
}
}  // namespace

void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq,
          const RopeArgs& a) {
  RopeLaunch l;
  if (!rope_prepare(q, k, positions, inv_freq, a, l)) return;
  launch_rope(l, current_stream());
  launch_check("rope");
}

namespace {
// The FP8 form of a cache write: on for F8E4M3 caches (with checked scales), off otherwise.
KvFp8 kv_fp8_of(const char* op, const Tensor& k_cache, KvScales s) {
  KvFp8 f;
  if (k_cache.dtype() != DType::kF8E4M3) return f;
  ATOM_CHECK(std::isfinite(s.k) && s.k > 0 && std::isfinite(s.v) && s.v > 0,
             "{}: kv scales k {} v {} must be positive and finite", op, s.k, s.v);
  f.on = true;
  f.k_scale = s.k;
  f.v_scale = s.v;
  return f;
}
}  // namespace

void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& slot_mapping, KvScales scales) {
  check_rows("kv_cache_write", k, "k");
  check_rows("kv_cache_write", v, "v");
  ATOM_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                 v_cache.shape() == k_cache.shape() && v_cache.dtype() == k_cache.dtype(),
             "kv_cache_write: caches {} {}", k_cache.str(), v_cache.str());
  const int64_t width = k_cache.size(2) * k_cache.size(3);
  const int64_t T = k.size(0);
  ATOM_CHECK(k.size(1) == width && v.size(1) == width && v.size(0) == T &&
                 slot_mapping.numel() == T && is_i32(slot_mapping),
             "kv_cache_write: k {} v {} slots {} for cache {}", k.str(), v.str(),
             slot_mapping.str(), k_cache.str());
  ATOM_CHECK(
      (k.dtype() == k_cache.dtype() || k_cache.dtype() == DType::kF8E4M3) && v.dtype() == k.dtype(),
      "kv_cache_write: k {} and v {} must have the cache's dtype {} (or an F8_E4M3 cache) "
      "on CUDA",
      k.str(), v.str(), k_cache.str());
  launch_kv_cache_write(k_cache.data(), v_cache.data(), k_cache.size(0) * k_cache.size(1),
                        mat_of(k, "kv_cache_write"), mat_of(v, "kv_cache_write"),
                        slot_mapping.ptr<int32_t>(), kv_fp8_of("kv_cache_write", k_cache, scales),
                        current_stream());
  launch_check("kv_cache_write");
}

void rope_kv_cache_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                         const Tensor& inv_freq, const RopeArgs& a, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot_mapping, KvScales scales,
                         const QkNorm* norm) {
  check_rows("rope_kv_cache_write", v, "v");
  ATOM_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                 v_cache.shape() == k_cache.shape() &&
                 (k_cache.dtype() == q.dtype() || k_cache.dtype() == DType::kF8E4M3) &&
                 v_cache.dtype() == k_cache.dtype() && v.dtype() == q.dtype(),
             "rope_kv_cache_write: caches {} {} for q {} v {}", k_cache.str(), v_cache.str(),
             q.str(), v.str());
  ATOM_CHECK(k.size(1) == k_cache.size(2) * k_cache.size(3) && v.size(1) == k.size(1) &&
                 v.size(0) == k.size(0) && slot_mapping.numel() == k.size(0) &&
                 is_i32(slot_mapping),
             "rope_kv_cache_write: k {} v {} slots {} for cache {}", k.str(), v.str(),
             slot_mapping.str(), k_cache.str());
  RopeLaunch l;
  if (!rope_prepare(q, k, positions, inv_freq, a, l)) return;
  l.k_cache = k_cache.data();
  l.v_cache = v_cache.data();
  l.num_slots = k_cache.size(0) * k_cache.size(1);
  l.v = mat_of(v, "rope_kv_cache_write");
  l.slot_mapping = slot_mapping.ptr<int32_t>();
  const KvFp8 f = kv_fp8_of("rope_kv_cache_write", k_cache, scales);
  l.cache_fp8 = f.on;
  l.k_scale = f.k_scale;
  l.v_scale = f.v_scale;
  if (norm) {
    const Tensor &qw = *norm->q_weight, &kw = *norm->k_weight;
    ATOM_CHECK(qw.numel() == a.head_dim && kw.numel() == a.head_dim && qw.is_contiguous() &&
                   kw.is_contiguous() && qw.dtype() == kw.dtype(),
               "rope_kv_cache_write: q norm {} and k norm {} for heads of {}", qw.str(), kw.str(),
               a.head_dim);
    if (cuda_tuning().fuse_qk_norm_rope) {
      l.q_norm = qw.data();
      l.k_norm = kw.data();
      l.norm_type = elem_of(qw.dtype(), "rope_kv_cache_write");
      l.norm_eps = norm->eps;
      l.norm_kind = static_cast<int>(norm->kind);
    } else {
      cuda::rms_norm(q, q, nullptr, qw, norm->eps, norm->kind);
      cuda::rms_norm(k, k, nullptr, kw, norm->eps, norm->kind);
    }
  }
  launch_rope(l, current_stream());
  launch_check("rope_kv_cache_write");
}

}  // namespace atom::kernels::cuda
