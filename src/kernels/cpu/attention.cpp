#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

namespace {
// The scale an FP8 cache applies (1 for every other dtype, whose values are stored as they are).
void check_scales(const char* op, KvScales s) {
  ATOM_CHECK(std::isfinite(s.k) && s.k > 0 && std::isfinite(s.v) && s.v > 0,
             "{}: kv scales k {} v {} must be positive and finite", op, s.k, s.v);
}
KvScales effective_scales(DType cache, KvScales s) {
  return cache == DType::kF8E4M3 ? s : KvScales{};
}
}  // namespace

void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& slot_mapping, KvScales scales) {
  check_rows("kv_cache_write", k, "k");
  check_rows("kv_cache_write", v, "v");
  ATOM_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.shape() == k_cache.shape(),
             "kv_cache_write: caches {} {}", k_cache.str(), v_cache.str());
  const int64_t pages = k_cache.size(0), bs = k_cache.size(1);
  const int64_t width = k_cache.size(2) * k_cache.size(3);
  const int64_t T = k.size(0);
  ATOM_CHECK(k.size(1) == width && v.size(1) == width && slot_mapping.numel() == T,
             "kv_cache_write: k {} v {} for cache {}", k.str(), v.str(), k_cache.str());
  ATOM_CHECK(v_cache.dtype() == k_cache.dtype(), "kv_cache_write: caches {} {}", k_cache.str(),
             v_cache.str());
  check_scales("kv_cache_write", scales);
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  const DType ct = k_cache.dtype();
  // Division, as vLLM's FP8 cache write (x / scale, then a saturating round to e4m3).
  const KvScales sc = effective_scales(ct, scales);
  ParallelErrors errors;
#pragma omp parallel for schedule(static) if (T * width > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    errors.guard([&] {
      const int64_t slot = slots[t];
      if (slot < 0) return;
      ATOM_CHECK(slot < pages * bs, "kv_cache_write: slot {} beyond {} pages", slot, pages);
      const char* kr = row_ptr(k, t);
      const char* vr = row_ptr(v, t);
      for (int64_t i = 0; i < width; ++i) {
        store(k_cache.data(), ct, slot * width + i, load(kr, k.dtype(), i) / sc.k);
        store(v_cache.data(), ct, slot * width + i, load(vr, v.dtype(), i) / sc.v);
      }
    });
  }
  errors.rethrow();
}

void paged_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, const Tensor& sinks, const AttentionArgs& a) {
  check_rows("paged_attention", out, "out");
  check_rows("paged_attention", q, "q");
  const int Hq = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim;
  ATOM_CHECK(Hq > 0 && Hk > 0 && Hq % Hk == 0, "paged_attention: {} heads over {} kv heads", Hq,
             Hk);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(Hq) * D && out.size(1) == q.size(1) &&
                 out.size(0) == q.size(0),
             "paged_attention: q {} out {}", q.str(), out.str());
  ATOM_CHECK(k_cache.dim() == 4 && k_cache.size(2) == Hk && k_cache.size(3) == D,
             "paged_attention: cache {} for {} kv heads of {}", k_cache.str(), Hk, D);
  ATOM_CHECK(!sinks.defined() || sinks.numel() == Hq, "paged_attention: sinks {}", sinks.str());
  const int64_t bs = k_cache.size(1);
  const int32_t* qs = b.query_start->ptr<int32_t>();
  const int32_t* cl = b.context_lens->ptr<int32_t>();
  const int32_t* pip = b.page_indptr->ptr<int32_t>();
  const int32_t* pid = b.page_indices->ptr<int32_t>();
  const int S = static_cast<int>(b.context_lens->numel());
  const int64_t T = q.size(0);
  std::vector<int> seq_of(static_cast<size_t>(T));
  for (int s = 0; s < S; ++s)
    for (int t = qs[s]; t < qs[s + 1]; ++t) seq_of[t] = s;
  ATOM_CHECK(v_cache.shape() == k_cache.shape() && v_cache.dtype() == k_cache.dtype(),
             "paged_attention: caches {} {}", k_cache.str(), v_cache.str());
  check_scales("paged_attention", a.kv_scales);
  const DType ct = k_cache.dtype();
  const KvScales sc = effective_scales(ct, a.kv_scales);  // each cached value times its scale
  const int group = Hq / Hk;

#pragma omp parallel if (T * Hq * D * 16 > kParallelMin)
  {
    std::vector<float> scores, acc(static_cast<size_t>(D)), qv(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 4)
    for (int64_t th = 0; th < T * Hq; ++th) {
      const int64_t t = th / Hq;
      const int h = static_cast<int>(th % Hq), kvh = h / group;
      const int s = seq_of[t];
      const int L = cl[s], qlen = qs[s + 1] - qs[s];
      const int qpos = L - qlen + static_cast<int>(t - qs[s]);
      const int lo = a.sliding_window > 0 ? std::max(0, qpos - a.sliding_window + 1) : 0;
      const char* qr = row_ptr(q, t);
      for (int d = 0; d < D; ++d) qv[d] = load(qr, q.dtype(), static_cast<int64_t>(h) * D + d);
      scores.assign(static_cast<size_t>(qpos - lo + 1), 0.0f);
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = lo; j <= qpos; ++j) {
        const int64_t page = pid[pip[s] + j / bs];
        const int64_t base = ((page * bs + j % bs) * Hk + kvh) * D;
        float dot = 0;
        for (int d = 0; d < D; ++d) dot += qv[d] * (load(k_cache.data(), ct, base + d) * sc.k);
        float sc = dot * a.scale;
        if (a.logit_softcap > 0) sc = a.logit_softcap * std::tanh(sc / a.logit_softcap);
        scores[j - lo] = sc;
        mx = std::max(mx, sc);
      }
      const float sink = sinks.defined() ? load(sinks.data(), sinks.dtype(), h) : 0.0f;
      if (sinks.defined()) mx = std::max(mx, sink);
      float denom = sinks.defined() ? std::exp(sink - mx) : 0.0f;
      for (auto& sc : scores) {
        sc = std::exp(sc - mx);
        denom += sc;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = lo; j <= qpos; ++j) {
        const int64_t page = pid[pip[s] + j / bs];
        const int64_t base = ((page * bs + j % bs) * Hk + kvh) * D;
        const float p = scores[j - lo] / denom;
        for (int d = 0; d < D; ++d) acc[d] += p * (load(v_cache.data(), ct, base + d) * sc.v);
      }
      char* orow = row_ptr(out, t);
      for (int d = 0; d < D; ++d) store(orow, out.dtype(), static_cast<int64_t>(h) * D + d, acc[d]);
    }
  }
}

}  // namespace atom::kernels::cpu
