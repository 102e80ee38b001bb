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

namespace {
// Keys per tile and query rows per work item of paged_attention.
constexpr int kKeyTile = 64;
constexpr int kQueryRows = 32;
}  // namespace

// One work item is (sequence, kv head, up to kQueryRows query tokens): it converts each tile of
// kKeyTile cached keys and values to floats once for all the item's query rows and the query
// heads sharing the kv head, and keeps a running maximum, denominator and output per query
// (flash attention's online softmax), so nothing grows with the context but the loop.
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
  ATOM_CHECK(v_cache.shape() == k_cache.shape() && v_cache.dtype() == k_cache.dtype(),
             "paged_attention: caches {} {}", k_cache.str(), v_cache.str());
  check_scales("paged_attention", a.kv_scales);
  const DType ct = k_cache.dtype();
  const KvScales sc = effective_scales(ct, a.kv_scales);  // each cached value times its scale
  const int group = Hq / Hk;
  const void* kc = k_cache.data();
  const void* vc = v_cache.data();
  const DType qt = q.dtype(), ot = out.dtype();
  std::vector<float> sink(static_cast<size_t>(Hq), -std::numeric_limits<float>::infinity());
  if (sinks.defined())
    for (int h = 0; h < Hq; ++h) sink[h] = load(sinks.data(), sinks.dtype(), h);

  struct Item {
    int s, kvh, t0, t1;
  };
  std::vector<Item> items;
  int64_t work = 0;
  for (int s = 0; s < S; ++s) {
    ATOM_CHECK(qs[s + 1] >= qs[s] && cl[s] >= qs[s + 1] - qs[s],
               "paged_attention: sequence {} has {} queries over a context of {}", s,
               qs[s + 1] - qs[s], cl[s]);
    for (int t0 = qs[s]; t0 < qs[s + 1]; t0 += kQueryRows)
      for (int kvh = 0; kvh < Hk; ++kvh)
        items.push_back({s, kvh, t0, std::min(qs[s + 1], t0 + kQueryRows)});
    work += static_cast<int64_t>(qs[s + 1] - qs[s]) * cl[s];
  }
  const int64_t n_items = static_cast<int64_t>(items.size());

#pragma omp parallel if (work * Hq * D > kParallelMin)
  {
    const size_t rows_max = static_cast<size_t>(kQueryRows) * group;
    std::vector<float> qv(rows_max * D), acc(rows_max * D), m(rows_max), l(rows_max);
    std::vector<float> kt(static_cast<size_t>(kKeyTile) * D), vt(kt.size()), p(kKeyTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const Item w = items[static_cast<size_t>(it)];
      const int L = cl[w.s], qlen = qs[w.s + 1] - qs[w.s];
      const int R = w.t1 - w.t0, NQ = R * group;
      // Query row i = r * group + g: token w.t0 + r, head w.kvh * group + g, at position qpos(r).
      auto qpos = [&](int r) { return a.causal ? L - qlen + (w.t0 + r - qs[w.s]) : L - 1; };
      auto lo_of = [&](int r) {
        return a.sliding_window > 0 ? std::max(0, qpos(r) - a.sliding_window + 1) : 0;
      };
      for (int r = 0; r < R; ++r) {
        const char* qr = row_ptr(q, w.t0 + r);
        for (int g = 0; g < group; ++g) {
          const int h = w.kvh * group + g, i = r * group + g;
          load_span(qr, qt, static_cast<int64_t>(h) * D, D, &qv[static_cast<size_t>(i) * D]);
          // A sink starts the softmax as one more logit with no value.
          m[i] = sink[h];
          l[i] = sinks.defined() ? 1.0f : 0.0f;
        }
      }
      std::fill(acc.begin(), acc.begin() + static_cast<ptrdiff_t>(NQ) * D, 0.0f);
      const int jlo = lo_of(0), jhi = qpos(R - 1);
      for (int j0 = jlo; j0 <= jhi; j0 += kKeyTile) {
        const int nk = std::min(kKeyTile, jhi - j0 + 1);
        for (int k = 0; k < nk; ++k) {
          const int j = j0 + k;
          const int64_t page = pid[pip[w.s] + j / bs];
          const int64_t base = ((page * bs + j % bs) * Hk + w.kvh) * D;
          float* kr = &kt[static_cast<size_t>(k) * D];
          float* vr = &vt[static_cast<size_t>(k) * D];
          load_span(kc, ct, base, D, kr);
          load_span(vc, ct, base, D, vr);
          for (int d = 0; d < D; ++d) {  // each cached value times its scale (1 unless FP8)
            kr[d] *= sc.k;
            vr[d] *= sc.v;
          }
        }
        for (int r = 0; r < R; ++r) {
          const int k_lo = std::max(lo_of(r), j0) - j0, k_hi = std::min(qpos(r), j0 + nk - 1) - j0;
          if (k_lo > k_hi) continue;
          for (int g = 0; g < group; ++g) {
            const int i = r * group + g;
            const float* qi = &qv[static_cast<size_t>(i) * D];
            float mt = m[i];
            for (int k = k_lo; k <= k_hi; ++k) {
              float x = dot(qi, &kt[static_cast<size_t>(k) * D], D) * a.scale;
              if (a.logit_softcap > 0) x = a.logit_softcap * std::tanh(x / a.logit_softcap);
              p[k] = x;
              mt = std::max(mt, x);
            }
            // The running sums rescaled to the new maximum (0 for the first tile without sinks).
            const float c = std::exp(m[i] - mt);
            float* ai = &acc[static_cast<size_t>(i) * D];
            float sum = 0;
            for (int d = 0; d < D; ++d) ai[d] *= c;
            for (int k = k_lo; k <= k_hi; ++k) {
              const float e = std::exp(p[k] - mt);
              sum += e;
              const float* vk = &vt[static_cast<size_t>(k) * D];
              for (int d = 0; d < D; ++d) ai[d] += e * vk[d];
            }
            l[i] = l[i] * c + sum;
            m[i] = mt;
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        char* orow = row_ptr(out, w.t0 + r);
        for (int g = 0; g < group; ++g) {
          const int h = w.kvh * group + g, i = r * group + g;
          const float inv = 1.0f / l[i];
          for (int d = 0; d < D; ++d)
            store(orow, ot, static_cast<int64_t>(h) * D + d,
                  acc[static_cast<size_t>(i) * D + d] * inv);
        }
      }
    }
  }
}

}  // namespace atom::kernels::cpu
