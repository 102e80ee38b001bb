#include "kernels/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels {

void indexer_cache_check(const char* op, const Tensor& topk, const Tensor& key_cache,
                         const IndexerArgs& a, const IndexerPlanes& p) {
  const int64_t D = a.head_dim, T = topk.size(0);
  const bool fp4 = a.key_format == IndexKeyFormat::kFp4;
  const int64_t width = a.key_format == IndexKeyFormat::kPlain ? D
                        : fp4                                  ? D / 2
                                                               : index_fp8_row_bytes(D);
  ATOM_CHECK(key_cache.dim() == 4 && key_cache.is_contiguous() && key_cache.size(2) == 1 &&
                 key_cache.size(3) == width &&
                 (a.key_format == IndexKeyFormat::kPlain) == (key_cache.dtype() != DType::kU8),
             "{}: key cache {} must be [num_pages, rows, 1, {}] ({})", op, key_cache.str(), width,
             a.key_format == IndexKeyFormat::kPlain ? "of a float dtype"
             : fp4                                  ? "U8 fp4 codes"
                                                    : "U8 fp8 codes and scales");
  ATOM_CHECK(!fp4 || D % 32 == 0, "{}: fp4 keys of {}: not a multiple of 32", op, D);
  ATOM_CHECK(fp4 == (p.key_scales != nullptr), "{}: fp4 keys need their scales, other keys none",
             op);
  if (fp4)
    ATOM_CHECK(p.key_scales->dtype() == DType::kU8 && p.key_scales->is_contiguous() &&
                   p.key_scales->dim() == 4 && p.key_scales->size(0) == key_cache.size(0) &&
                   p.key_scales->size(1) == key_cache.size(1) && p.key_scales->size(3) == D / 32,
               "{}: fp4 scales {} for keys {}: U8 [.., {}]", op, p.key_scales->str(),
               key_cache.str(), D / 32);
  for (const Tensor* c : {p.candidates_in, static_cast<const Tensor*>(p.candidates_out)})
    if (c)
      ATOM_CHECK(a.candidate_block > 0 && c->dtype() == DType::kI32 && c->is_contiguous() &&
                     c->dim() == 2 && c->size(0) == T && c->size(1) > 0,
                 "{}: candidate blocks {} (blocks of {} rows) must be I32 [{}, C]", op, c->str(),
                 a.candidate_block, T);
}

}  // namespace atom::kernels

namespace atom::kernels::cpu {

namespace {

// Rotates R channels of `row` starting at element `base` by the angles whose cos/sin are given.
void rotate(char* row, DType dt, int64_t base, int R, bool interleaved, const float* cs,
            const float* sn) {
  const int half = R / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t i1 = base + (interleaved ? 2 * i : i);
    const int64_t i2 = base + (interleaved ? 2 * i + 1 : i + half);
    const float x1 = load(row, dt, i1), x2 = load(row, dt, i2);
    store(row, dt, i1, x1 * cs[i] - x2 * sn[i]);
    store(row, dt, i2, x2 * cs[i] + x1 * sn[i]);
  }
}

void check_one_row_cache(const char* op, const Tensor& cache, int64_t width) {
  ATOM_CHECK(
      cache.dim() == 4 && cache.is_contiguous() && cache.size(2) == 1 && cache.size(3) == width,
      "{}: cache {} must be [num_pages, block_size, 1, {}]", op, cache.str(), width);
}

// Each token's sequence and its context index (the position its query sits at).
struct TokenSeqs {
  std::vector<int> seq, index;
};
TokenSeqs token_seqs(const AttentionBatch& b, int64_t T) {
  const int32_t* qs = b.query_start->ptr<int32_t>();
  const int32_t* cl = b.context_lens->ptr<int32_t>();
  const int S = static_cast<int>(b.context_lens->numel());
  ATOM_CHECK(b.query_start->numel() == S + 1 && qs[S] == T, "attention batch: {} tokens, {} seqs",
             T, S);
  TokenSeqs r;
  r.seq.resize(static_cast<size_t>(T));
  r.index.resize(static_cast<size_t>(T));
  for (int s = 0; s < S; ++s)
    for (int t = qs[s]; t < qs[s + 1]; ++t) {
      r.seq[t] = s;
      r.index[t] = cl[s] - (qs[s + 1] - qs[s]) + (t - qs[s]);
    }
  return r;
}

// Element offset of context position j's row in a one-row-per-token cache.
inline int64_t row_base(const int32_t* pip, const int32_t* pid, int s, int j, int64_t bs,
                        int64_t width) {
  const int64_t page = pid[pip[s] + j / bs];
  return (page * bs + j % bs) * width;
}

// An indexer's score of one key: Σ_h (w_h · weights_scale) · relu(scale · q_h · key), heads and
// channels in ascending order (the CUDA score kernel sums in the same order).
float index_score(const float* qv, const float* w, const float* key, int heads, int dim,
                  float scale, float weights_scale) {
  float sum = 0;
  for (int h = 0; h < heads; ++h) {
    float dot = 0;
    for (int d = 0; d < dim; ++d) dot += qv[static_cast<size_t>(h) * dim + d] * key[d];
    sum += (w[h] * weights_scale) * std::max(dot * scale, 0.0f);
  }
  return sum;
}

// order[0, keep) = the indices of the keep best scores: descending score, the lower index first
// on ties, NaN scores last. keep <= score.size().
void top_by_score(const std::vector<float>& score, int keep, std::vector<int>& order) {
  order.resize(score.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int x, int y) {
    const bool nx = std::isnan(score[x]), ny = std::isnan(score[y]);
    if (nx != ny) return ny;
    if (!nx && score[x] != score[y]) return score[x] > score[y];
    return x < y;
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
}

}  // namespace

void cache_rows_write(Tensor& cache, const Tensor& rows, const Tensor& slot_mapping) {
  check_rows("cache_rows_write", rows, "rows");
  const int64_t W = rows.size(1), T = rows.size(0);
  check_one_row_cache("cache_rows_write", cache, W);
  ATOM_CHECK(slot_mapping.numel() == T && slot_mapping.dtype() == DType::kI32,
             "cache_rows_write: slot_mapping {} for {} rows", slot_mapping.str(), T);
  const int64_t slots_total = cache.size(0) * cache.size(1);
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  const DType ct = cache.dtype();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    ATOM_CHECK(slot < slots_total, "cache_rows_write: slot {} beyond {} slots", slot, slots_total);
    const char* r = row_ptr(rows, t);
    for (int64_t i = 0; i < W; ++i) store(cache.data(), ct, slot * W + i, load(r, rows.dtype(), i));
  }
}

void mla_rope_cache_write(Tensor& q, Tensor& kv, const Tensor& positions, const Tensor& inv_freq,
                          const MlaRopeArgs& a, Tensor& latent_cache, const Tensor& slot_mapping) {
  check_rows("mla_rope_cache_write", q, "q");
  check_rows("mla_rope_cache_write", kv, "kv");
  const int H = a.num_heads, N = a.nope_dim, R = a.rope_dim, L = a.latent_dim;
  const int64_t T = q.size(0);
  // R 0: no rope channels (GLM-5.3's NoPE latent attention): the rows are written as they are.
  ATOM_CHECK(H > 0 && N >= 0 && R >= 0 && R % 2 == 0 && L > 0,
             "mla_rope_cache_write: {} heads, nope {} rope {} latent {}", H, N, R, L);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(H) * (N + R) && kv.size(0) == T &&
                 kv.size(1) == L + R && positions.numel() == T,
             "mla_rope_cache_write: q {} kv {} positions {} for {} heads of {} + {}, latent {}",
             q.str(), kv.str(), positions.str(), H, N, R, L);
  ATOM_CHECK(inv_freq.numel() == R / 2 && inv_freq.dtype() == DType::kF32,
             "mla_rope_cache_write: inv_freq {} for rope dim {}", inv_freq.str(), R);
  const int32_t* pos = positions.ptr<int32_t>();
  const float* f = inv_freq.ptr<float>();
#pragma omp parallel if (T * q.size(1) > kParallelMin)
  {
    std::vector<float> cs(static_cast<size_t>(R / 2)), sn(static_cast<size_t>(R / 2));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < R / 2; ++i) {
        const float angle = static_cast<float>(pos[t]) * f[i];  // fp32, as transformers
        cs[i] = std::cos(angle) * a.scale;
        sn[i] = std::sin(angle) * a.scale;
      }
      char* qr = row_ptr(q, t);
      for (int h = 0; h < H; ++h)
        rotate(qr, q.dtype(), static_cast<int64_t>(h) * (N + R) + N, R, a.interleaved, cs.data(),
               sn.data());
      rotate(row_ptr(kv, t), kv.dtype(), L, R, a.interleaved, cs.data(), sn.data());
    }
  }
  cache_rows_write(latent_cache, kv, slot_mapping);
}

void mla_paged_attention(Tensor& out, const Tensor& q, const Tensor& latent_cache,
                         const AttentionBatch& b, const Tensor& topk, const MlaArgs& a) {
  check_rows("mla_paged_attention", out, "out");
  check_rows("mla_paged_attention", q, "q");
  const int H = a.num_heads, L = a.latent_dim, R = a.rope_dim, W = L + R;
  const int64_t T = q.size(0);
  ATOM_CHECK(H > 0 && L > 0 && R >= 0, "mla_paged_attention: {} heads, latent {} rope {}", H, L, R);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(H) * W && out.size(0) == T &&
                 out.size(1) == static_cast<int64_t>(H) * L,
             "mla_paged_attention: q {} out {} for {} heads of {} + {}", q.str(), out.str(), H, L,
             R);
  check_one_row_cache("mla_paged_attention", latent_cache, W);
  int64_t K = 0;
  if (topk.defined()) {
    ATOM_CHECK(
        topk.dim() == 2 && topk.size(0) == T && topk.is_contiguous() && topk.dtype() == DType::kI32,
        "mla_paged_attention: topk {} must be contiguous I32 [{}, K]", topk.str(), T);
    K = topk.size(1);
  }
  const TokenSeqs ts = token_seqs(b, T);
  const int32_t* pip = b.page_indptr->ptr<int32_t>();
  const int32_t* pid = b.page_indices->ptr<int32_t>();
  const int64_t bs = latent_cache.size(1);
  const DType ct = latent_cache.dtype();
  const void* cache = latent_cache.data();
  const int32_t* sel = topk.defined() ? topk.ptr<int32_t>() : nullptr;
  for (int64_t t = 0; sel && t < T; ++t)  // checked here: nothing may throw inside the team
    for (int64_t k = 0; k < K; ++k)
      ATOM_CHECK(sel[t * K + k] <= ts.index[t],
                 "mla_paged_attention: token {} selects position {} beyond its own {}", t,
                 sel[t * K + k], ts.index[t]);

#pragma omp parallel if (T * H * W * 16 > kParallelMin)
  {
    std::vector<float> qv(static_cast<size_t>(W)), acc(static_cast<size_t>(L)), scores, row(W);
    std::vector<int> keys;
#pragma omp for schedule(dynamic, 4)
    for (int64_t th = 0; th < T * H; ++th) {
      const int64_t t = th / H;
      const int h = static_cast<int>(th % H);
      const int s = ts.seq[t], qpos = ts.index[t];
      keys.clear();
      if (sel) {
        for (int64_t k = 0; k < K; ++k) {
          const int j = sel[t * K + k];
          if (j >= 0) keys.push_back(j);
        }
      } else {
        keys.resize(static_cast<size_t>(qpos + 1));
        std::iota(keys.begin(), keys.end(), 0);
      }
      const char* qr = row_ptr(q, t);
      for (int d = 0; d < W; ++d) qv[d] = load(qr, q.dtype(), static_cast<int64_t>(h) * W + d);
      scores.resize(keys.size());
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t k = 0; k < keys.size(); ++k) {
        const int64_t base = row_base(pip, pid, s, keys[k], bs, W);
        float dot = 0;
        for (int d = 0; d < W; ++d) dot += qv[d] * load(cache, ct, base + d);
        scores[k] = dot * a.scale;
        mx = std::max(mx, scores[k]);
      }
      float denom = 0;
      for (auto& v : scores) denom += (v = std::exp(v - mx));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t k = 0; k < keys.size(); ++k) {
        const int64_t base = row_base(pip, pid, s, keys[k], bs, W);
        const float p = scores[k] / denom;
        for (int d = 0; d < L; ++d) acc[d] += p * load(cache, ct, base + d);
      }
      char* orow = row_ptr(out, t);
      for (int d = 0; d < L; ++d) store(orow, out.dtype(), static_cast<int64_t>(h) * L + d, acc[d]);
    }
  }
}

void indexer_topk(Tensor& topk, const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                  const AttentionBatch& b, const IndexerArgs& a, const IndexerPlanes& p) {
  check_rows("indexer_topk", q, "q");
  check_rows("indexer_topk", weights, "weights");
  const int Hi = a.num_heads, D = a.head_dim, K = a.top_k;
  const int64_t T = q.size(0);
  ATOM_CHECK(Hi > 0 && D > 0 && K > 0 && a.entry_tokens >= 1,
             "indexer_topk: {} heads of {}, top {}, rows of {} tokens", Hi, D, K, a.entry_tokens);
  ATOM_CHECK(q.size(1) == static_cast<int64_t>(Hi) * D && weights.size(0) == T &&
                 weights.size(1) == Hi && weights.dtype() == DType::kF32,
             "indexer_topk: q {} weights {} for {} heads of {}", q.str(), weights.str(), Hi, D);
  ATOM_CHECK(topk.dim() == 2 && topk.size(0) == T && topk.size(1) == K && topk.is_contiguous() &&
                 topk.dtype() == DType::kI32,
             "indexer_topk: topk {} must be contiguous I32 [{}, {}]", topk.str(), T, K);
  indexer_cache_check("indexer_topk", topk, key_cache, a, p);
  const TokenSeqs ts = token_seqs(b, T);
  const int32_t* pip = b.page_indptr->ptr<int32_t>();
  const int32_t* pid = b.page_indices->ptr<int32_t>();
  const int64_t bs = key_cache.size(1), width = key_cache.size(3);
  const DType ct = key_cache.dtype();
  const void* cache = key_cache.data();
  const IndexKeyFormat fmt = a.key_format;
  const uint8_t* kscales = p.key_scales ? p.key_scales->ptr<uint8_t>() : nullptr;
  const int B = a.candidate_block;
  const int64_t cin = p.candidates_in ? p.candidates_in->size(1) : 0;
  const int64_t cout = p.candidates_out ? p.candidates_out->size(1) : 0;
  int32_t* outp = topk.ptr<int32_t>();

#pragma omp parallel if (T * Hi * D * 16 > kParallelMin)
  {
    std::vector<float> qv(static_cast<size_t>(Hi) * D), w(static_cast<size_t>(Hi)), key(D), score;
    std::vector<int> order, allowed;
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < T; ++t) {
      const int s = ts.seq[t], n = (ts.index[t] + 1) / a.entry_tokens;  // visible rows
      row_to_float(q, t, qv.data());
      row_to_float(weights, t, w.data());
      for (int h = 0; h < Hi; ++h) {
        if (fmt == IndexKeyFormat::kFp8) index_fp8_round_query(qv.data() + h * D, D);
        if (fmt == IndexKeyFormat::kFp4) index_fp4_round_query(qv.data() + h * D, D);
      }
      score.assign(static_cast<size_t>(n), 0.0f);
      for (int j = 0; j < n; ++j) {
        const int64_t base = row_base(pip, pid, s, j, bs, width);
        if (fmt == IndexKeyFormat::kFp8)
          index_fp8_load(static_cast<const uint8_t*>(cache) + base, D, key.data());
        else if (fmt == IndexKeyFormat::kFp4)
          index_fp4_load(static_cast<const uint8_t*>(cache) + base,
                         kscales + base / width * (D / 32), D, key.data());
        else
          load_span(cache, ct, base, D, key.data());
        score[j] = index_score(qv.data(), w.data(), key.data(), Hi, D, a.scale, a.weights_scale);
      }
      if (cout) {
        // The blocks' maxima, the newest kept, the best cout of them in ascending order.
        const int nb = (n + B - 1) / B;
        std::vector<std::pair<float, int>> best(static_cast<size_t>(nb));
        for (int blk = 0; blk < nb; ++blk) {
          float m = -std::numeric_limits<float>::infinity();
          for (int j = blk * B; j < std::min(n, (blk + 1) * B); ++j) m = std::max(m, score[j]);
          best[blk] = {m, blk};
        }
        if (nb > 0) best.back().first = std::numeric_limits<float>::infinity();
        const int k = static_cast<int>(std::min<int64_t>(cout, nb));
        std::partial_sort(best.begin(), best.begin() + k, best.end(),
                          [](const auto& x, const auto& y) {
                            return x.first > y.first || (x.first == y.first && x.second < y.second);
                          });
        std::vector<int> chosen;
        for (int i = 0; i < k; ++i) chosen.push_back(best[i].second);
        std::sort(chosen.begin(), chosen.end());
        int32_t* co = p.candidates_out->ptr<int32_t>() + t * cout;
        for (int64_t i = 0; i < cout; ++i) co[i] = i < k ? chosen[i] : -1;
      }
      // The rows to choose from: every visible one, or those of the candidate blocks.
      allowed.clear();
      const int32_t* ci = cin ? p.candidates_in->ptr<int32_t>() + t * cin : nullptr;
      for (int j = 0; j < n; ++j) {
        bool ok = !ci;
        for (int64_t c = 0; ci && c < cin && !ok; ++c) ok = ci[c] >= 0 && ci[c] == j / B;
        if (ok) allowed.push_back(j);
      }
      const int keep = std::min(static_cast<int>(allowed.size()), K);
      order = allowed;
      auto before = [&](int x, int y) {
        const bool nx = std::isnan(score[x]), ny = std::isnan(score[y]);
        if (nx != ny) return ny;
        if (!nx && score[x] != score[y]) return score[x] > score[y];
        return a.large_position_first ? x > y : x < y;
      };
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
      for (int k = 0; k < K; ++k) outp[t * K + k] = k < keep ? order[k] : -1;
    }
  }
}

void kpool_topk(Tensor& out, const Tensor& q, const Tensor& weights, const Tensor& rows_cache,
                const Tensor& ape, const AttentionBatch& b, const KpoolArgs& a) {
  kpool_topk_check(out, q, weights, rows_cache, ape, a);
  const int H = a.num_heads, D = a.head_dim, P = a.pool, W = a.width();
  const int64_t T = q.size(0);
  const TokenSeqs ts = token_seqs(b, T);
  const int32_t* pip = b.page_indptr->ptr<int32_t>();
  const int32_t* pid = b.page_indices->ptr<int32_t>();
  const int32_t* cl = b.context_lens->ptr<int32_t>();
  const int S = static_cast<int>(b.context_lens->numel());
  const int64_t bs = rows_cache.size(1);
  const DType ct = rows_cache.dtype();
  const void* cache = rows_cache.data();
  const float* ap = ape.ptr<float>();
  // The pooled keys of every pool complete by each sequence's last row.
  std::vector<std::vector<float>> pooled(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    const int pools = cl[s] / P;
    std::vector<float>& pk = pooled[static_cast<size_t>(s)];
    pk.assign(static_cast<size_t>(pools) * D, 0.0f);
    std::vector<float> row(static_cast<size_t>(2 * D) * P);
    for (int j = 0; j < pools; ++j) {
      for (int u = 0; u < P; ++u)
        load_span(cache, ct, row_base(pip, pid, s, j * P + u, bs, 2 * D), 2 * D,
                  row.data() + static_cast<size_t>(u) * 2 * D);
      for (int d = 0; d < D; ++d) {
        float mx = -INFINITY;
        for (int u = 0; u < P; ++u) mx = std::max(mx, row[u * 2 * D + D + d] + ap[u * D + d]);
        float sum = 0, acc = 0;
        for (int u = 0; u < P; ++u) {
          const float e = std::exp(row[u * 2 * D + D + d] + ap[u * D + d] - mx);
          sum += e;
          acc += e * row[u * 2 * D + d];
        }
        pk[static_cast<size_t>(j) * D + d] = acc / sum;
      }
    }
  }
  const int keep = a.top_k / P;
  int32_t* outp = out.ptr<int32_t>();
#pragma omp parallel if (T * H * D * 16 > kParallelMin)
  {
    std::vector<float> qv(static_cast<size_t>(H) * D), w(static_cast<size_t>(H)), score;
    std::vector<int> order;
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < T; ++t) {
      const int s = ts.seq[t], i = ts.index[t], n = (i + 1) / P;
      const std::vector<float>& pk = pooled[static_cast<size_t>(s)];
      row_to_float(q, t, qv.data());
      row_to_float(weights, t, w.data());
      score.assign(static_cast<size_t>(n), 0.0f);
      for (int j = 0; j < n; ++j)
        score[j] = index_score(qv.data(), w.data(), pk.data() + static_cast<size_t>(j) * D, H, D,
                               a.scale, a.weights_scale);
      const int take = std::min(n, keep);
      top_by_score(score, take, order);
      int32_t* o = outp + t * W;
      int m = 0;
      for (int r = 0; r < take; ++r)
        for (int u = 0; u < P; ++u) o[m++] = order[r] * P + u;
      if (a.tail)
        for (int v = n * P; v <= i; ++v) o[m++] = v;
      for (; m < W; ++m) o[m] = -1;
    }
  }
}

}  // namespace atom::kernels::cpu
