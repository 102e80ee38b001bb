// A forward step keeps one decoder layer's activations at a time (DecoderOnlyLM hands each
// layer's scratch back to the step arena): the arena's high-water mark is the same for a model of
// 2 layers and one of 8, where keeping every layer's tensors would grow it fourfold.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "core/arena.h"
#include "layers/batch.h"
#include "layers/context.h"
#include "models/loading.h"

namespace atom::test {
namespace {

size_t step_high_water(int num_layers) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("atom_activation_memory_" + std::to_string(num_layers));
  std::filesystem::create_directories(dir);
  nlohmann::json config;
  std::ifstream(fixture_dir("llama3_gqa") + "/config.json") >> config;
  config["num_hidden_layers"] = num_layers;
  std::ofstream(dir / "config.json") << config.dump();
  LoadedModel m = model_load(dir.string(), ModelOptions{}, LoadFormat::kDummy);
  std::filesystem::remove_all(dir);

  constexpr int kTokens = 96, kBlock = 16;
  KvCache kv = KvCache::allocate(m.model->cache_specs(), kTokens / kBlock, kBlock, Device::cpu());
  Batch b;
  b.block_size = kBlock;
  for (int i = 0; i < kTokens; ++i) {
    b.token_ids.push_back(i % 500);
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
  }
  b.query_start = {0, kTokens};
  b.context_lens = {kTokens};
  b.page_indptr = {0, kTokens / kBlock};
  for (int p = 0; p < kTokens / kBlock; ++p) b.page_indices.push_back(p);
  b.logits_indices = {kTokens - 1};
  b.state_slots = {0};
  b.validate();
  Arena arena(Device::cpu());
  b.upload(arena);
  Step step{b, arena, &kv};
  Tensor hidden = m.model->forward(step);
  Tensor logits = m.model->compute_logits(step, hidden);
  EXPECT_EQ(logits.size(0), 1);
  return arena.high_water();
}

TEST(ModelMemory, StepActivationsDoNotGrowWithDepth) {
  const size_t two = step_high_water(2), eight = step_high_water(8);
  EXPECT_GT(two, 0u);
  EXPECT_EQ(eight, two);
}

}  // namespace
}  // namespace atom::test
