// config.json and generation_config.json, read into typed structs. A missing or ill-typed field is
// an Error naming the file and the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "loader/quantization.h"

namespace atom {

// RoPE parameters in one form, whichever way the file wrote them (transformers v5
// `rope_parameters`, or legacy `rope_theta` + `rope_scaling` with `type` or `rope_type`).
struct RopeConfig {
  std::string type = "default";  // default | linear | dynamic | yarn | llama3 | longrope
  double theta = 10000.0;
  double factor = 1.0;
  std::optional<int64_t> original_max_position_embeddings;
  double low_freq_factor = 1.0;                                    // llama3
  double high_freq_factor = 4.0;                                   // llama3
  double beta_fast = 32.0;                                         // yarn
  double beta_slow = 1.0;                                          // yarn
  std::optional<double> mscale, mscale_all_dim, attention_factor;  // yarn
  bool truncate = true;                                            // yarn
  double partial_rotary_factor = 1.0;
};

// The values an integer field may take, inclusive. The default is what most config integers are
// (sizes, counts, indices, token ids): non-negative and small enough for 32 bits.
struct IntRange {
  int64_t lo = 0;
  int64_t hi = INT32_MAX;
};
// The values a number may take; any number must be finite. Open ends exclude the bound.
struct RealRange {
  double lo = -HUGE_VAL;
  double hi = HUGE_VAL;
  bool lo_open = false;
  bool hi_open = false;
  static RealRange positive() { return {0.0, HUGE_VAL, true, false}; }
  static RealRange non_negative() { return {0.0, HUGE_VAL, false, false}; }
};

// A field reader over one JSON object that names the file and field in its errors. Every number
// read is range-checked: integers against an IntRange (by default [0, 2^31 - 1]), reals against a
// RealRange (by default any finite number).
class ConfigFields {
 public:
  ConfigFields() = default;
  ConfigFields(nlohmann::json obj, std::string where)
      : j_(std::move(obj)), where_(std::move(where)) {}

  bool has(const std::string& key) const;  // present and not null
  int64_t get_int(const std::string& key, IntRange range = {}) const;
  int64_t get_int(const std::string& key, int64_t fallback, IntRange range = {}) const;
  double get_double(const std::string& key, RealRange range = {}) const;
  double get_double(const std::string& key, double fallback, RealRange range = {}) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;  // int or list of ints
  std::vector<std::string> get_string_list(const std::string& key) const;
  const nlohmann::json& obj() const { return j_; }
  const std::string& where() const { return where_; }
  [[noreturn]] void bad(const std::string& key, const std::string& why) const;

 private:
  const nlohmann::json& at(const std::string& key) const;
  nlohmann::json j_;
  std::string where_;
};

struct ModelConfig {
  std::string path;  // config.json, for messages
  std::vector<std::string> architectures;
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // 0 when the family has none
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  DType dtype = DType::kF32;  // `dtype` or `torch_dtype`; float32 when absent, as transformers
  RopeConfig rope;
  // rope_parameters given per layer type (e.g. {"full_attention": {...}, "sliding_attention":
  // ...}).
  std::map<std::string, RopeConfig> rope_by_layer_type;
  std::vector<std::string> layer_types;  // one per layer when the file gives them
  std::optional<int64_t> sliding_window;

  // quantization_config, when the weights are stored quantised.
  std::optional<QuantizationConfig> quantization;

  // Every field of the text config (text_config when nested), for family-specific fields.
  ConfigFields text;
  // The whole file.
  ConfigFields root;
};

ModelConfig model_config_parse(const nlohmann::json& j, const std::string& path);
// Reads DIR/config.json.
ModelConfig model_config_load(const std::string& model_dir);

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // stop on any
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::optional<bool> do_sample;
};

GenerationConfig generation_config_parse(const nlohmann::json& j, const std::string& path);
// Reads DIR/generation_config.json; an empty config when the file is absent.
GenerationConfig generation_config_load(const std::string& model_dir);

// Reads a JSON file; an Error naming the file when it is missing or malformed.
nlohmann::json json_load_file(const std::string& path);

}  // namespace atom
