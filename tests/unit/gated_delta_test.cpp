// The CPU gated delta net kernels against the formulas written out here in double precision
// (transformers' torch_recurrent_gated_delta_rule, its causal conv1d and gated RMSNorm; Kimi
// delta attention's recurrent_kimi_delta_attention and KimiLinearRMSNormGated): the
// recurrence and the chunked form, each with state carried across steps of different lengths
// (longer and shorter than a chunk and than the conv kernel), a fresh sequence's slot reset
// from garbage, and several sequences in one step.
#include "kernels/gated_delta.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/compare.h"
#include "common/tensor_util.h"

namespace atom::test {
namespace {

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sig(x); }

// One step of the listed (sequence, rows) parts: each part is rows [r0, r0 + n) of the inputs,
// the sequence having `ctx` tokens after the step, in state slot `slot`.
struct Part {
  int64_t r0, n;
  int32_t ctx, slot;
};

struct Rows {
  Tensor qs, cl, sl;
  explicit Rows(const std::vector<Part>& parts) {
    std::vector<int32_t> q = {0}, c, s;
    for (const Part& p : parts) {
      q.push_back(q.back() + static_cast<int32_t>(p.n));
      c.push_back(p.ctx);
      s.push_back(p.slot);
    }
    qs = i32(q);
    cl = i32(c);
    sl = i32(s);
  }
  kernels::StateRows view() const { return {qs, cl, sl}; }
};

// Gathers rows of several parts into one step's tensor.
Tensor gather(const Tensor& x, const std::vector<Part>& parts) {
  int64_t T = 0;
  for (const Part& p : parts) T += p.n;
  Tensor out = Tensor::empty({T, x.size(1)}, DType::kF32);
  int64_t r = 0;
  for (const Part& p : parts)
    for (int64_t i = 0; i < p.n; ++i, ++r)
      std::copy(x.ptr<float>() + (p.r0 + i) * x.size(1),
                x.ptr<float>() + (p.r0 + i + 1) * x.size(1), out.ptr<float>() + r * x.size(1));
  return out;
}

TEST(GatedDelta, ShortConvMatchesTheFormulaAcrossSteps) {
  const int64_t C = 5, K = 4, T = 11;
  Tensor x = random_cpu({T, C}, DType::kF32, 1);
  Tensor w = random_cpu({C, K}, DType::kF32, 2);
  // Sequence A over steps of 2 (shorter than K - 1), 1 and 8 tokens in slot 1; sequence B, 3
  // fresh tokens (rows 0-2 again) in slot 0 beside A's second step.
  Tensor state = Tensor::empty({3, C, K - 1}, DType::kF32);
  for (int64_t i = 0; i < state.numel(); ++i) state.ptr<float>()[i] = 7.0f;  // garbage
  std::vector<std::vector<Part>> steps = {
      {{0, 2, 2, 1}}, {{2, 1, 3, 1}, {0, 3, 3, 0}}, {{3, 8, 11, 1}}};
  std::vector<double> want(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < K; ++i) {
        const int64_t s = t - K + 1 + i;
        if (s >= 0) acc += w.ptr<float>()[c * K + i] * x.ptr<float>()[s * C + c];
      }
      want[t * C + c] = silu(acc);
    }
  for (const auto& parts : steps) {
    Tensor xs = gather(x, parts);
    Tensor out = Tensor::empty(xs.shape(), DType::kF32);
    Rows rows(parts);
    kernels::short_conv(out, xs, w, state, rows.view());
    int64_t r = 0;
    for (const Part& p : parts)
      for (int64_t i = 0; i < p.n; ++i, ++r)
        for (int64_t c = 0; c < C; ++c)
          EXPECT_NEAR(out.ptr<float>()[r * C + c], want[(p.r0 + i) * C + c], 1e-6)
              << "row " << p.r0 + i << " channel " << c << " slot " << p.slot;
  }
  // A's state holds its last K - 1 inputs.
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < K - 1; ++i)
      EXPECT_EQ(state.ptr<float>()[(1 * C + c) * (K - 1) + i],
                x.ptr<float>()[(T - K + 1 + i) * C + c]);
}

// transformers' recurrence in double: returns out [T, Hv * dv].
std::vector<double> delta_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& b, const Tensor& a, const Tensor& A_log,
                                    const Tensor& dt_bias, int Hk, int Hv, int dk, int dv) {
  const int64_t T = q.size(0);
  std::vector<double> out(static_cast<size_t>(T * Hv * dv));
  for (int h = 0; h < Hv; ++h) {
    const int j = h / (Hv / Hk);
    std::vector<double> S(static_cast<size_t>(dk * dv), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> qt(dk), kt(dk);
      double nq = 0, nk = 0;
      for (int d = 0; d < dk; ++d) {
        qt[d] = q.ptr<float>()[t * Hk * dk + j * dk + d];
        kt[d] = k.ptr<float>()[t * Hk * dk + j * dk + d];
        nq += qt[d] * qt[d];
        nk += kt[d] * kt[d];
      }
      for (int d = 0; d < dk; ++d) {
        qt[d] = qt[d] / std::sqrt(nq + 1e-6) / std::sqrt(static_cast<double>(dk));
        kt[d] = kt[d] / std::sqrt(nk + 1e-6);
      }
      const double beta = sig(b.ptr<float>()[t * Hv + h]);
      const double x = a.ptr<float>()[t * Hv + h] + dt_bias.ptr<float>()[h];
      const double g =
          -std::exp(static_cast<double>(A_log.ptr<float>()[h])) * std::log1p(std::exp(x));
      for (double& s : S) s *= std::exp(g);
      for (int e = 0; e < dv; ++e) {
        double kv = 0;
        for (int d = 0; d < dk; ++d) kv += S[d * dv + e] * kt[d];
        const double delta = beta * (v.ptr<float>()[t * Hv * dv + h * dv + e] - kv);
        for (int d = 0; d < dk; ++d) S[d * dv + e] += kt[d] * delta;
      }
      for (int e = 0; e < dv; ++e) {
        double o = 0;
        for (int d = 0; d < dk; ++d) o += S[d * dv + e] * qt[d];
        out[(t * Hv + h) * dv + e] = o;
      }
    }
  }
  return out;
}

TEST(GatedDelta, RecurrentAndChunkedRulesMatchTheFormulaAcrossSteps) {
  const int Hk = 2, Hv = 4, dk = 5, dv = 3;
  const int64_t T = 14;
  Tensor q = random_cpu({T, Hk * dk}, DType::kF32, 3);
  Tensor k = random_cpu({T, Hk * dk}, DType::kF32, 4);
  Tensor v = random_cpu({T, Hv * dv}, DType::kF32, 5, -2.0f, 2.0f);
  Tensor b = random_cpu({T, Hv}, DType::kF32, 6, -2.0f, 2.0f);
  Tensor a = random_cpu({T, Hv}, DType::kF32, 7, -2.0f, 2.0f);
  Tensor A_log = random_cpu({Hv}, DType::kF32, 8, -2.0f, 0.5f);
  Tensor dt_bias = random_cpu({Hv}, DType::kF32, 9);
  const std::vector<double> want = delta_reference(q, k, v, b, a, A_log, dt_bias, Hk, Hv, dk, dv);
  // Steps of 9 (two chunks of 4 and one token), 4 with a fresh 3-token sequence beside, and a
  // decode token.
  const std::vector<std::vector<Part>> steps = {
      {{0, 9, 9, 2}}, {{0, 3, 3, 0}, {9, 4, 13, 2}}, {{13, 1, 14, 2}}};
  for (const int chunk : {0, 4}) {
    SCOPED_TRACE(chunk ? "chunked" : "recurrent");
    Tensor state = Tensor::empty({3, Hv, dk, dv}, DType::kF32);
    for (int64_t i = 0; i < state.numel(); ++i) state.ptr<float>()[i] = 7.0f;  // garbage
    kernels::GatedDeltaArgs args{Hk, Hv, dk, dv, chunk};
    double worst = 0;
    for (const auto& parts : steps) {
      Tensor out = Tensor::empty({0, 0}, DType::kF32);
      Tensor qs = gather(q, parts), ks = gather(k, parts), vs = gather(v, parts),
             bs = gather(b, parts), as = gather(a, parts);
      out = Tensor::empty({qs.size(0), Hv * dv}, DType::kF32);
      Rows rows(parts);
      kernels::gated_delta_rule(out, qs, ks, vs, bs, as, A_log, dt_bias, state, rows.view(), args);
      int64_t r = 0;
      for (const Part& p : parts)
        for (int64_t i = 0; i < p.n; ++i, ++r)
          for (int64_t c = 0; c < Hv * dv; ++c) {
            const double d =
                std::abs(out.ptr<float>()[r * Hv * dv + c] - want[(p.r0 + i) * Hv * dv + c]);
            EXPECT_LE(d, 2e-6) << "row " << p.r0 + i << " column " << c;
            if (!(d <= worst)) worst = d;
          }
    }
    std::printf("gated delta rule (%s): max |error| %.3g\n", chunk ? "chunked" : "recurrent",
                worst);
  }
}

// Speculative verification rows (StateRows::rollback_slots): a sequence's 5 rows from a carried
// state keep the state after rows 0-3 in slots 1-4 and end with row 4's in its own slot, each
// bit-equal to running only rows [0, r] from that state (token by token, though the rule's chunk
// is 4: the chunked form keeps no per-row state); a sequence beside it without rollback rows runs
// as alone. The short conv, the gated delta rule and Kimi delta attention alike.
TEST(GatedDelta, RollbackSlotsKeepEachRowsState) {
  const int Hk = 1, Hv = 2, dk = 4, dv = 3, H = 2, d = 4;
  const int64_t C = 6, K = 4, L = 5, T = L + 3;
  Tensor q = random_cpu({T, Hk * dk}, DType::kF32, 51),
         k = random_cpu({T, Hk * dk}, DType::kF32, 52);
  Tensor v = random_cpu({T, Hv * dv}, DType::kF32, 53), b = random_cpu({T, Hv}, DType::kF32, 54);
  Tensor a = random_cpu({T, Hv}, DType::kF32, 55), x = random_cpu({T, C}, DType::kF32, 56);
  Tensor A_log = random_cpu({Hv}, DType::kF32, 57, -2.0f, 0.5f);
  Tensor dt_bias = random_cpu({Hv}, DType::kF32, 58), w = random_cpu({C, K}, DType::kF32, 59);
  Tensor kq = random_cpu({T, H * d}, DType::kF32, 60), kk = random_cpu({T, H * d}, DType::kF32, 61);
  Tensor kv = random_cpu({T, H * d}, DType::kF32, 62), kf = random_cpu({T, H * d}, DType::kF32, 63);
  Tensor kb = random_cpu({T, H}, DType::kF32, 64),
         kA = random_cpu({H}, DType::kF32, 65, -2.0f, 0.5f);
  Tensor kdt = random_cpu({H * d}, DType::kF32, 66);
  // Rows 0-4: the verified sequence (20 tokens before, slot 0); rows 5-7: a fresh one in slot 5.
  Rows rows({{0, L, 20 + L, 0}, {L, 3, 3, 5}});
  Tensor rb = i32({1, 2, 3, 4, -1, -1, -1, -1});
  kernels::StateRows view = rows.view();
  view.rollback_slots = &rb;
  // Runs every op over `rs` (rows [r0, r0 + n) of the inputs) on the pools; chunk for the rules.
  auto run = [&](std::vector<Tensor>& pools, int64_t r0, int64_t n, const kernels::StateRows& rs,
                 int chunk, std::vector<Tensor>& outs) {
    auto part = [&](const Tensor& t) { return t.narrow(0, r0, n); };
    outs = {Tensor::empty({n, C}, DType::kF32), Tensor::empty({n, Hv * dv}, DType::kF32),
            Tensor::empty({n, H * d}, DType::kF32)};
    kernels::short_conv(outs[0], part(x), w, pools[0], rs);
    kernels::gated_delta_rule(outs[1], part(q), part(k), part(v), part(b), part(a), A_log, dt_bias,
                              pools[1], rs, kernels::GatedDeltaArgs{Hk, Hv, dk, dv, chunk});
    kernels::kda_rule(outs[2], part(kq), part(kk), part(kv), part(kf), part(kb), kA, kdt, pools[2],
                      rs, kernels::KdaArgs{H, d, chunk});
  };
  const std::vector<Tensor> start = {random_cpu({6, C, K - 1}, DType::kF32, 70),
                                     random_cpu({6, Hv, dk, dv}, DType::kF32, 71),
                                     random_cpu({6, H, d, d}, DType::kF32, 72)};
  auto copies = [&] {
    std::vector<Tensor> c;
    for (const Tensor& t : start) c.push_back(t.clone());
    return c;
  };
  std::vector<Tensor> pools = copies(), outs;
  run(pools, 0, T, view, 4, outs);
  const char* names[] = {"short_conv", "gated_delta_rule", "kda_rule"};
  for (int64_t r = 0; r < L; ++r) {
    std::vector<Tensor> alone = copies(), alone_out;
    Rows one({{0, r + 1, 20 + static_cast<int32_t>(r) + 1, 0}});
    run(alone, 0, r + 1, one.view(), 0, alone_out);
    const int64_t kept = r + 1 < L ? r + 1 : 0;  // the last row's state: the sequence's own slot
    for (int op = 0; op < 3; ++op) {
      const int64_t n = pools[op].numel() / 6;
      EXPECT_EQ(std::memcmp(pools[op].ptr<float>() + kept * n, alone[op].ptr<float>(), n * 4), 0)
          << names[op] << ": the state after row " << r << " (slot " << kept << ")";
      const int64_t W = outs[op].size(1);
      EXPECT_EQ(
          std::memcmp(outs[op].ptr<float>() + r * W, alone_out[op].ptr<float>() + r * W, W * 4), 0)
          << names[op] << ": output row " << r;
    }
  }
  // The fresh sequence beside: as alone (its 3 rows chunked), no rollback slot written for it.
  std::vector<Tensor> alone = copies(), alone_out;
  Rows fresh({{L, 3, 3, 5}});
  run(alone, L, 3, fresh.view(), 4, alone_out);
  for (int op = 0; op < 3; ++op) {
    const int64_t n = pools[op].numel() / 6, W = outs[op].size(1);
    EXPECT_EQ(std::memcmp(pools[op].ptr<float>() + 5 * n, alone[op].ptr<float>() + 5 * n, n * 4), 0)
        << names[op];
    EXPECT_EQ(std::memcmp(outs[op].ptr<float>() + L * W, alone_out[op].ptr<float>(), 3 * W * 4), 0)
        << names[op];
  }
  // A rollback slot that is the sequence's own slot is refused.
  Tensor bad = i32({1, 2, 0, 4, -1, -1, -1, -1});
  view.rollback_slots = &bad;
  std::vector<Tensor> p2 = copies(), o2;
  EXPECT_THROW(run(p2, 0, T, view, 4, o2), Error);
}

// A padding sequence (state slot -1, as decode graphs pad their batches) reads and writes no
// state and gets zero outputs; the sequence beside it runs as alone.
TEST(GatedDelta, PaddingSequencesTouchNoState) {
  const int Hk = 1, Hv = 2, dk = 4, dv = 3;
  const int64_t C = 6, K = 3;
  Tensor q = random_cpu({3, Hk * dk}, DType::kF32, 31),
         k = random_cpu({3, Hk * dk}, DType::kF32, 32);
  Tensor v = random_cpu({3, Hv * dv}, DType::kF32, 33), b = random_cpu({3, Hv}, DType::kF32, 34);
  Tensor a = random_cpu({3, Hv}, DType::kF32, 35), x = random_cpu({3, C}, DType::kF32, 36);
  Tensor A_log = random_cpu({Hv}, DType::kF32, 37), dt_bias = random_cpu({Hv}, DType::kF32, 38);
  Tensor w = random_cpu({C, K}, DType::kF32, 39);
  // Rows 0-1: a padding sequence of 2 tokens; row 2: a decode token of the sequence in slot 1.
  Rows rows({{0, 2, 2, -1}, {2, 1, 5, 1}});
  Rows alone({{2, 1, 5, 1}});
  for (const int chunk : {0, 64}) {
    Tensor state = random_cpu({2, Hv, dk, dv}, DType::kF32, 40);
    Tensor conv = random_cpu({2, C, K - 1}, DType::kF32, 41);
    Tensor state_alone = state.clone(), conv_alone = conv.clone();
    Tensor out = Tensor::empty({3, Hv * dv}, DType::kF32),
           cout = Tensor::empty({3, C}, DType::kF32);
    for (Tensor* t : {&out, &cout})
      for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = NAN;
    kernels::GatedDeltaArgs args{Hk, Hv, dk, dv, chunk};
    kernels::gated_delta_rule(out, q, k, v, b, a, A_log, dt_bias, state, rows.view(), args);
    kernels::short_conv(cout, x, w, conv, rows.view());
    Tensor o1 = Tensor::empty({1, Hv * dv}, DType::kF32), c1 = Tensor::empty({1, C}, DType::kF32);
    kernels::gated_delta_rule(o1, q.narrow(0, 2, 1), k.narrow(0, 2, 1), v.narrow(0, 2, 1),
                              b.narrow(0, 2, 1), a.narrow(0, 2, 1), A_log, dt_bias, state_alone,
                              alone.view(), args);
    kernels::short_conv(c1, x.narrow(0, 2, 1), w, conv_alone, alone.view());
    for (int64_t i = 0; i < 2 * Hv * dv; ++i) EXPECT_EQ(out.ptr<float>()[i], 0.0f) << i;
    for (int64_t i = 0; i < 2 * C; ++i) EXPECT_EQ(cout.ptr<float>()[i], 0.0f) << i;
    for (int64_t i = 0; i < Hv * dv; ++i)
      EXPECT_EQ(out.ptr<float>()[2 * Hv * dv + i], o1.ptr<float>()[i]);
    for (int64_t i = 0; i < C; ++i) EXPECT_EQ(cout.ptr<float>()[2 * C + i], c1.ptr<float>()[i]);
    // Slot 0 (no sequence's) and slot 1 as the lone run left them.
    EXPECT_EQ(std::memcmp(state.data(), state_alone.data(), state.nbytes()), 0);
    EXPECT_EQ(std::memcmp(conv.data(), conv_alone.data(), conv.nbytes()), 0);
  }
}

TEST(GatedDelta, GatedNormAndSigmoidGateMatchTheFormula) {
  const int64_t T = 3, D = 4, N = 8;
  Tensor x = random_cpu({T, N}, DType::kF32, 10, -2.0f, 2.0f);
  Tensor z = random_cpu({T, N}, DType::kF32, 11, -2.0f, 2.0f);
  Tensor w = random_cpu({D}, DType::kF32, 12, 0.5f, 1.5f);
  Tensor out = Tensor::empty({T, N}, DType::kF32);
  kernels::gated_rms_norm(out, x, z, w, 1e-6f);
  Tensor gated = Tensor::empty({T, N}, DType::kF32);
  kernels::mul_sigmoid(gated, x, z);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < N / D; ++g) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += std::pow(x.ptr<float>()[t * N + g * D + i], 2);
      for (int64_t i = 0; i < D; ++i) {
        const int64_t c = t * N + g * D + i;
        const double n = x.ptr<float>()[c] / std::sqrt(ss / D + 1e-6);
        EXPECT_NEAR(out.ptr<float>()[c], w.ptr<float>()[i] * n * silu(z.ptr<float>()[c]), 1e-6);
        EXPECT_NEAR(gated.ptr<float>()[c], x.ptr<float>()[c] * sig(z.ptr<float>()[c]), 1e-6);
      }
    }
}

// transformers' recurrent_kimi_delta_attention with KimiLinearForgetGate's gating, in double:
// out [T, H * d].
std::vector<double> kda_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& f, const Tensor& b, const Tensor& A_log,
                                  const Tensor& dt_bias, int H, int d) {
  const int64_t T = q.size(0), P = static_cast<int64_t>(H) * d;
  std::vector<double> out(static_cast<size_t>(T * P));
  for (int h = 0; h < H; ++h) {
    std::vector<double> S(static_cast<size_t>(d * d), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> qt(d), kt(d), g(d);
      double nq = 0, nk = 0;
      for (int c = 0; c < d; ++c) {
        qt[c] = q.ptr<float>()[t * P + h * d + c];
        kt[c] = k.ptr<float>()[t * P + h * d + c];
        nq += qt[c] * qt[c];
        nk += kt[c] * kt[c];
        const double x = static_cast<double>(f.ptr<float>()[t * P + h * d + c]) +
                         dt_bias.ptr<float>()[h * d + c];
        g[c] = -std::exp(static_cast<double>(A_log.ptr<float>()[h])) *
               (x > 20 ? x : std::log(1.0 + std::exp(x)));
      }
      for (int c = 0; c < d; ++c) {
        qt[c] = qt[c] / std::sqrt(nq + 1e-6) / std::sqrt(static_cast<double>(d));
        kt[c] = kt[c] / std::sqrt(nk + 1e-6);
      }
      const double beta = sig(b.ptr<float>()[t * H + h]);
      for (int c = 0; c < d; ++c)
        for (int e = 0; e < d; ++e) S[c * d + e] *= std::exp(g[c]);  // row c: key channel c
      for (int e = 0; e < d; ++e) {
        double kv = 0;
        for (int c = 0; c < d; ++c) kv += S[c * d + e] * kt[c];
        const double delta = beta * (v.ptr<float>()[t * P + h * d + e] - kv);
        for (int c = 0; c < d; ++c) S[c * d + e] += kt[c] * delta;
      }
      for (int e = 0; e < d; ++e) {
        double o = 0;
        for (int c = 0; c < d; ++c) o += S[c * d + e] * qt[c];
        out[t * P + h * d + e] = o;
      }
    }
  }
  return out;
}

TEST(KimiDelta, RecurrentAndChunkedRulesMatchTheFormulaAcrossSteps) {
  const int H = 3, d = 5;
  const int64_t T = 14, P = H * d;
  Tensor q = random_cpu({T, P}, DType::kF32, 13);
  Tensor k = random_cpu({T, P}, DType::kF32, 14);
  Tensor v = random_cpu({T, P}, DType::kF32, 15, -2.0f, 2.0f);
  Tensor f = random_cpu({T, P}, DType::kF32, 16, -2.0f, 2.0f);
  Tensor b = random_cpu({T, H}, DType::kF32, 17, -2.0f, 2.0f);
  Tensor A_log = random_cpu({H}, DType::kF32, 18, -2.0f, 0.5f);
  Tensor dt_bias = random_cpu({P}, DType::kF32, 19);
  const std::vector<double> want = kda_reference(q, k, v, f, b, A_log, dt_bias, H, d);
  // The decays differ per channel (what separates KDA from the gated delta net's per-head gate).
  const std::vector<std::vector<Part>> steps = {
      {{0, 9, 9, 2}}, {{0, 3, 3, 0}, {9, 4, 13, 2}}, {{13, 1, 14, 2}}};
  for (const int chunk : {0, 4}) {
    SCOPED_TRACE(chunk ? "chunked" : "recurrent");
    Tensor state = Tensor::empty({3, H, d, d}, DType::kF32);
    for (int64_t i = 0; i < state.numel(); ++i) state.ptr<float>()[i] = 7.0f;  // garbage
    kernels::KdaArgs args{H, d, chunk};
    double worst = 0;
    for (const auto& parts : steps) {
      Tensor qs = gather(q, parts), ks = gather(k, parts), vs = gather(v, parts),
             fs = gather(f, parts), bs = gather(b, parts);
      Tensor out = Tensor::empty({qs.size(0), P}, DType::kF32);
      Rows rows(parts);
      kernels::kda_rule(out, qs, ks, vs, fs, bs, A_log, dt_bias, state, rows.view(), args);
      int64_t r = 0;
      for (const Part& p : parts)
        for (int64_t i = 0; i < p.n; ++i, ++r)
          for (int64_t c = 0; c < P; ++c) {
            const double e = std::abs(out.ptr<float>()[r * P + c] - want[(p.r0 + i) * P + c]);
            EXPECT_LE(e, 2e-6) << "row " << p.r0 + i << " column " << c;
            if (!(e <= worst)) worst = e;
          }
    }
    std::printf("kda rule (%s): max |error| %.3g\n", chunk ? "chunked" : "recurrent", worst);
  }
}

TEST(KimiDelta, SigmoidGatedNormMatchesTheFormula) {
  const int64_t T = 3, D = 4, N = 8;
  Tensor x = random_cpu({T, N}, DType::kF32, 20, -2.0f, 2.0f);
  Tensor z = random_cpu({T, N}, DType::kF32, 21, -2.0f, 2.0f);
  Tensor w = random_cpu({D}, DType::kF32, 22, 0.5f, 1.5f);
  Tensor out = Tensor::empty({T, N}, DType::kF32);
  kernels::gated_rms_norm(out, x, z, w, 1e-5f, kernels::NormGate::kSigmoid);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < N / D; ++g) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += std::pow(x.ptr<float>()[t * N + g * D + i], 2);
      for (int64_t i = 0; i < D; ++i) {
        const int64_t c = t * N + g * D + i;
        const double n = x.ptr<float>()[c] / std::sqrt(ss / D + 1e-5);
        EXPECT_NEAR(out.ptr<float>()[c], w.ptr<float>()[i] * n * sig(z.ptr<float>()[c]), 1e-6);
      }
    }
}

}  // namespace
}  // namespace atom::test
