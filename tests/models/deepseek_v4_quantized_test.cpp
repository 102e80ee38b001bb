// DeepSeek-V4 in its official quantised format (issues 35, 39): FP8 e4m3 linears with block scales
// in ".scale" tensors (F32, or ue8m0 F8_E8M0 exponents) and FP4 e2m1 routed experts with F8_E8M0
// scales per 32 values, dequantised at load on the CPU. tools/make_v4_quantized_fixture.py made
// each variant from the BF16 fixture and dequantised it itself (numpy, independently of atom)
// into a BF16 checkpoint: atom's logits from the two must agree, and differ from the unquantised
// fixture's by a quantisation error. Wrong scales, missing ones and unknown formats are errors
// naming the tensor or field.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/compare.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "engine/sequence_runner.h"
#include "loader/safetensors.h"
#include "models/loading.h"

namespace atom::test {
namespace {

std::string quantized_variant_dir(const std::string& variant, const std::string& which) {
  return fixture_dir("deepseek_v4_fp8") + "/" + variant + "/" + which;
}

Tensor quantized_logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  LoadedModel m = model_load(dir, {});
  return score_tokens(*m.model, ids);
}

// atom's dequantisation against the fixture tool's: the same weights, so the same logits (the
// dequantised values are BF16 values exactly); against transformers' unquantised logits, a
// quantisation error: present, and small beside the logits' own spread.
void expect_quantized_variant(const std::string& variant) {
  const Reference ref = reference_load("deepseek_v4");
  const Tensor q = quantized_logits_of(quantized_variant_dir(variant, "quantized"), ref.input_ids);
  const Tensor d =
      quantized_logits_of(quantized_variant_dir(variant, "dequantized"), ref.input_ids);
  const float same = max_abs_diff(q, d, variant + ": quantized vs dequantized");
  EXPECT_LE(same, 1e-5f) << variant;
  const float quant_err = max_abs_diff(q, ref.logits, variant + ": quantized vs unquantised");
  const double rel = rel_err(q, ref.logits, variant);
  EXPECT_GT(quant_err, 1e-3f) << variant << ": the quantisation changed nothing";
  EXPECT_LT(rel, 0.5) << variant << ": more than a quantisation error";
  std::printf("deepseek_v4 %s: quantized vs dequantized max |Δlogit| %.3g; vs the BF16 fixture "
              "max |Δ| %.3g, normalised L2 %.3g\n",
              variant.c_str(), same, quant_err, rel);
}

TEST(DeepseekV4Quantized, Ue8m0ScalesAndFp4ExpertsMatchTheirDequantisedCheckpoint) {
  expect_quantized_variant("ue8m0");
}

TEST(DeepseekV4Quantized, F32ScalesAndFp4ExpertsMatchTheirDequantisedCheckpoint) {
  expect_quantized_variant("f32");
}

// A copy of the ue8m0 variant, its config edited and its tensors rewritten by `edit`.
using QuantTensorList = std::vector<std::pair<std::string, Tensor>>;
void load_quantized_edited(const std::function<void(nlohmann::json&)>& config,
                           const std::function<void(QuantTensorList&)>& tensors = nullptr) {
  TempDir d;
  copy_dir(quantized_variant_dir("ue8m0", "quantized"), d.str());
  const std::string cpath = d.file("config.json");
  nlohmann::json c = json_load_file(cpath);
  if (config) config(c);
  write_file(cpath, c.dump());
  if (tensors) {
    const std::string file = d.file("model.safetensors");
    QuantTensorList all;
    {
      SafetensorsFile f(file, /*use_mmap=*/false);
      for (const auto& e : f.header().entries) all.emplace_back(e.name, f.tensor(e).contiguous());
    }
    tensors(all);
    std::filesystem::remove(file);
    safetensors_write(file, all);
  }
  model_load(d.str(), {});
}

void replace_tensor(QuantTensorList& all, const std::string& name, const Tensor& t) {
  for (auto& [n, v] : all)
    if (n == name) v = t;
}

TEST(DeepseekV4Quantized, MismatchesAreErrorsNamingTheTensorOrField) {
  EXPECT_ERROR_CONTAINS(
      load_quantized_edited([](auto& c) { c["quantization_config"]["scale_fmt"] = "e4m3"; }),
      "'scale_fmt'", "'e4m3'");
  EXPECT_ERROR_CONTAINS(
      load_quantized_edited([](auto& c) { c["quantization_config"]["expert_dtype"] = "int4"; }),
      "'expert_dtype'", "'int4'");
  EXPECT_ERROR_CONTAINS(load_quantized_edited([](auto& c) {
                          c["quantization_config"].erase("expert_dtype");
                          c["expert_dtype"] = "nf4";
                        }),
                        "'expert_dtype'", "'nf4'");
  EXPECT_ERROR_CONTAINS(
      load_quantized_edited([](auto& c) { c["quantization_config"]["quant_method"] = "awq"; }),
      "awq");
  // A linear's scale grid of the wrong shape ([48, 64] in 32x32 blocks is [2, 2]).
  EXPECT_ERROR_CONTAINS(
      load_quantized_edited(
          nullptr,
          [](QuantTensorList& all) {
            replace_tensor(all, "layers.0.attn.wq_a.scale", Tensor::zeros({1, 2}, DType::kE8M0));
          }),
      "layers.0.attn.wq_a.scale", "[1, 2]", "[2, 2]");
  // The same checkpoint read with the block size of another release (V4's 128x128).
  EXPECT_ERROR_CONTAINS(load_quantized_edited([](auto& c) {
                          c["quantization_config"]["weight_block_size"] = {128, 128};
                        }),
                        "weight scale has shape", "[1, 1]");
  // A scale in an integer dtype.
  EXPECT_ERROR_CONTAINS(
      load_quantized_edited(
          nullptr,
          [](QuantTensorList& all) {
            replace_tensor(all, "layers.2.attn.wkv.scale", Tensor::zeros({1, 2}, DType::kI32));
          }),
      "layers.2.attn.wkv", "I32");
  // A missing scale is named before any data is read; so is a scale without its weight.
  EXPECT_ERROR_CONTAINS(load_quantized_edited(nullptr,
                                              [](QuantTensorList& all) {
                                                std::erase_if(all, [](const auto& p) {
                                                  return p.first ==
                                                         "layers.1.attn.indexer.wq_b.scale";
                                                });
                                              }),
                        "layers.1.attn.indexer.wq_b.weight", "no scale");
  EXPECT_ERROR_CONTAINS(load_quantized_edited(nullptr,
                                              [](QuantTensorList& all) {
                                                std::erase_if(all, [](const auto& p) {
                                                  return p.first ==
                                                         "layers.3.ffn.experts.5.w2.scale";
                                                });
                                              }),
                        "layers.3.ffn.experts.5.w2.weight", "no scale");
  EXPECT_ERROR_CONTAINS(load_quantized_edited(nullptr,
                                              [](QuantTensorList& all) {
                                                std::erase_if(all, [](const auto& p) {
                                                  return p.first == "layers.0.attn.wo_b.weight";
                                                });
                                              }),
                        "layers.0.attn.wo_b.scale", "has no weight");
  // An FP4 expert's scales of the wrong shape (w1 [32, 64]: [32, 2] scales).
  EXPECT_ERROR_CONTAINS(load_quantized_edited(nullptr,
                                              [](QuantTensorList& all) {
                                                replace_tensor(
                                                    all, "layers.1.ffn.experts.2.w1.scale",
                                                    Tensor::zeros({32, 1}, DType::kE8M0));
                                              }),
                        "MXFP4 expert 2 gate", "[32, 1] do not pair with values [32, 32]");
  // The experts in BF16 under a quantization_config that says FP4.
  EXPECT_ERROR_CONTAINS(load_quantized_edited(nullptr,
                                              [](QuantTensorList& all) {
                                                replace_tensor(
                                                    all, "layers.0.ffn.experts.0.w3.weight",
                                                    Tensor::zeros({32, 64}, DType::kBF16));
                                              }),
                        "layers.0.ffn.experts.0.w3.weight", "BF16");
}

}  // namespace
}  // namespace atom::test
