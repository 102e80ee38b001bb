// DeepSeek-V4 beyond the parity fixture: the config read in DeepSeek's own legacy form
// (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling with compress_rope_theta)
// and the checkpoint under DeepSeek's release names (no "model." prefix, embed, hc_head_*, an
// mtp.* stage) give transformers' logits too; bad fields are errors naming them; the compressed
// planes' geometry.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "layers/compressed_kv.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"
#include "models/loading.h"

namespace atom::test {
namespace {

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/config.json";
  nlohmann::json c = json_load_file(path);
  edit(c);
  write_file(path, c.dump());
}

void load_edited(const std::function<void(nlohmann::json&)>& edit) {
  TempDir d;
  copy_dir(fixture_dir("deepseek_v4"), d.str());
  edit_config(d.str(), edit);
  model_load(d.str(), {});
}

TEST(DeepseekV4, BadFieldsAreErrorsNamingThem) {
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["num_key_value_heads"] = 2; }),
                        "'num_key_value_heads'", "must be 1");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["o_groups"] = 3; }), "'o_groups'",
                        "must divide num_attention_heads (4)");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["compress_rates"]["local_attention"] = 8; }),
                        "'compress_rates'", "'local_attention'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["mlp_layer_types"][1] = "dense"; }),
                        "'mlp_layer_types'", "'dense'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["scoring_func"] = "relu"; }), "'scoring_func'",
                        "'relu'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["layer_types"][2] = "full_attention"; }),
                        "'layer_types'", "'full_attention'");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["partial_rotary_factor"] = 0.3; }),
                        "'partial_rotary_factor'", "even");
  EXPECT_ERROR_CONTAINS(load_edited([](auto& c) { c["index_cache_dtype"] = "int8"; }),
                        "'index_cache_dtype'", "'fp8' or 'fp4'", "'int8'");
  EXPECT_NO_THROW(load_edited([](auto& c) { c["index_cache_dtype"] = "fp4"; }));
  // An FP8 KV cache on the CPU: refused by name, never a float written into a byte plane.
  LoadedModel m = model_load(fixture_dir("deepseek_v4"), {});
  EXPECT_ERROR_CONTAINS(score_tokens(*m.model, {5, 6, 7}, 0, 16, DType::kF8E4M3),
                        "must be contiguous F32");
}

// DeepSeek's release: legacy config fields and the top-level names without "model.".
TEST(DeepseekV4, LegacyConfigAndReleaseNamesGiveTransformersLogits) {
  const Reference ref = reference_load("deepseek_v4");
  TempDir d;
  copy_dir(fixture_dir("deepseek_v4"), d.str());
  edit_config(d.str(), [](auto& c) {
    for (const char* k : {"layer_types", "compress_rates", "mlp_layer_types", "rope_parameters",
                          "partial_rotary_factor"})
      c.erase(k);
    c["compress_ratios"] = {16, 4, 0, 4, 0};  // one more entry than layers: the MTP stage's
    c["compress_rate_hca"] = 16;
    c["num_hash_layers"] = 1;
    c["qk_rope_head_dim"] = 8;
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", 4.0},
                         {"original_max_position_embeddings", 64},
                         {"beta_fast", 32.0},
                         {"beta_slow", 1.0}};
  });
  const std::string file = d.file("model.safetensors");
  std::vector<std::pair<std::string, Tensor>> renamed;
  {
    SafetensorsFile f(file, /*use_mmap=*/false);
    for (const auto& e : f.header().entries) {
      std::string n = e.name;
      if (n == "model.embed_tokens.weight")
        n = "embed.weight";
      else if (n.rfind("model.hc_head.hc_", 0) == 0)
        n = "hc_head_" + n.substr(17);
      else if (n.rfind("model.", 0) == 0)
        n = n.substr(6);
      renamed.emplace_back(n, f.tensor(e).contiguous());
    }
  }
  // An MTP stage the target model does not read.
  renamed.emplace_back("mtp.0.attn.wq_a.weight", Tensor::zeros({48, 64}, DType::kBF16));
  std::filesystem::remove(file);
  safetensors_write(file, renamed);
  LoadedModel m = model_load(d.str(), {});
  const float diff = expect_cpu_parity(score_tokens(*m.model, ref.input_ids), ref.logits,
                                       "deepseek_v4", "deepseek_v4, legacy config and names");
  std::printf("deepseek_v4, legacy config and release names: max |Δlogit| %.3g\n", diff);
}

TEST(CompressedKv, RowsLiveInThePageOfTheirWindowsLastToken) {
  EXPECT_EQ(CacheSpec::rows(32, 4, DType::kF32).rows_per_page(16), 4);
  EXPECT_EQ(CacheSpec::rows(32, 128, DType::kF32).rows_per_page(16), 1);
  EXPECT_EQ(CacheSpec::rows(32, 1, DType::kF32).rows_per_page(16), 16);
  EXPECT_EQ(CacheSpec::rows(32, 4, DType::kF32).page_bytes(16), 4u * 32 * 4);
  EXPECT_ERROR_CONTAINS(CacheSpec::rows(32, 6, DType::kF32).rows_per_page(16),
                        "a row every 6 tokens");
  // Pages 7, 3, 9, 1 of 4 tokens; windows of 8 tokens: window 0 ends at token 7 (page 3),
  // window 1 at token 15 (page 1); windows of 2: window 5 (tokens 10, 11) in page 9, row 1.
  const int32_t pages[] = {7, 3, 9, 1};
  Tensor big = Tensor::zeros({10, 1, 1, 5}, DType::kF32);
  const PagedRows r8{pages, 4, 8};
  EXPECT_EQ(r8.row(big, 0), big.ptr<float>() + 3 * 5);
  EXPECT_EQ(r8.row(big, 1), big.ptr<float>() + 1 * 5);
  Tensor small = Tensor::zeros({10, 2, 1, 5}, DType::kF32);
  const PagedRows r2{pages, 4, 2};
  EXPECT_EQ(r2.row(small, 5), small.ptr<float>() + (9 * 2 + 1) * 5);
}

}  // namespace
}  // namespace atom::test
