// The transformers reference fixtures (tests/fixtures/models, made by tools/make_fixtures.py).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

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
  static const std::vector<std::string> names = {"deepseek_v2_lite", "deepseek_v2", "deepseek_v3",
                                                 "deepseek_v3_plain", "deepseek_v32",
                                                 "glm_moe_dsa"};
  return names;
}

inline const std::vector<std::string>& moe_fixture_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = {"qwen3_moe", "qwen3_moe_stacked", "mixtral", "glm4_moe",
                                    "glm4_moe_air"};
    for (const auto& n : mla_fixture_names()) all.push_back(n);
    return all;
  }();
  return names;
}

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = dense_fixture_names();
    for (const auto& n : moe_fixture_names()) all.push_back(n);
    return all;
  }();
  return names;
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

// Greedy tokens against fixture `name`'s: identical up to the first step whose reference margin
// is below `noise` (where rounding may flip the choice). Returns how many leading steps agree.
inline size_t expect_greedy_agrees(const std::string& name, const std::vector<int32_t>& got,
                                   const std::vector<int32_t>& want, float noise) {
  size_t i = 0;
  while (i < got.size() && got[i] == want[i]) ++i;
  if (i < got.size()) {
    const float margin = reference_margins(name).at(i);
    EXPECT_LT(margin, noise) << name << ": greedy token " << i << " differs with margin " << margin;
  }
  return i;
}

// max |a - b| over two F32 tensors of the same shape; infinity when the shapes or dtypes differ
// and NaN when any difference is NaN, so that `EXPECT_LE(max_abs_diff(..), tol)` fails on both.
inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != DType::kF32 || b.dtype() != DType::kF32)
    return INFINITY;
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float d = std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]);
    if (std::isnan(d)) return NAN;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace atom::test
