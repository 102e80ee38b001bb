// config.json and generation_config.json in every layout real checkpoints use, and the errors for
// missing or ill-typed fields.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "layers/rotary.h"
#include "loader/hf_config.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

json llama31() {
  // Meta-Llama-3.1-8B's config.json (legacy rope layout), abridged to the fields atom reads.
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
}

TEST(HfConfig, Llama31LegacyLayout) {
  const ModelConfig c = model_config_parse(llama31(), "config.json");
  EXPECT_EQ(c.architectures[0], "LlamaForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(*c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, RopeParametersEqualsLegacyForms) {
  json v5 = llama31();
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                           {"factor", 8.0},           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  json typed = llama31();
  typed["rope_scaling"].erase("rope_type");
  typed["rope_scaling"]["type"] = "llama3";
  const ModelConfig a = model_config_parse(llama31(), "a"), b = model_config_parse(v5, "b"),
                    c = model_config_parse(typed, "c");
  for (const ModelConfig* x : {&b, &c}) {
    EXPECT_EQ(x->rope.type, a.rope.type);
    EXPECT_EQ(x->rope.theta, a.rope.theta);
    EXPECT_EQ(x->rope.factor, a.rope.factor);
    EXPECT_EQ(x->rope.original_max_position_embeddings, a.rope.original_max_position_embeddings);
    EXPECT_EQ(x->dtype, a.dtype);
  }
}

TEST(HfConfig, NoScalingAndPartialRotary) {
  json j = llama31();
  j["rope_scaling"] = nullptr;
  j["partial_rotary_factor"] = 0.5;
  const ModelConfig c = model_config_parse(j, "config.json");
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.rope.partial_rotary_factor, 0.5);
}

TEST(HfConfig, TextConfigNesting) {
  json inner = llama31();
  inner.erase("architectures");
  inner.erase("tie_word_embeddings");
  json outer = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                {"model_type", "qwen3_5"},
                {"tie_word_embeddings", true},
                {"text_config", inner}};
  const ModelConfig c = model_config_parse(outer, "config.json");
  EXPECT_EQ(c.architectures[0], "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_NE(c.text.where().find("text_config"), std::string::npos);
}

TEST(HfConfig, RopeParametersPerLayerType) {
  json j = llama31();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelConfig c = model_config_parse(j, "config.json");
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_by_layer_type.at("sliding_attention").theta, 1e4);
}

TEST(HfConfig, LayerTypesAndSlidingWindow) {
  json j = llama31();
  j["num_hidden_layers"] = 2;
  j["layer_types"] = {"sliding_attention", "full_attention"};
  j["sliding_window"] = 4096;
  const ModelConfig c = model_config_parse(j, "config.json");
  EXPECT_EQ(c.layer_types[0], "sliding_attention");
  EXPECT_EQ(*c.sliding_window, 4096);
  j["layer_types"] = {"full_attention"};
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "cfg.json"), "cfg.json", "layer_types", "1 entries");
}

TEST(HfConfig, ExplicitHeadDim) {
  json j = llama31();
  j["head_dim"] = 256;
  EXPECT_EQ(model_config_parse(j, "c").head_dim, 256);
  j["num_attention_heads"] = 3;
  j.erase("head_dim");
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "head_dim");
}

TEST(HfConfig, ErrorsNameTheField) {
  json j = llama31();
  j.erase("hidden_size");
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "/m/config.json"), "/m/config.json", "'hidden_size'",
                        "missing");
  j = llama31();
  j["num_hidden_layers"] = "many";
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "'num_hidden_layers'", "integer");
  j = llama31();
  j["rope_scaling"]["rope_type"] = "warp";
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "rope_scaling", "warp");
  j = llama31();
  j["rope_scaling"].erase("factor");
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "rope_scaling", "factor");
  j = llama31();
  j["torch_dtype"] = "float7";
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "torch_dtype", "float7");
  j = llama31();
  j["num_key_value_heads"] = 5;
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "num_key_value_heads");
  j = llama31();
  j.erase("architectures");
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "'architectures'");
  j = llama31();
  j["tie_word_embeddings"] = "yes";
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "c"), "tie_word_embeddings");
  EXPECT_ERROR_CONTAINS(model_config_load("/nonexistent"), "/nonexistent/config.json");
  TempDir d;
  write_file(d.file("config.json"), "{\"architectures\": [");
  EXPECT_ERROR_CONTAINS(model_config_load(d.str()), "config.json", "not valid JSON");
}

TEST(HfConfig, DtypeDefaultsToFloat32) {
  json j = llama31();
  j.erase("torch_dtype");
  EXPECT_EQ(model_config_parse(j, "c").dtype, DType::kF32);
}

TEST(GenerationConfig, EosAsIntOrList) {
  const GenerationConfig a = generation_config_parse(
      json::parse(R"({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.6, "top_p": 0.9})"),
      "g");
  EXPECT_EQ(a.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(*a.temperature, 0.6);
  EXPECT_EQ(*a.top_p, 0.9);
  const GenerationConfig b = generation_config_parse(
      json::parse(R"({"eos_token_id": [128001, 128008, 128009], "top_k": 20})"), "g");
  EXPECT_EQ(b.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(*b.top_k, 20);
  EXPECT_ERROR_CONTAINS(
      generation_config_parse(json::parse(R"({"eos_token_id": "x"})"), "gen.json"), "gen.json",
      "eos_token_id");
  EXPECT_TRUE(generation_config_load("/nonexistent").eos_token_ids.empty());
}

// The llama3 and yarn inverse frequencies against the formulas in transformers'
// modeling_rope_utils, evaluated here in double precision.
TEST(Rope, Llama3Frequencies) {
  RopeConfig r;
  r.type = "llama3";
  r.theta = 500000;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 8192;
  const RopeTables t = rope_tables(r, 128, 131072);
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128);
    const double wl = 2 * M_PI / f;
    double want;
    if (wl < 8192 / 4.0) {
      want = f;
    } else if (wl > 8192 / 1.0) {
      want = f / 8;
    } else {
      const double s = (8192 / wl - 1) / (4 - 1);
      want = (1 - s) * f / 8 + s * f;
    }
    EXPECT_NEAR(t.inv_freq[i], want, want * 1e-5) << i;
  }
  EXPECT_EQ(t.attention_factor, 1.0f);
}

TEST(Rope, YarnAttentionFactorAndRamp) {
  RopeConfig r;
  r.type = "yarn";
  r.theta = 150000;
  r.factor = 32;
  r.original_max_position_embeddings = 4096;
  r.truncate = false;  // gpt-oss
  const RopeTables t = rope_tables(r, 64, 131072);
  EXPECT_NEAR(t.attention_factor, 0.1 * std::log(32.0) + 1, 1e-6);
  // The highest frequencies are extrapolated (unchanged), the lowest interpolated (divided).
  EXPECT_NEAR(t.inv_freq[0], 1.0, 1e-6);
  const double last = 1.0 / std::pow(150000.0, 62.0 / 64);
  EXPECT_NEAR(t.inv_freq[31], last / 32, last / 32 * 1e-5);
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

TEST(QuantizationConfig, MethodAndExclusions) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["X"], "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "vocab_size": 16,
    "quantization_config": {"quant_method": "mxfp4",
      "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head", "re:.*\\.router$"]}})");
  const ModelConfig c = model_config_parse(j, "config.json");
  ASSERT_TRUE(c.quantization);
  EXPECT_EQ(c.quantization->method, "mxfp4");
  EXPECT_TRUE(c.quantization->excludes("model.layers.3.self_attn"));
  EXPECT_TRUE(c.quantization->excludes("model.layers.3.self_attn.q_proj"));  // inside it
  EXPECT_TRUE(c.quantization->excludes("lm_head"));
  EXPECT_FALSE(c.quantization->excludes("lm_head_extra"));  // a prefix is a whole component
  EXPECT_TRUE(c.quantization->excludes("model.layers.0.mlp.router"));
  EXPECT_FALSE(c.quantization->excludes("model.layers.0.mlp.experts"));
  nlohmann::json none = j;
  none.erase("quantization_config");
  EXPECT_FALSE(model_config_parse(none, "config.json").quantization);
}

TEST(QuantizationConfig, BadFieldsAreNamed) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["X"], "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "vocab_size": 16, "quantization_config": {"modules_to_not_convert": []}})");
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "config.json"), "quantization_config",
                        "quant_method");
  j["quantization_config"] = {{"quant_method", "fp8"}, {"ignore", {"re:("}}};
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "config.json"), "ignore", "re:(");
  j["quantization_config"] = 3;
  EXPECT_ERROR_CONTAINS(model_config_parse(j, "config.json"), "quantization_config", "object");
}

}  // namespace
}  // namespace atom::test

namespace atom::test {
namespace {

// Every number config.json gives is range-checked, and the error names the file and the field.
TEST(HfConfig, OutOfRangeFieldsAreRefusedByName) {
  struct Case {
    const char* patch;  // merged into Llama 3.1's config
    const char* field;
    const char* why;
  };
  for (
      const Case& k : {
          Case{R"({"rms_norm_eps": -1})", "'rms_norm_eps'", "(0, 1)"},
          Case{R"({"rms_norm_eps": 0})", "'rms_norm_eps'", "(0, 1)"},
          Case{
              R"({"rope_scaling": {"rope_type": "llama3", "factor": 0, "original_max_position_embeddings": 8192}})",
              "'factor'", "positive"},
          Case{
              R"({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4, "original_max_position_embeddings": 8192}})",
              "'high_freq_factor'", "greater than low_freq_factor"},
          Case{
              R"({"rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 0}})",
              "'original_max_position_embeddings'", "[1, "},
          Case{R"({"rope_scaling": {"rope_type": "yarn", "factor": -4}})", "'factor'", "positive"},
          Case{R"({"rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": -1}})",
               "'beta_fast'", "positive"},
          Case{R"({"rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": -1}})", "'mscale'",
               "negative"},
          Case{R"({"rope_scaling": null, "rope_theta": 0})", "'rope_theta'", "positive"},
          Case{R"({"partial_rotary_factor": 1.5})", "'partial_rotary_factor'", "(0, 1]"},
          Case{R"({"hidden_size": -4096})", "'hidden_size'", "[1, "},
          Case{R"({"hidden_size": 9223372036854775807})", "'hidden_size'", "[1, "},
          Case{R"({"vocab_size": 4294967301})", "'vocab_size'", "[1, 2147483647]"},
          Case{R"({"num_hidden_layers": 0})", "'num_hidden_layers'", "[1, "},
          Case{R"({"num_key_value_heads": 0})", "'num_key_value_heads'", "[1, "},
          Case{R"({"intermediate_size": -1})", "'intermediate_size'", "[0, "},
          Case{R"({"max_position_embeddings": 18446744073709551615})", "'max_position_embeddings'",
               "at most"},
          Case{R"({"head_dim": -1})", "'head_dim'", "[0, "},
          Case{R"({"sliding_window": 0})", "'sliding_window'", "[1, "},
      }) {
    json j = llama31();
    j.merge_patch(json::parse(k.patch));
    EXPECT_ERROR_CONTAINS(model_config_parse(j, "/m/config.json"), "/m/config.json", k.field,
                          k.why);
  }
  // A model's own fields read through the same ranges.
  ConfigFields f(json::parse(R"({"n": 5, "big": 4294967301, "neg": -3, "x": 0.5})"), "f.json");
  EXPECT_EQ(f.get_int("n", IntRange{1, 8}), 5);
  EXPECT_ERROR_CONTAINS(f.get_int("n", IntRange{1, 4}), "f.json", "'n'", "[1, 4]", "got 5");
  EXPECT_ERROR_CONTAINS(f.get_int("big"), "'big'", "2147483647");
  EXPECT_ERROR_CONTAINS(f.get_int("neg"), "'neg'", "[0, ");
  EXPECT_EQ(f.get_int("neg", IntRange{-5, 5}), -3);
  EXPECT_EQ(f.get_int("absent", 7), 7);
  EXPECT_ERROR_CONTAINS(f.get_double("x", RealRange{1.0, 2.0}), "'x'", "[1, 2]");
  EXPECT_EQ(f.get_double("x", 3.0, RealRange::positive()), 0.5);
}

}  // namespace
}  // namespace atom::test
