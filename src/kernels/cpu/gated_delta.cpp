#include "kernels/gated_delta.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/access.h"

namespace atom::kernels::cpu {

namespace {

struct SeqRange {
  int64_t q0, q1;  // rows [q0, q1) of the step
  int32_t slot;
  bool fresh;  // the step starts the sequence: its state is reset
  // Per row of the sequence, the rollback slot that also receives the state after it (-1 none);
  // null when no row has one.
  const int32_t* rollback = nullptr;
};

// A padding sequence (slot -1) touches no state; its output rows are zeros.
bool skip_padding(const SeqRange& s, Tensor& out) {
  if (s.slot >= 0) return false;
  for (int64_t t = s.q0; t < s.q1; ++t)
    for (int64_t c = 0; c < out.size(1); ++c) store(row_ptr(out, t), out.dtype(), c, 0.0f);
  return true;
}

std::vector<SeqRange> seq_ranges(const char* op, const StateRows& r, int64_t rows,
                                 int64_t num_slots) {
  ATOM_CHECK(r.query_start.dtype() == DType::kI32 && r.context_lens.dtype() == DType::kI32 &&
                 r.state_slots.dtype() == DType::kI32,
             "{}: batch fields must be I32", op);
  const int64_t S = r.context_lens.numel();
  ATOM_CHECK(r.query_start.numel() == S + 1 && r.state_slots.numel() == S,
             "{}: {} sequences with {} query offsets and {} state slots", op, S,
             r.query_start.numel(), r.state_slots.numel());
  const int32_t* qs = r.query_start.ptr<int32_t>();
  const int32_t* cl = r.context_lens.ptr<int32_t>();
  const int32_t* sl = r.state_slots.ptr<int32_t>();
  const int32_t* rb = nullptr;
  if (r.has_rollback()) {
    ATOM_CHECK(r.rollback_slots->dtype() == DType::kI32 && r.rollback_slots->numel() == rows,
               "{}: {} rollback slots for {} rows", op, r.rollback_slots->numel(), rows);
    rb = r.rollback_slots->ptr<int32_t>();
    for (int64_t t = 0; t < rows; ++t)
      ATOM_CHECK(rb[t] >= -1 && rb[t] < num_slots, "{}: row {} has rollback slot {} of {}", op, t,
                 rb[t], num_slots);
  }
  std::vector<SeqRange> out;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = qs[s], q1 = qs[s + 1];
    ATOM_CHECK(0 <= q0 && q0 <= q1 && q1 <= rows, "{}: sequence {} rows [{}, {}) of {}", op, s, q0,
               q1, rows);
    ATOM_CHECK(sl[s] >= -1 && sl[s] < num_slots, "{}: sequence {} has state slot {} of {}", op, s,
               sl[s], num_slots);
    ATOM_CHECK(cl[s] >= q1 - q0, "{}: sequence {} has {} new tokens but a context of {}", op, s,
               q1 - q0, cl[s]);
    const int32_t* own = nullptr;
    for (int64_t t = q0; rb && t < q1; ++t)
      if (rb[t] >= 0) {
        ATOM_CHECK(rb[t] != sl[s], "{}: sequence {} rolls back into its own slot {}", op, s, sl[s]);
        own = rb + q0;
      }
    out.push_back({q0, q1, sl[s], cl[s] == q1 - q0, own});
  }
  return out;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x · rsqrt(Σx² + 1e-6) (fla's l2norm, as transformers), in place.
void l2norm(float* x, int n) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

// Where the state after each token of a step is also kept (rollback slots): kept[t] the head's
// state in that slot, or null.
using Kept = std::vector<float*>;

// One v-head of one sequence's step, its inputs gathered: q, k [L, dk] (normalised, q scaled),
// v [L, dv], beta, g [L]; S [dk, dv] updated (and copied after token t to kept[t], if any);
// out [L, dv].
void delta_recurrent(int L, int dk, int dv, const float* q, const float* k, const float* v,
                     const float* beta, const float* g, float* S, float* out,
                     const Kept* kept = nullptr) {
  std::vector<float> kv(static_cast<size_t>(dv));
  for (int t = 0; t < L; ++t) {
    const float* qt = q + static_cast<int64_t>(t) * dk;
    const float* kt = k + static_cast<int64_t>(t) * dk;
    const float* vt = v + static_cast<int64_t>(t) * dv;
    const float decay = std::exp(g[t]);
    for (int64_t i = 0; i < static_cast<int64_t>(dk) * dv; ++i) S[i] *= decay;
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int d = 0; d < dk; ++d)
      for (int e = 0; e < dv; ++e) kv[e] += S[d * dv + e] * kt[d];
    for (int e = 0; e < dv; ++e) kv[e] = beta[t] * (vt[e] - kv[e]);  // delta
    for (int d = 0; d < dk; ++d)
      for (int e = 0; e < dv; ++e) S[d * dv + e] += kt[d] * kv[e];
    float* ot = out + static_cast<int64_t>(t) * dv;
    std::fill(ot, ot + dv, 0.0f);
    for (int d = 0; d < dk; ++d)
      for (int e = 0; e < dv; ++e) ot[e] += S[d * dv + e] * qt[d];
    if (kept && (*kept)[t]) std::memcpy((*kept)[t], S, sizeof(float) * dk * dv);
  }
}

// The same over chunks of C tokens (transformers' torch_chunk_gated_delta_rule, WY form): within
// a chunk, the intra-chunk dependencies are solved by forward substitution, the state enters
// through one product, and leaves decayed by the chunk's total gate.
void delta_chunked(int L, int C, int dk, int dv, const float* q, const float* k, const float* v,
                   const float* beta, const float* g, float* S, float* out) {
  std::vector<float> gc(C), A(static_cast<size_t>(C) * C), U(static_cast<size_t>(C) * dv),
      W(static_cast<size_t>(C) * dk), vn(static_cast<size_t>(C) * dv);
  for (int c0 = 0; c0 < L; c0 += C) {
    const int n = std::min(C, L - c0);
    const float* qc = q + static_cast<int64_t>(c0) * dk;
    const float* kc = k + static_cast<int64_t>(c0) * dk;
    const float* vc = v + static_cast<int64_t>(c0) * dv;
    const float* bc = beta + c0;
    float acc = 0;
    for (int i = 0; i < n; ++i) gc[i] = acc += g[c0 + i];
    // A[i][j] (j < i) = -β_i (k_i · k_j) exp(gc_i - gc_j), then (I - A_strict)^-1 - I by rows.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        A[i * C + j] = -bc[i] * dot(kc + i * dk, kc + j * dk, dk) * std::exp(gc[i] - gc[j]);
    for (int i = 1; i < n; ++i) {
      std::vector<float> row(A.begin() + i * C, A.begin() + i * C + i);
      for (int j = 0; j < i; ++j) {
        float s = row[j];
        for (int m = j + 1; m < i; ++m) s += row[m] * A[m * C + j];
        A[i * C + j] = s;
      }
    }
    // U = T (β v), W = T (β exp(gc) k), T = A + I.
    for (int i = 0; i < n; ++i) {
      float* u = U.data() + i * dv;
      float* w = W.data() + i * dk;
      for (int e = 0; e < dv; ++e) u[e] = bc[i] * vc[i * dv + e];
      const float wi = bc[i] * std::exp(gc[i]);
      for (int d = 0; d < dk; ++d) w[d] = wi * kc[i * dk + d];
      for (int j = 0; j < i; ++j) {
        const float t = A[i * C + j];
        for (int e = 0; e < dv; ++e) u[e] += t * bc[j] * vc[j * dv + e];
        const float tw = t * bc[j] * std::exp(gc[j]);
        for (int d = 0; d < dk; ++d) w[d] += tw * kc[j * dk + d];
      }
    }
    // v_new = U - W S;  out_i = exp(gc_i) q_i S + Σ_{j<=i} (q_i·k_j) exp(gc_i - gc_j) v_new_j.
    for (int i = 0; i < n; ++i) {
      float* vi = vn.data() + i * dv;
      for (int e = 0; e < dv; ++e) vi[e] = U[i * dv + e];
      for (int d = 0; d < dk; ++d) {
        const float wd = W[i * dk + d];
        for (int e = 0; e < dv; ++e) vi[e] -= wd * S[d * dv + e];
      }
    }
    for (int i = 0; i < n; ++i) {
      float* o = out + static_cast<int64_t>(c0 + i) * dv;
      const float* qi = qc + i * dk;
      std::fill(o, o + dv, 0.0f);
      for (int d = 0; d < dk; ++d)
        for (int e = 0; e < dv; ++e) o[e] += qi[d] * S[d * dv + e];
      const float ei = std::exp(gc[i]);
      for (int e = 0; e < dv; ++e) o[e] *= ei;
      for (int j = 0; j <= i; ++j) {
        const float a = dot(qi, kc + j * dk, dk) * std::exp(gc[i] - gc[j]);
        for (int e = 0; e < dv; ++e) o[e] += a * vn[j * dv + e];
      }
    }
    // S = exp(gc_last) S + Σ_j exp(gc_last - gc_j) k_j ⊗ v_new_j.
    const float last = gc[n - 1];
    const float el = std::exp(last);
    for (int64_t i = 0; i < static_cast<int64_t>(dk) * dv; ++i) S[i] *= el;
    for (int j = 0; j < n; ++j) {
      const float ej = std::exp(last - gc[j]);
      for (int d = 0; d < dk; ++d) {
        const float kd = ej * kc[j * dk + d];
        for (int e = 0; e < dv; ++e) S[d * dv + e] += kd * vn[j * dv + e];
      }
    }
  }
}

// Kimi delta attention, one head of one sequence's step, its inputs gathered: q, k [L, d]
// (normalised, q scaled), v [L, d], beta [L], g [L, d] (per-channel log decays); S [d, d]
// updated; out [L, d]. The recurrence (transformers' recurrent_kimi_delta_attention).
void kda_recurrent(int L, int d, const float* q, const float* k, const float* v, const float* beta,
                   const float* g, float* S, float* out, const Kept* kept = nullptr) {
  std::vector<float> kv(static_cast<size_t>(d));
  for (int t = 0; t < L; ++t) {
    const float* qt = q + static_cast<int64_t>(t) * d;
    const float* kt = k + static_cast<int64_t>(t) * d;
    const float* vt = v + static_cast<int64_t>(t) * d;
    const float* gt = g + static_cast<int64_t>(t) * d;
    for (int c = 0; c < d; ++c) {
      const float decay = std::exp(gt[c]);
      for (int e = 0; e < d; ++e) S[c * d + e] *= decay;
    }
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int c = 0; c < d; ++c)
      for (int e = 0; e < d; ++e) kv[e] += S[c * d + e] * kt[c];
    for (int e = 0; e < d; ++e) kv[e] = beta[t] * (vt[e] - kv[e]);  // delta
    for (int c = 0; c < d; ++c)
      for (int e = 0; e < d; ++e) S[c * d + e] += kt[c] * kv[e];
    float* ot = out + static_cast<int64_t>(t) * d;
    std::fill(ot, ot + d, 0.0f);
    for (int c = 0; c < d; ++c)
      for (int e = 0; e < d; ++e) ot[e] += S[c * d + e] * qt[c];
    if (kept && (*kept)[t]) std::memcpy((*kept)[t], S, sizeof(float) * d * d);
  }
}

// The rollback destinations of head `h` (offset `head_off` floats into a slot of `per_slot`).
Kept kept_for(const SeqRange& s, float* pool, int64_t per_slot, int64_t head_off) {
  Kept k(static_cast<size_t>(s.q1 - s.q0), nullptr);
  for (int64_t t = 0; t < s.q1 - s.q0; ++t)
    if (s.rollback[t] >= 0) k[t] = pool + s.rollback[t] * per_slot + head_off;
  return k;
}

// The same over chunks of C tokens (transformers' chunk_kimi_delta_attention): the gated delta
// net's WY form with the decays per key channel, gc the within-chunk cumulative log decays:
//   A[i][j] (j < i) = -β_i Σ_c k_i[c] k_j[c] exp(gc_i[c] - gc_j[c]), T = (I - A_strict)^-1,
//   U = T (β v),  W = T (β k ⊙ exp(gc)),  v_new = U - W S,
//   out_i = (q_i ⊙ exp(gc_i)) S + Σ_{j<=i} (Σ_c q_i[c] k_j[c] exp(gc_i[c] - gc_j[c])) v_new_j,
//   S ← diag(exp(gc_last)) S + Σ_j (k_j ⊙ exp(gc_last - gc_j)) ⊗ v_new_j.
void kda_chunked(int L, int C, int d, const float* q, const float* k, const float* v,
                 const float* beta, const float* g, float* S, float* out) {
  const size_t Cd = static_cast<size_t>(C) * d;
  std::vector<float> gc(Cd), A(static_cast<size_t>(C) * C), U(Cd), W(Cd), vn(Cd), kq(d);
  // Σ_c x[c] y[c] exp(gx[c] - gy[c])
  auto decayed_dot = [d](const float* x, const float* y, const float* gx, const float* gy) {
    float s = 0;
    for (int c = 0; c < d; ++c) s += x[c] * y[c] * std::exp(gx[c] - gy[c]);
    return s;
  };
  for (int c0 = 0; c0 < L; c0 += C) {
    const int n = std::min(C, L - c0);
    const float* qc = q + static_cast<int64_t>(c0) * d;
    const float* kc = k + static_cast<int64_t>(c0) * d;
    const float* vc = v + static_cast<int64_t>(c0) * d;
    const float* bc = beta + c0;
    for (int c = 0; c < d; ++c) {
      float acc = 0;
      for (int i = 0; i < n; ++i) gc[i * d + c] = acc += g[static_cast<int64_t>(c0 + i) * d + c];
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        A[i * C + j] =
            -bc[i] * decayed_dot(kc + i * d, kc + j * d, gc.data() + i * d, gc.data() + j * d);
    for (int i = 1; i < n; ++i) {
      std::vector<float> row(A.begin() + i * C, A.begin() + i * C + i);
      for (int j = 0; j < i; ++j) {
        float s = row[j];
        for (int m = j + 1; m < i; ++m) s += row[m] * A[m * C + j];
        A[i * C + j] = s;
      }
    }
    for (int i = 0; i < n; ++i) {
      float* u = U.data() + i * d;
      float* w = W.data() + i * d;
      for (int e = 0; e < d; ++e) u[e] = bc[i] * vc[i * d + e];
      for (int c = 0; c < d; ++c) w[c] = bc[i] * std::exp(gc[i * d + c]) * kc[i * d + c];
      for (int j = 0; j < i; ++j) {
        const float t = A[i * C + j] * bc[j];
        for (int e = 0; e < d; ++e) u[e] += t * vc[j * d + e];
        for (int c = 0; c < d; ++c) w[c] += t * std::exp(gc[j * d + c]) * kc[j * d + c];
      }
    }
    for (int i = 0; i < n; ++i) {
      float* vi = vn.data() + i * d;
      for (int e = 0; e < d; ++e) vi[e] = U[i * d + e];
      for (int c = 0; c < d; ++c) {
        const float wc = W[i * d + c];
        for (int e = 0; e < d; ++e) vi[e] -= wc * S[c * d + e];
      }
    }
    for (int i = 0; i < n; ++i) {
      float* o = out + static_cast<int64_t>(c0 + i) * d;
      const float* qi = qc + i * d;
      std::fill(o, o + d, 0.0f);
      for (int c = 0; c < d; ++c) {
        const float qd = qi[c] * std::exp(gc[i * d + c]);
        for (int e = 0; e < d; ++e) o[e] += qd * S[c * d + e];
      }
      for (int j = 0; j <= i; ++j) {
        const float a = decayed_dot(qi, kc + j * d, gc.data() + i * d, gc.data() + j * d);
        for (int e = 0; e < d; ++e) o[e] += a * vn[j * d + e];
      }
    }
    const float* last = gc.data() + static_cast<size_t>(n - 1) * d;
    for (int c = 0; c < d; ++c) {
      const float el = std::exp(last[c]);
      for (int e = 0; e < d; ++e) S[c * d + e] *= el;
    }
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < d; ++c) {
        const float kd = std::exp(last[c] - gc[j * d + c]) * kc[j * d + c];
        for (int e = 0; e < d; ++e) S[c * d + e] += kd * vn[j * d + e];
      }
  }
}

}  // namespace

void short_conv(Tensor& out, const Tensor& x, const Tensor& w, Tensor& conv_state,
                const StateRows& rows) {
  check_rows("short_conv", out, "out");
  check_rows("short_conv", x, "x");
  const int64_t T = x.size(0), C = x.size(1);
  ATOM_CHECK(w.dim() == 2 && w.size(0) == C && w.dtype() == DType::kF32 && w.is_contiguous(),
             "short_conv: weight {} for {} channels", w.str(), C);
  const int64_t K = w.size(1);
  ATOM_CHECK(out.size(0) == T && out.size(1) == C, "short_conv: out {} for x {}", out.str(),
             x.str());
  ATOM_CHECK(conv_state.dim() == 3 && conv_state.size(1) == C && conv_state.size(2) == K - 1 &&
                 conv_state.dtype() == DType::kF32 && conv_state.is_contiguous(),
             "short_conv: conv state {} for {} channels and kernel {}", conv_state.str(), C, K);
  const float* wp = w.ptr<float>();
  for (const SeqRange& s : seq_ranges("short_conv", rows, T, conv_state.size(0))) {
    if (skip_padding(s, out)) continue;
    float* st = conv_state.ptr<float>() + static_cast<int64_t>(s.slot) * C * (K - 1);
    if (s.fresh) std::memset(st, 0, sizeof(float) * static_cast<size_t>(C * (K - 1)));
    const int64_t L = s.q1 - s.q0;
    if (L == 0) continue;
#pragma omp parallel for schedule(static) if (L * C * K > kParallelMin)
    for (int64_t c = 0; c < C; ++c) {
      // The window: the state's K-1 inputs, then this step's.
      std::vector<float> win(static_cast<size_t>(K - 1 + L));
      for (int64_t i = 0; i < K - 1; ++i) win[i] = st[c * (K - 1) + i];
      for (int64_t t = 0; t < L; ++t) win[K - 1 + t] = load(row_ptr(x, s.q0 + t), x.dtype(), c);
      const float* wc = wp + c * K;
      for (int64_t t = 0; t < L; ++t) {
        float acc = 0;
        for (int64_t i = 0; i < K; ++i) acc += wc[i] * win[t + i];
        store(row_ptr(out, s.q0 + t), out.dtype(), c, acc / (1.0f + std::exp(-acc)));
      }
      for (int64_t i = 0; i < K - 1; ++i) st[c * (K - 1) + i] = win[L + i];
      // Rollback slots: the last K-1 inputs after token t are win[t + 1 .. t + K - 1].
      for (int64_t t = 0; s.rollback && t < L; ++t)
        if (s.rollback[t] >= 0) {
          float* kept = conv_state.ptr<float>() + static_cast<int64_t>(s.rollback[t]) * C * (K - 1);
          for (int64_t i = 0; i < K - 1; ++i) kept[c * (K - 1) + i] = win[t + 1 + i];
        }
    }
  }
}

void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& b, const Tensor& a, const Tensor& A_log, const Tensor& dt_bias,
                      Tensor& state, const StateRows& rows, const GatedDeltaArgs& args) {
  const char* op = "gated_delta_rule";
  check_gated_delta_args(op, out, q, k, v, b, a, A_log, dt_bias, state, args);
  const int Hk = args.num_k_heads, Hv = args.num_v_heads, dk = args.k_dim, dv = args.v_dim;
  const int64_t T = q.size(0);
  const int r = Hv / Hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const int64_t per_slot = static_cast<int64_t>(Hv) * dk * dv;
  for (const SeqRange& s : seq_ranges(op, rows, T, state.size(0))) {
    if (skip_padding(s, out)) continue;
    float* st = state.ptr<float>() + static_cast<int64_t>(s.slot) * per_slot;
    if (s.fresh) std::memset(st, 0, sizeof(float) * static_cast<size_t>(per_slot));
    const int L = static_cast<int>(s.q1 - s.q0);
    if (L == 0) continue;
    // Rows whose state is kept run token by token (the chunked form has no per-token state).
    const bool chunked = args.chunk_size > 0 && L > 1 && !s.rollback;
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(L) * per_slot > kParallelMin)
    for (int h = 0; h < Hv; ++h) {
      const int j = h / r;  // repeat_interleave: v-head h reads k-head h / r
      std::vector<float> qh(static_cast<size_t>(L) * dk), kh(qh.size()),
          vh(static_cast<size_t>(L) * dv), oh(vh.size()), beta(L), g(L);
      const float A = std::exp(A_log.ptr<float>()[h]), bias = dt_bias.ptr<float>()[h];
      for (int t = 0; t < L; ++t) {
        const int64_t row = s.q0 + t;
        for (int d = 0; d < dk; ++d) {
          qh[t * dk + d] = load(row_ptr(q, row), q.dtype(), j * dk + d);
          kh[t * dk + d] = load(row_ptr(k, row), k.dtype(), j * dk + d);
        }
        l2norm(qh.data() + t * dk, dk);
        l2norm(kh.data() + t * dk, dk);
        for (int d = 0; d < dk; ++d) qh[t * dk + d] *= scale;
        for (int e = 0; e < dv; ++e) vh[t * dv + e] = load(row_ptr(v, row), v.dtype(), h * dv + e);
        beta[t] = sigmoid(load(row_ptr(b, row), b.dtype(), h));
        g[t] = -A * softplus(load(row_ptr(a, row), a.dtype(), h) + bias);
      }
      float* S = st + static_cast<int64_t>(h) * dk * dv;
      if (chunked)
        delta_chunked(L, args.chunk_size, dk, dv, qh.data(), kh.data(), vh.data(), beta.data(),
                      g.data(), S, oh.data());
      else if (s.rollback) {
        const Kept kept =
            kept_for(s, state.ptr<float>(), per_slot, static_cast<int64_t>(h) * dk * dv);
        delta_recurrent(L, dk, dv, qh.data(), kh.data(), vh.data(), beta.data(), g.data(), S,
                        oh.data(), &kept);
      } else
        delta_recurrent(L, dk, dv, qh.data(), kh.data(), vh.data(), beta.data(), g.data(), S,
                        oh.data());
      for (int t = 0; t < L; ++t)
        for (int e = 0; e < dv; ++e)
          store(row_ptr(out, s.q0 + t), out.dtype(), h * dv + e, oh[t * dv + e]);
    }
  }
}

void kda_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& f,
              const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& state,
              const StateRows& rows, const KdaArgs& args) {
  const char* op = "kda_rule";
  check_kda_args(op, out, q, k, v, f, b, A_log, dt_bias, state, args);
  const int H = args.num_heads, d = args.head_dim;
  const int64_t T = q.size(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t per_slot = static_cast<int64_t>(H) * d * d;
  for (const SeqRange& s : seq_ranges(op, rows, T, state.size(0))) {
    if (skip_padding(s, out)) continue;
    float* st = state.ptr<float>() + static_cast<int64_t>(s.slot) * per_slot;
    if (s.fresh) std::fill(st, st + per_slot, 0.0f);  // a new sequence: the slot's state reset
    const int L = static_cast<int>(s.q1 - s.q0);
    if (L == 0) continue;
    const bool chunked = args.chunk_size > 0 && L > 1 && !s.rollback;
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(L) * per_slot > kParallelMin)
    for (int h = 0; h < H; ++h) {
      const size_t n = static_cast<size_t>(L) * d;
      std::vector<float> qh(n), kh(n), vh(n), gh(n), oh(n), beta(L);
      const float A = std::exp(A_log.ptr<float>()[h]);
      const float* bias = dt_bias.ptr<float>() + static_cast<int64_t>(h) * d;
      for (int t = 0; t < L; ++t) {
        const int64_t row = s.q0 + t;
        for (int c = 0; c < d; ++c) {
          const int64_t col = static_cast<int64_t>(h) * d + c;
          qh[t * d + c] = load(row_ptr(q, row), q.dtype(), col);
          kh[t * d + c] = load(row_ptr(k, row), k.dtype(), col);
          vh[t * d + c] = load(row_ptr(v, row), v.dtype(), col);
          const float pre = load(row_ptr(f, row), f.dtype(), col) + bias[c];
          gh[t * d + c] = args.gate_lower_bound < 0.0f ? args.gate_lower_bound * sigmoid(A * pre)
                                                       : -A * softplus(pre);
        }
        l2norm(qh.data() + t * d, d);
        l2norm(kh.data() + t * d, d);
        for (int c = 0; c < d; ++c) qh[t * d + c] *= scale;
        beta[t] = sigmoid(load(row_ptr(b, row), b.dtype(), h));
      }
      float* S = st + static_cast<int64_t>(h) * d * d;
      if (chunked)
        kda_chunked(L, args.chunk_size, d, qh.data(), kh.data(), vh.data(), beta.data(), gh.data(),
                    S, oh.data());
      else if (s.rollback) {
        const Kept kept =
            kept_for(s, state.ptr<float>(), per_slot, static_cast<int64_t>(h) * d * d);
        kda_recurrent(L, d, qh.data(), kh.data(), vh.data(), beta.data(), gh.data(), S, oh.data(),
                      &kept);
      } else
        kda_recurrent(L, d, qh.data(), kh.data(), vh.data(), beta.data(), gh.data(), S, oh.data());
      for (int t = 0; t < L; ++t)
        for (int c = 0; c < d; ++c)
          store(row_ptr(out, s.q0 + t), out.dtype(), static_cast<int64_t>(h) * d + c,
                oh[t * d + c]);
    }
  }
}

void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps,
                    NormGate gate) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &x, &z})
    check_rows("gated_rms_norm", *t, "an operand");
  const int64_t T = x.size(0), N = x.size(1), D = w.numel();
  ATOM_CHECK(D > 0 && N % D == 0 && z.size(0) == T && z.size(1) == N && out.size(0) == T &&
                 out.size(1) == N,
             "gated_rms_norm: x {} z {} out {} w {}", x.str(), z.str(), out.str(), w.str());
  std::vector<float> wf(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) wf[i] = load(w.data(), w.dtype(), i);
#pragma omp parallel for schedule(static) if (T * N > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> xv(static_cast<size_t>(N)), zv(static_cast<size_t>(N));
    row_to_float(x, t, xv.data());
    row_to_float(z, t, zv.data());
    for (int64_t g0 = 0; g0 < N; g0 += D) {
      float ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += xv[g0 + i] * xv[g0 + i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) {
        const float zi = zv[g0 + i];
        if (gate == NormGate::kSilu) {
          // transformers: weight * normed.to(dtype), then * silu(z) in fp32.
          const float n = wf[i] * round_to(out.dtype(), xv[g0 + i] * inv);
          xv[g0 + i] = n * (zi / (1.0f + std::exp(-zi)));
        } else {
          xv[g0 + i] = wf[i] * (xv[g0 + i] * inv) * sigmoid(zi);
        }
      }
    }
    float_to_row(out, t, xv.data());
  }
}

void mul_sigmoid(Tensor& out, const Tensor& x, const Tensor& gate) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &x, &gate})
    check_rows("mul_sigmoid", *t, "an operand");
  const int64_t T = x.size(0), N = x.size(1);
  ATOM_CHECK(gate.size(0) == T && gate.size(1) == N && out.size(0) == T && out.size(1) == N,
             "mul_sigmoid: x {} gate {} out {}", x.str(), gate.str(), out.str());
#pragma omp parallel for schedule(static) if (T * N > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> xv(static_cast<size_t>(N)), gv(static_cast<size_t>(N));
    row_to_float(x, t, xv.data());
    row_to_float(gate, t, gv.data());
    for (int64_t i = 0; i < N; ++i) xv[i] *= sigmoid(gv[i]);
    float_to_row(out, t, xv.data());
  }
}

}  // namespace atom::kernels::cpu

namespace atom::kernels {

void check_gated_delta_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& b, const Tensor& a, const Tensor& A_log,
                            const Tensor& dt_bias, const Tensor& state,
                            const GatedDeltaArgs& args) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k, &v, &b, &a})
    cpu::check_rows(op, *t, "an operand");
  const int Hk = args.num_k_heads, Hv = args.num_v_heads, dk = args.k_dim, dv = args.v_dim;
  ATOM_CHECK(Hk > 0 && Hv > 0 && Hv % Hk == 0 && dk > 0 && dv > 0,
             "{}: {} key heads, {} value heads of {} / {}", op, Hk, Hv, dk, dv);
  const int64_t T = q.size(0);
  ATOM_CHECK(q.size(1) == Hk * dk && k.size(1) == Hk * dk && v.size(1) == Hv * dv &&
                 b.size(1) == Hv && a.size(1) == Hv && out.size(1) == Hv * dv,
             "{}: q {} k {} v {} b {} a {} out {} for {} key and {} value heads", op, q.str(),
             k.str(), v.str(), b.str(), a.str(), out.str(), Hk, Hv);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &b, &a, &out})
    ATOM_CHECK(t->size(0) == T, "{}: {} rows, expected {}", op, t->str(), T);
  ATOM_CHECK(A_log.numel() == Hv && dt_bias.numel() == Hv && A_log.dtype() == DType::kF32 &&
                 dt_bias.dtype() == DType::kF32,
             "{}: A_log {} and dt_bias {} must be F32 [{}]", op, A_log.str(), dt_bias.str(), Hv);
  ATOM_CHECK(state.dim() == 4 && state.size(1) == Hv && state.size(2) == dk &&
                 state.size(3) == dv && state.dtype() == DType::kF32 && state.is_contiguous(),
             "{}: state {} for {} heads of {} x {}", op, state.str(), Hv, dk, dv);
}

void check_kda_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k,
                    const Tensor& v, const Tensor& f, const Tensor& b, const Tensor& A_log,
                    const Tensor& dt_bias, const Tensor& state, const KdaArgs& args) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k, &v, &f, &b})
    cpu::check_rows(op, *t, "an operand");
  const int H = args.num_heads, d = args.head_dim;
  ATOM_CHECK(H > 0 && d > 0, "{}: {} heads of {}", op, H, d);
  const int64_t T = q.size(0), P = static_cast<int64_t>(H) * d;
  ATOM_CHECK(q.size(1) == P && k.size(1) == P && v.size(1) == P && f.size(1) == P &&
                 b.size(1) == H && out.size(1) == P,
             "{}: q {} k {} v {} f {} b {} out {} for {} heads of {}", op, q.str(), k.str(),
             v.str(), f.str(), b.str(), out.str(), H, d);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &f, &b, &out})
    ATOM_CHECK(t->size(0) == T, "{}: {} rows, expected {}", op, t->str(), T);
  ATOM_CHECK(A_log.numel() == H && dt_bias.numel() == P && A_log.dtype() == DType::kF32 &&
                 dt_bias.dtype() == DType::kF32,
             "{}: A_log {} must be F32 [{}] and dt_bias {} F32 [{}]", op, A_log.str(), H,
             dt_bias.str(), P);
  ATOM_CHECK(state.dim() == 4 && state.size(1) == H && state.size(2) == d && state.size(3) == d &&
                 state.dtype() == DType::kF32 && state.is_contiguous(),
             "{}: state {} for {} heads of {} x {}", op, state.str(), H, d, d);
}

}  // namespace atom::kernels
