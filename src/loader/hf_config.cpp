#include "loader/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace atom {

using json = nlohmann::json;

json json_load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open (missing file?)", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

void ConfigFields::bad(const std::string& key, const std::string& why) const {
  fail("{}: field '{}' {}", where_, key, why);
}

bool ConfigFields::has(const std::string& key) const {
  return j_.is_object() && j_.contains(key) && !j_[key].is_null();
}

const json& ConfigFields::at(const std::string& key) const {
  if (!has(key)) bad(key, "is missing");
  return j_[key];
}

int64_t ConfigFields::get_int(const std::string& key, IntRange range) const {
  const json& v = at(key);
  int64_t x = 0;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad(key, fmt::format("must be at most {}, got {}", range.hi, v.dump()));
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::abs(v.get<double>()) < 9.2e18 &&
             v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    bad(key, "must be an integer, got " + v.dump());
  }
  if (x < range.lo || x > range.hi)
    bad(key, fmt::format("must be in [{}, {}], got {}", range.lo, range.hi, x));
  return x;
}
int64_t ConfigFields::get_int(const std::string& key, int64_t fallback, IntRange range) const {
  return has(key) ? get_int(key, range) : fallback;
}
double ConfigFields::get_double(const std::string& key, RealRange range) const {
  const json& v = at(key);
  if (!v.is_number()) bad(key, "must be a number, got " + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x)) bad(key, "must be a finite number, got " + v.dump());
  const bool low = range.lo_open ? !(x > range.lo) : !(x >= range.lo);
  const bool high = range.hi_open ? !(x < range.hi) : !(x <= range.hi);
  if (low || high) {
    std::string want;
    if (range.lo == 0 && range.lo_open && range.hi == HUGE_VAL)
      want = "must be positive";
    else if (range.lo == 0 && !range.lo_open && range.hi == HUGE_VAL)
      want = "must not be negative";
    else
      want = fmt::format("must be in {}{}, {}{}", range.lo_open ? "(" : "[", range.lo, range.hi,
                         range.hi_open ? ")" : "]");
    bad(key, fmt::format("{}, got {}", want, x));
  }
  return x;
}
double ConfigFields::get_double(const std::string& key, double fallback, RealRange range) const {
  return has(key) ? get_double(key, range) : fallback;
}
bool ConfigFields::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_[key];
  if (!v.is_boolean()) bad(key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}
std::string ConfigFields::get_string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string()) bad(key, "must be a string, got " + v.dump());
  return v.get<std::string>();
}
std::string ConfigFields::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}
std::vector<int64_t> ConfigFields::get_int_list(const std::string& key) const {
  const json& v = at(key);
  std::vector<int64_t> r;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array()) bad(key, "must be an integer or a list of integers, got " + v.dump());
  for (const auto& x : v) {
    if (!x.is_number_integer()) bad(key, "must be a list of integers, got " + v.dump());
    r.push_back(x.get<int64_t>());
  }
  return r;
}
std::vector<std::string> ConfigFields::get_string_list(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) bad(key, "must be a list of strings, got " + v.dump());
  std::vector<std::string> r;
  for (const auto& x : v) {
    if (!x.is_string()) bad(key, "must be a list of strings, got " + v.dump());
    r.push_back(x.get<std::string>());
  }
  return r;
}

namespace {

const char* const kRopeTypes[] = {"default", "linear",   "dynamic", "yarn",
                                  "llama3",  "longrope", "mrope"};

// Fills `r` from one rope parameter object (v5 rope_parameters or legacy rope_scaling).
void rope_fill(RopeConfig& r, const ConfigFields& f, const std::string& field) {
  if (f.has("rope_type")) {
    r.type = f.get_string("rope_type");
  } else if (f.has("type")) {
    r.type = f.get_string("type");
  }
  if (r.type == "su") r.type = "longrope";  // transformers' old alias
  bool known = false;
  for (const char* t : kRopeTypes) known |= r.type == t;
  if (!known) fail("{}: {}: unknown rope type '{}'", f.where(), field, r.type);
  const RealRange positive = RealRange::positive();
  r.theta = f.get_double("rope_theta", r.theta, positive);
  r.factor = f.get_double("factor", r.factor, positive);
  if (f.has("original_max_position_embeddings"))
    r.original_max_position_embeddings =
        f.get_int("original_max_position_embeddings", IntRange{1, INT32_MAX});
  r.low_freq_factor = f.get_double("low_freq_factor", r.low_freq_factor, positive);
  r.high_freq_factor = f.get_double("high_freq_factor", r.high_freq_factor, positive);
  r.beta_fast = f.get_double("beta_fast", r.beta_fast, positive);
  r.beta_slow = f.get_double("beta_slow", r.beta_slow, positive);
  if (f.has("mscale")) r.mscale = f.get_double("mscale", RealRange::non_negative());
  if (f.has("mscale_all_dim"))
    r.mscale_all_dim = f.get_double("mscale_all_dim", RealRange::non_negative());
  if (f.has("attention_factor")) r.attention_factor = f.get_double("attention_factor", positive);
  r.truncate = f.get_bool("truncate", r.truncate);
  r.partial_rotary_factor = f.get_double("partial_rotary_factor", r.partial_rotary_factor,
                                         RealRange{0.0, 1.0, true, false});
  if (r.type == "llama3" && !(r.high_freq_factor > r.low_freq_factor))
    f.bad("high_freq_factor", fmt::format("must be greater than low_freq_factor ({}), got {}",
                                          r.low_freq_factor, r.high_freq_factor));
  if (r.type == "llama3" || r.type == "linear" || r.type == "yarn" || r.type == "dynamic") {
    if (!f.has("factor")) fail("{}: {}: rope type '{}' needs 'factor'", f.where(), field, r.type);
  }
  if (r.type == "llama3" && !r.original_max_position_embeddings)
    fail("{}: {}: rope type 'llama3' needs 'original_max_position_embeddings'", f.where(), field);
}

void rope_parse(ModelConfig& c, const ConfigFields& t) {
  RopeConfig base;
  base.theta = t.get_double("rope_theta", 10000.0, RealRange::positive());
  base.partial_rotary_factor =
      t.get_double("partial_rotary_factor", 1.0, RealRange{0.0, 1.0, true, false});
  const json& j = t.obj();
  if (t.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (!rp.is_object()) t.bad("rope_parameters", "must be an object");
    // Per-layer-type form: every value is an object.
    bool nested = !rp.empty();
    for (auto it = rp.begin(); it != rp.end(); ++it) nested &= it.value().is_object();
    if (nested) {
      for (auto it = rp.begin(); it != rp.end(); ++it) {
        RopeConfig r = base;
        rope_fill(r, ConfigFields(it.value(), t.where()), "rope_parameters." + it.key());
        c.rope_by_layer_type[it.key()] = r;
      }
      auto full = c.rope_by_layer_type.find("full_attention");
      c.rope =
          full != c.rope_by_layer_type.end() ? full->second : c.rope_by_layer_type.begin()->second;
    } else {
      c.rope = base;
      rope_fill(c.rope, ConfigFields(rp, t.where()), "rope_parameters");
    }
  } else {
    c.rope = base;
    if (t.has("rope_scaling")) {
      const json& rs = j["rope_scaling"];
      if (!rs.is_object()) t.bad("rope_scaling", "must be an object or null");
      rope_fill(c.rope, ConfigFields(rs, t.where()), "rope_scaling");
    }
  }
  if (c.rope.theta <= 0) fail("{}: rope_theta must be positive", t.where());
}

}  // namespace

ModelConfig model_config_parse(const json& j, const std::string& path) {
  if (!j.is_object()) fail("{}: not a JSON object", path);
  ModelConfig c;
  c.path = path;
  c.root = ConfigFields(j, path);
  // Multimodal wrappers keep the language model's fields in text_config.
  if (c.root.has("text_config")) {
    if (!j["text_config"].is_object()) c.root.bad("text_config", "must be an object");
    c.text = ConfigFields(j["text_config"], path + " (text_config)");
  } else {
    c.text = c.root;
  }
  const ConfigFields& t = c.text;
  c.architectures = c.root.get_string_list("architectures");
  // A wrapper's quantization_config may sit in its text_config (Kimi-K3).
  c.quantization = quantization_config_parse(c.root);
  if (!c.quantization && c.root.has("text_config")) c.quantization = quantization_config_parse(t);
  if (c.architectures.empty()) c.root.bad("architectures", "is empty");
  c.model_type = t.get_string("model_type", c.root.get_string("model_type", ""));
  // Upper bounds keep every product of sizes (weights, caches) well inside 64 bits.
  const IntRange size{1, 1 << 20};
  c.hidden_size = t.get_int("hidden_size", size);
  c.num_hidden_layers = t.get_int("num_hidden_layers", IntRange{1, 1 << 14});
  c.num_attention_heads = t.get_int("num_attention_heads", IntRange{1, 1 << 14});
  c.vocab_size = t.get_int("vocab_size", IntRange{1, INT32_MAX});
  c.intermediate_size = t.get_int("intermediate_size", 0, IntRange{0, 1 << 22});
  c.num_key_value_heads =
      t.get_int("num_key_value_heads", c.num_attention_heads, IntRange{1, 1 << 14});
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    t.bad("num_key_value_heads", fmt::format("must divide num_attention_heads ({}), got {}",
                                             c.num_attention_heads, c.num_key_value_heads));
  if (t.has("head_dim")) {
    // 0 is kept for the models that read no head_dim (GLM-5.3 writes its RoPE width there); the
    // others refuse it by name (ModelSupport::head_dim).
    c.head_dim = t.get_int("head_dim", IntRange{0, 1 << 14});
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      t.bad("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // Configs whose class maps max_position_embeddings to model_max_length (transformers'
  // attribute_map, e.g. Kimi-Linear's) store only the latter.
  c.max_position_embeddings = t.get_int("max_position_embeddings",
                                        t.get_int("model_max_length", 2048, IntRange{1, INT32_MAX}),
                                        IntRange{1, INT32_MAX});
  c.rms_norm_eps = t.get_double("rms_norm_eps", 1e-6, RealRange{0.0, 1.0, true, true});
  c.tie_word_embeddings = c.root.has("tie_word_embeddings")
                              ? c.root.get_bool("tie_word_embeddings", false)
                              : t.get_bool("tie_word_embeddings", false);
  c.attention_bias = t.get_bool("attention_bias", false);
  c.mlp_bias = t.get_bool("mlp_bias", false);
  c.hidden_act = t.get_string("hidden_act", "silu");

  const ConfigFields* dtype_src = t.has("dtype") || t.has("torch_dtype") ? &t : &c.root;
  const char* dkey = dtype_src->has("dtype") ? "dtype" : "torch_dtype";
  if (dtype_src->has(dkey)) {
    const std::string s = dtype_src->get_string(dkey);
    const auto d = dtype_from_torch_name(s);
    if (!d) dtype_src->bad(dkey, "names an unknown dtype '" + s + "'");
    c.dtype = *d;
  }

  rope_parse(c, t);

  if (t.has("layer_types")) {
    c.layer_types = t.get_string_list("layer_types");
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
      t.bad("layer_types", fmt::format("has {} entries but num_hidden_layers is {}",
                                       c.layer_types.size(), c.num_hidden_layers));
  }
  if (t.has("sliding_window")) {
    c.sliding_window = t.get_int("sliding_window", IntRange{1, INT32_MAX});
  }
  return c;
}

ModelConfig model_config_load(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  return model_config_parse(json_load_file(path), path);
}

GenerationConfig generation_config_parse(const json& j, const std::string& path) {
  if (!j.is_object()) fail("{}: not a JSON object", path);
  ConfigFields f(j, path);
  GenerationConfig g;
  if (f.has("eos_token_id")) g.eos_token_ids = f.get_int_list("eos_token_id");
  if (f.has("bos_token_id")) g.bos_token_id = f.get_int("bos_token_id");
  if (f.has("pad_token_id")) {
    // Some files give a list here too; the first is the pad token.
    const auto pads = f.get_int_list("pad_token_id");
    if (!pads.empty()) g.pad_token_id = pads[0];
  }
  if (f.has("temperature")) g.temperature = f.get_double("temperature");
  if (f.has("top_p")) g.top_p = f.get_double("top_p");
  if (f.has("min_p")) g.min_p = f.get_double("min_p");
  if (f.has("repetition_penalty")) g.repetition_penalty = f.get_double("repetition_penalty");
  if (f.has("top_k")) g.top_k = f.get_int("top_k");
  if (f.has("max_new_tokens")) g.max_new_tokens = f.get_int("max_new_tokens");
  if (f.has("do_sample")) g.do_sample = f.get_bool("do_sample", false);
  return g;
}

GenerationConfig generation_config_load(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return {};
  return generation_config_parse(json_load_file(path), path);
}

}  // namespace atom
