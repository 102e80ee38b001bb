#include "engine/sampling_params.h"

#include <climits>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace atom {

void SamplingParams::validate(int64_t vocab_size) const {
  if (n < 1) fail("n must be at least 1, got {}", n);
  if (!std::isfinite(temperature) || temperature < 0)
    fail("temperature must be non-negative, got {}", temperature);
  if (!(top_p > 0 && top_p <= 1)) fail("top_p must be in (0, 1], got {}", top_p);
  if (top_k < -1) fail("top_k must be 0 or -1 (disable), or at least 1, got {}", top_k);
  if (!(min_p >= 0 && min_p <= 1)) fail("min_p must be in [0, 1], got {}", min_p);
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    fail("repetition_penalty must be greater than zero, got {}", repetition_penalty);
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    fail("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    fail("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (max_tokens < 0) fail("max_tokens must be at least 0, got {}", max_tokens);
  if (min_tokens < 0) fail("min_tokens must be at least 0, got {}", min_tokens);
  if (min_tokens > max_tokens)
    fail("min_tokens must be less than or equal to max_tokens={}, got {}", max_tokens, min_tokens);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size)
      fail("logit_bias token id {} is outside the vocabulary [0, {})", id, vocab_size);
    if (!std::isfinite(bias)) fail("logit_bias for token {} must be finite, got {}", id, bias);
  }
  for (int32_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      fail("stop_token_ids entry {} is outside the vocabulary [0, {})", id, vocab_size);
  for (const auto& s : stop)
    if (s.empty()) fail("stop cannot contain an empty string");
  if (logprobs && (*logprobs < -1 || *logprobs > vocab_size))
    fail("logprobs must be -1 (whole vocabulary) or in [0, {}], got {}", vocab_size, *logprobs);
  if (prompt_logprobs && (*prompt_logprobs < -1 || *prompt_logprobs > vocab_size))
    fail("prompt_logprobs must be -1 (whole vocabulary) or in [0, {}], got {}", vocab_size,
         *prompt_logprobs);
}

SamplingParams sampling_params_defaults(const GenerationConfig& gen) {
  SamplingParams p;
  if (gen.temperature) p.temperature = *gen.temperature;
  if (gen.top_p) p.top_p = *gen.top_p;
  if (gen.top_k) p.top_k = static_cast<int>(*gen.top_k);
  if (gen.min_p) p.min_p = *gen.min_p;
  if (gen.repetition_penalty) p.repetition_penalty = *gen.repetition_penalty;
  if (gen.max_new_tokens) p.max_tokens = static_cast<int>(*gen.max_new_tokens);
  return p;
}

namespace {

using nlohmann::json;

[[noreturn]] void bad_type(const std::string& key, const char* want, const json& v) {
  fail("request field '{}' must be {}, got {}", key, want, v.dump());
}

double get_number(const json& j, const std::string& key) {
  const json& v = j.at(key);
  if (!v.is_number()) bad_type(key, "a number", v);
  return v.get<double>();
}

int64_t get_integer(const json& j, const std::string& key) {
  const json& v = j.at(key);
  if (!v.is_number_integer()) bad_type(key, "an integer", v);
  return v.get<int64_t>();
}

int get_int(const json& j, const std::string& key) {
  const int64_t v = get_integer(j, key);
  if (v < INT32_MIN || v > INT32_MAX) fail("request field '{}' is out of range: {}", key, v);
  return static_cast<int>(v);
}

bool get_bool(const json& j, const std::string& key) {
  const json& v = j.at(key);
  if (!v.is_boolean()) bad_type(key, "true or false", v);
  return v.get<bool>();
}

std::vector<int32_t> get_id_list(const json& j, const std::string& key) {
  const json& v = j.at(key);
  if (!v.is_array()) bad_type(key, "a list of token ids", v);
  std::vector<int32_t> r;
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
      bad_type(key, "a list of token ids", v);
    r.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return r;
}

bool present(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

}  // namespace

SamplingParams sampling_params_from_json(const json& j, SamplingParams p) {
  if (!j.is_object()) fail("a request must be a JSON object, got {}", j.dump());
  if (present(j, "n")) p.n = get_int(j, "n");
  if (present(j, "temperature")) p.temperature = get_number(j, "temperature");
  if (present(j, "top_p")) p.top_p = get_number(j, "top_p");
  if (present(j, "top_k")) p.top_k = get_int(j, "top_k");
  if (present(j, "min_p")) p.min_p = get_number(j, "min_p");
  if (present(j, "repetition_penalty")) p.repetition_penalty = get_number(j, "repetition_penalty");
  if (present(j, "presence_penalty")) p.presence_penalty = get_number(j, "presence_penalty");
  if (present(j, "frequency_penalty")) p.frequency_penalty = get_number(j, "frequency_penalty");
  if (present(j, "logit_bias")) {
    const json& lb = j.at("logit_bias");
    if (!lb.is_object()) bad_type("logit_bias", "an object of {\"token id\": bias}", lb);
    p.logit_bias.clear();
    for (const auto& [k, v] : lb.items()) {
      char* end = nullptr;
      const long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
        fail("logit_bias key '{}' is not a token id", k);
      if (!v.is_number()) bad_type("logit_bias." + k, "a number", v);
      p.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
  if (present(j, "seed")) p.seed = get_integer(j, "seed");
  if (present(j, "max_tokens")) p.max_tokens = get_int(j, "max_tokens");
  if (present(j, "max_completion_tokens")) p.max_tokens = get_int(j, "max_completion_tokens");
  if (present(j, "min_tokens")) p.min_tokens = get_int(j, "min_tokens");
  if (present(j, "stop")) {
    const json& s = j.at("stop");
    p.stop.clear();
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& e : s) {
        if (!e.is_string()) bad_type("stop", "a string or a list of strings", s);
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      bad_type("stop", "a string or a list of strings", s);
    }
  }
  if (present(j, "stop_token_ids")) p.stop_token_ids = get_id_list(j, "stop_token_ids");
  if (present(j, "ignore_eos")) p.ignore_eos = get_bool(j, "ignore_eos");
  if (present(j, "include_stop_str_in_output"))
    p.include_stop_str_in_output = get_bool(j, "include_stop_str_in_output");
  if (present(j, "skip_special_tokens")) p.skip_special_tokens = get_bool(j, "skip_special_tokens");
  // Completions style: "logprobs": k. Chat style: "logprobs": true, "top_logprobs": k.
  if (present(j, "logprobs")) {
    const json& v = j.at("logprobs");
    if (v.is_boolean()) {
      if (v.get<bool>())
        p.logprobs = present(j, "top_logprobs") ? get_int(j, "top_logprobs") : 0;
      else
        p.logprobs.reset();
    } else {
      p.logprobs = get_int(j, "logprobs");
    }
  } else if (present(j, "top_logprobs")) {
    fail("request field 'top_logprobs' needs 'logprobs' set to true");
  }
  if (present(j, "prompt_logprobs")) p.prompt_logprobs = get_int(j, "prompt_logprobs");
  return p;
}

}  // namespace atom
