// The transformers reference fixtures (tests/fixtures/models, made by tools/make_fixtures.py).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"llama3_gqa", "llama_yarn_bias_legacy",
                                                 "llama_linear_sharded_f32", "qwen3_tied",
                                                 "qwen3_sliding"};
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

}  // namespace atom::test
