// The transformers reference fixtures (tests/fixtures/models, made by tools/make_fixtures.py).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/compare.h"
#include "core/tensor.h"
#include "loader/safetensors.h"

namespace atom::test {

// The source tree: ATOM_SOURCE_DIR from the environment (tests run from a copy elsewhere, as on
// the GPU machine), else the one this binary was built from.
inline std::string source_dir() {
  const char* e = std::getenv("ATOM_SOURCE_DIR");
  return e && *e ? e : ATOM_SOURCE_DIR;
}

inline std::string fixture_dir(const std::string& name) {
  return source_dir() + "/tests/fixtures/models/" + name;
}

// Dense models: their logits move smoothly with rounding (FP8 caches, bf16 kernels).
inline const std::vector<std::string>& dense_fixture_names() {
  static const std::vector<std::string> names = {"llama3_gqa", "llama_yarn_bias_legacy",
                                                 "llama_linear_sharded_f32", "qwen3_tied",
                                                 "qwen3_sliding"};
  return names;
}

// Mixtures of experts: a rounding change near a router tie picks another expert, so only
// fp32-exact paths are compared against the references token for token.
// Multi-head latent attention, dense and sparse (all of them mixtures of experts too).
inline const std::vector<std::string>& mla_fixture_names() {
  static const std::vector<std::string> names = {"deepseek_v2_lite", "deepseek_v2",
                                                 "deepseek_v3",      "deepseek_v3_plain",
                                                 "deepseek_v32",     "glm_moe_dsa"};
  return names;
}

inline const std::vector<std::string>& moe_fixture_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = {"qwen3_moe",    "qwen3_moe_stacked", "mixtral",      "glm4_moe",
                                    "glm4_moe_air", "gpt_oss",           "gpt_oss_mxfp4"};
    for (const auto& n : mla_fixture_names()) all.push_back(n);
    return all;
  }();
  return names;
}

// The MoE fixtures the GPU model tests run: all of them (GPT-OSS's clamped SwiGLU and expert
// biases are in the CUDA kernels; its MXFP4 fixture stays MXFP4 on the GPU (W4A16); the
// multi-head latent attention fixtures run the latent attention and indexer kernels of
// src/kernels/cuda/mla*.cu).
inline std::vector<std::string> moe_gpu_fixture_names() { return moe_fixture_names(); }

// Hybrids of linear attention (Gated DeltaNet, Kimi delta attention) and full attention, with
// per-request recurrent state in the state slot pool; all but dense Qwen3.5 are mixtures of
// experts too; Kimi-K3 (kimi_k3: SiTU, gated MLA, the full-rank KDA gate, the latent MoE,
// attention residuals; kimi_k3_mxfp4: its routed experts MXFP4 in compressed-tensors' packing)
// against tools/kimi_k3_reference.py, transformers having none. On the GPU:
// tests/gpu/models/hybrid_model_gpu_test.cpp.
inline const std::vector<std::string>& hybrid_fixture_names() {
  static const std::vector<std::string> names = {
      "qwen3_next",           "qwen3_5", "qwen3_5_moe",  "qwen3_5_moe_per_expert", "kimi_linear",
      "kimi_linear_moonshot", "kimi_k3", "kimi_k3_mxfp4"};
  return names;
}
// FP8 checkpoints (quant_method fp8 with 128x128 and 48x48 blocks, compressed-tensors per
// channel and per tensor, fbgemm_fp8), whose references are transformers on the dequantised
// weights: on the CPU they are dequantised at load and held to the same bounds.
inline const std::vector<std::string>& fp8_fixture_names() {
  static const std::vector<std::string> names = {"deepseek_v3_fp8", "deepseek_v3_fp8_partial",
                                                 "llama_fp8_channel", "qwen3_fp8_tensor",
                                                 "llama_fbgemm_fp8"};
  return names;
}

// The hyper-connection families (issue 35), CPU only so far: DeepSeek-V4 (compressed attention)
// and GLM-5.3 (KDA with the safe gate, MLA without RoPE over a k-pool indexer's picks).
inline const std::vector<std::string>& hyper_connection_fixture_names() {
  static const std::vector<std::string> names = {"deepseek_v4", "glm5_next"};
  return names;
}

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = dense_fixture_names();
    for (const auto& n : moe_fixture_names()) all.push_back(n);
    for (const auto& n : hybrid_fixture_names()) all.push_back(n);
    for (const auto& n : hyper_connection_fixture_names()) all.push_back(n);
    for (const auto& n : fp8_fixture_names()) all.push_back(n);
    return all;
  }();
  return names;
}

// Largest |atom fp32 CPU logit - transformers fp32 logit| accepted on a fixture. Measured
// 0.9-1.6e-5 over the five dense fixtures (tests/models/parity_test prints it): two fp32
// implementations summing in different orders. 3e-5 is about twice the largest. It is what
// catches a dropped RMSNorm epsilon: that moves llama3_gqa (eps 1e-5) by 2.0e-4 and qwen3_tied
// by 8.8e-5, while the fixtures with eps 1e-6 move by 2.6e-5, inside fp32 noise (the 1e-3 used
// before caught it on none; tools/mutate.py plants it).
inline constexpr float kCpuLogitTolerance = 3e-5f;

// Largest |tensor-parallel CPU logit - single-rank CPU logit|: the all-reduce adds the ranks'
// partial sums in another order. Measured 5.7-8.1e-6 on tp 2 and 4 (tests/models/
// tensor_parallel_test, tests/engine/engine_tp_test); 3e-5 leaves four times that.
inline constexpr float kTpLogitTolerance = 3e-5f;

// The hybrids (Gated DeltaNet): max |Δlogit| 0.83-4.7e-4 over the four fixtures, on a few rows
// only, and as much between atom's own chunked and recurrent delta rules on the same rows (rows
// whose delta-rule output is small, where the gated RMSNorm and the l2-normalised q/k amplify fp32
// rounding); 1e-3 is about twice the largest. Every row is held tighter by the normalised L2
// error: measured 1.3-3.3e-6 (the dense fixtures: 0.5-0.8e-6), bound 7e-6.
inline constexpr float kHybridCpuLogitTolerance = 1e-3f;
inline constexpr double kHybridCpuRelTolerance = 7e-6;

// GLM-5.3 (hyper_connection_fixture_names, CPU only) is such a hybrid too (KDA): measured
// 4.2e-5 max |Δlogit| over its 96 rows.
inline bool is_hybrid_fixture(const std::string& name) {
  const auto& h = hybrid_fixture_names();
  return std::find(h.begin(), h.end(), name) != h.end() || name == "glm5_next";
}

// The gated delta net hybrids amplify the all-reduce's reordering as they amplify any fp32
// rounding (above): tensor-parallel against single-rank logits measured 3.4-4.3e-5 on
// qwen3_next, qwen3_5_moe (tp 2), a tenth of their difference from transformers; 1e-4 is about
// twice that. A rank holding the wrong heads moves them by O(1).
inline constexpr float kHybridTpLogitTolerance = 1e-4f;
// Kimi-K3's fixture amplifies rounding about twice as much again (its attention residuals mix
// every layer's output into every later one): tp 2 against one rank measured 1.8e-4 (pipeline 3 x
// tp 2, chunks of 5), max |Δ| against its reference 3.9e-4 (bound 1e-3).
inline constexpr float kKimiK3TpLogitTolerance = 4e-4f;
inline float tp_logit_tolerance(const std::string& name) {
  if (name.starts_with("kimi_k3")) return kKimiK3TpLogitTolerance;
  const auto& h = hybrid_fixture_names();
  return std::find(h.begin(), h.end(), name) != h.end() ? kHybridTpLogitTolerance
                                                        : kTpLogitTolerance;
}

// CPU fp32 logits of fixture `name` against transformers': max |Δ| within the family's bound
// (and, for the hybrids, the normalised L2 error within kHybridCpuRelTolerance). Returns max |Δ|.
inline float expect_cpu_parity(const Tensor& got, const Tensor& want, const std::string& name,
                               const std::string& what) {
  if (!is_hybrid_fixture(name)) return expect_logits_near(got, want, kCpuLogitTolerance, what);
  const float d = expect_logits_near(got, want, kHybridCpuLogitTolerance, what);
  const double r = rel_err(got, want, what);
  EXPECT_LE(r, kHybridCpuRelTolerance) << what << ": normalised L2 error";
  std::printf("%s: normalised L2 error %.3g\n", what.c_str(), r);
  return d;
}

struct Reference {
  std::vector<int32_t> input_ids, greedy_prompt, greedy_tokens;
  Tensor logits;  // F32 [T, V], owned copy
};

inline std::vector<int32_t> ids_of(const Tensor& t) {
  std::vector<int32_t> r;
  for (int64_t i = 0; i < t.numel(); ++i) r.push_back(static_cast<int32_t>(t.ptr<int64_t>()[i]));
  return r;
}

inline Reference reference_load(const std::string& name) {
  SafetensorsFile f(source_dir() + "/tests/fixtures/references/" + name + ".safetensors",
                    /*use_mmap=*/true);
  Reference r;
  r.input_ids = ids_of(f.tensor("input_ids"));
  r.greedy_prompt = ids_of(f.tensor("greedy_prompt"));
  r.greedy_tokens = ids_of(f.tensor("greedy_tokens"));
  r.logits = f.tensor("logits").clone();
  return r;
}

// The reference's margin between its top two logits at each greedy step.
inline std::vector<float> reference_margins(const std::string& name) {
  SafetensorsFile f(source_dir() + "/tests/fixtures/references/" + name + ".safetensors", true);
  Tensor m = f.tensor("greedy_margins").clone();
  return std::vector<float>(m.ptr<float>(), m.ptr<float>() + m.numel());
}

// The fixture's greedy sequence as one token list: the prompt followed by every greedy token
// but the last. Scoring it gives, in row greedy_prompt.size() - 1 + i, the logits that choose
// greedy token i with the reference's own tokens as context (teacher forcing), so every step can
// be checked, not only those before a first divergence.
inline std::vector<int32_t> greedy_sequence(const Reference& r) {
  std::vector<int32_t> s = r.greedy_prompt;
  s.insert(s.end(), r.greedy_tokens.begin(), r.greedy_tokens.end() - 1);
  return s;
}

// How many leading greedy steps of fixture `name` have a reference margin of at least `noise`:
// a path whose top-2 margins are off by less than `noise` must reproduce at least these.
inline size_t leading_steps_above(const std::string& name, float noise) {
  const std::vector<float> m = reference_margins(name);
  size_t i = 0;
  while (i < m.size() && m[i] >= noise) ++i;
  return i;
}

// The largest error of the reference's top-2 margin over the rows of `got` against `want`
// (logits [T, V] of the same tokens): max over rows r of |(got[a] - got[b]) - (want[a] - want[b])|
// with a, b the reference's two largest logits of row r. What can flip a greedy choice is the
// error of that difference, which is usually far below twice the largest error of any logit.
inline float max_margin_error(const Tensor& got, const Tensor& want) {
  if (!expect_same_shape(got, want, "max_margin_error"))
    return std::numeric_limits<float>::infinity();
  const Tensor g = f32_host(got), w = f32_host(want);
  const int64_t T = w.size(0), V = w.size(1);
  float worst = 0;
  for (int64_t r = 0; r < T; ++r) {
    const float* x = g.ptr<float>() + r * V;
    const float* y = w.ptr<float>() + r * V;
    int64_t a = 0, b = -1;
    for (int64_t v = 1; v < V; ++v) {
      if (y[v] > y[a]) {
        b = a;
        a = v;
      } else if (b < 0 || y[v] > y[b]) {
        b = v;
      }
    }
    const float e = std::abs((x[a] - x[b]) - (y[a] - y[b]));
    if (!(e <= worst)) worst = e;  // a NaN propagates
  }
  return worst;
}

// Free-running greedy tokens `got` against fixture `name`'s `want`. Checked:
//   - both have the same length;
//   - at least `min_steps` leading steps agree (a stated minimum: a helper that stops at the
//     first uncertain step would otherwise pass on zero agreeing steps);
//   - the first differing step, if any, has a reference margin below `noise` (where the path's
//     own error could flip the choice). After it the contexts differ and nothing is compared.
// Prints and returns the number of leading steps that agree.
inline size_t expect_greedy_agrees(const std::string& name, const std::vector<int32_t>& got,
                                   const std::vector<int32_t>& want, float noise,
                                   size_t min_steps) {
  EXPECT_EQ(got.size(), want.size()) << name << ": greedy run lengths differ";
  const size_t n = std::min(got.size(), want.size());
  size_t i = 0;
  while (i < n && got[i] == want[i]) ++i;
  if (i < n) {
    const float margin = reference_margins(name).at(i);
    EXPECT_LT(margin, noise) << name << ": greedy token " << i << " is " << got[i] << ", not "
                             << want[i] << ", where the reference margin " << margin
                             << " is above the noise level " << noise;
  }
  EXPECT_GE(i, min_steps) << name << ": greedy tokens agree for " << i << " of " << want.size()
                          << " steps, fewer than the " << min_steps << " required";
  std::printf("%s: greedy tokens agree for %zu of %zu steps (at least %zu required, noise %.3g)\n",
              name.c_str(), i, want.size(), min_steps, noise);
  return i;
}

struct ForcedGreedy {
  size_t agree = 0;    // steps whose argmax is the reference token
  size_t leading = 0;  // of which leading (a free-running greedy run reproduces these)
};

// Teacher-forced greedy check: `logits` scores greedy_sequence(reference_load(name)) (rows
// [P - 1 + i] choose step i). At every step whose reference margin is at least `noise` the
// argmax must be the reference token, and at least `min_steps` steps must agree in all. Prints
// and returns the counts.
inline ForcedGreedy expect_forced_greedy_agrees(const std::string& name, const Tensor& logits,
                                                float noise, size_t min_steps) {
  const Reference ref = reference_load(name);
  const std::vector<float> margins = reference_margins(name);
  const int64_t P = static_cast<int64_t>(ref.greedy_prompt.size());
  const int64_t n = static_cast<int64_t>(ref.greedy_tokens.size());
  const Tensor l = f32_host(logits);
  ForcedGreedy r;
  if (l.dim() != 2 || l.size(0) != P + n - 1) {
    ADD_FAILURE() << name << ": teacher-forced logits " << shape_str(l.shape()) << " for "
                  << P + n - 1 << " tokens";
    return r;
  }
  const int64_t V = l.size(1);
  bool leading = true;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = l.ptr<float>() + (P - 1 + i) * V;
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (std::isnan(row[v])) {
        ADD_FAILURE() << name << ": NaN logit at teacher-forced step " << i;
        return r;
      }
      if (row[v] > row[best]) best = v;
    }
    const int32_t want = ref.greedy_tokens[static_cast<size_t>(i)];
    const float margin = margins[static_cast<size_t>(i)];
    const bool same = best == want;
    r.agree += same;
    leading = leading && same;
    r.leading += leading;
    if (margin >= noise) {
      EXPECT_TRUE(same) << name << ": teacher-forced step " << i << " chooses " << best << ", not "
                        << want << ", where the reference margin " << margin
                        << " is above the noise level " << noise;
    }
  }
  EXPECT_GE(r.agree, min_steps) << name << ": teacher-forced greedy steps agree for " << r.agree
                                << " of " << n << ", fewer than the " << min_steps << " required";
  std::printf("%s: teacher-forced greedy steps agree for %zu of %lld, %zu leading (at least %zu "
              "required, noise %.3g)\n",
              name.c_str(), r.agree, static_cast<long long>(n), r.leading, min_steps, noise);
  return r;
}

}  // namespace atom::test
