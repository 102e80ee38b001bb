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
};

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
  std::vector<SeqRange> out;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = qs[s], q1 = qs[s + 1];
    ATOM_CHECK(0 <= q0 && q0 <= q1 && q1 <= rows, "{}: sequence {} rows [{}, {}) of {}", op, s, q0,
               q1, rows);
    ATOM_CHECK(sl[s] >= 0 && sl[s] < num_slots, "{}: sequence {} has state slot {} of {}", op, s,
               sl[s], num_slots);
    ATOM_CHECK(cl[s] >= q1 - q0, "{}: sequence {} has {} new tokens but a context of {}", op, s,
               q1 - q0, cl[s]);
    out.push_back({q0, q1, sl[s], cl[s] == q1 - q0});
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

// One v-head of one sequence's step, its inputs gathered: q, k [L, dk] (normalised, q scaled),
// v [L, dv], beta, g [L]; S [dk, dv] updated; out [L, dv].
void delta_recurrent(int L, int dk, int dv, const float* q, const float* k, const float* v,
                     const float* beta, const float* g, float* S, float* out) {
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
    }
  }
}

void gated_delta_rule(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& b, const Tensor& a, const Tensor& A_log, const Tensor& dt_bias,
                      Tensor& state, const StateRows& rows, const GatedDeltaArgs& args) {
  const char* op = "gated_delta_rule";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k, &v, &b, &a})
    check_rows(op, *t, "an operand");
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
  const int r = Hv / Hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const int64_t per_slot = static_cast<int64_t>(Hv) * dk * dv;
  for (const SeqRange& s : seq_ranges(op, rows, T, state.size(0))) {
    float* st = state.ptr<float>() + static_cast<int64_t>(s.slot) * per_slot;
    if (s.fresh) std::memset(st, 0, sizeof(float) * static_cast<size_t>(per_slot));
    const int L = static_cast<int>(s.q1 - s.q0);
    if (L == 0) continue;
    const bool chunked = args.chunk_size > 0 && L > 1;
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
      else
        delta_recurrent(L, dk, dv, qh.data(), kh.data(), vh.data(), beta.data(), g.data(), S,
                        oh.data());
      for (int t = 0; t < L; ++t)
        for (int e = 0; e < dv; ++e)
          store(row_ptr(out, s.q0 + t), out.dtype(), h * dv + e, oh[t * dv + e]);
    }
  }
}

void gated_rms_norm(Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps) {
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
        // transformers: weight * normed.to(dtype), then * silu(z) in fp32.
        const float n = wf[i] * round_to(out.dtype(), xv[g0 + i] * inv);
        const float zi = zv[g0 + i];
        xv[g0 + i] = n * (zi / (1.0f + std::exp(-zi)));
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
