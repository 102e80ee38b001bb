// What a request asks of generation, with vLLM's names, defaults and checks. Defaults come from
// the model's generation_config.json, then vLLM's (sampling_params_defaults); a request overrides
// them field by field (sampling_params_from_json).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/logits_constraint.h"
#include "loader/hf_config.h"

namespace atom {

struct SamplingParams {
  int n = 1;                                          // parallel samples of the same prompt
  double temperature = 1.0;                           // < 1e-5: greedy
  double top_p = 1.0;                                 // (0, 1]
  int top_k = 0;                                      // 0 or -1: off
  double min_p = 0.0;                                 // [0, 1]
  double repetition_penalty = 1.0;                    // > 0; 1: off (prompt and output tokens)
  double presence_penalty = 0.0;                      // [-2, 2] (output tokens)
  double frequency_penalty = 0.0;                     // [-2, 2] (output tokens)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  std::optional<int64_t> seed;    // per request; the engine draws one when absent
  int max_tokens = 16;            // >= 0
  int min_tokens = 0;             // EOS and stop_token_ids are suppressed until then
  std::vector<std::string> stop;  // matched on the detokenized output text
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // passed to the detokenizer
  // Top log-probabilities returned per output token besides the sampled one's; -1: the whole
  // vocabulary. Values are log_softmax of the model's raw logits (vLLM's raw_logprobs).
  std::optional<int> logprobs;
  std::optional<int> prompt_logprobs;  // the same for every prompt position after the first
  // Structured output: the tokens each step may draw (a compiled grammar); shared, immutable.
  std::shared_ptr<const LogitsConstraint> constraint;

  bool greedy() const { return temperature < kGreedyEpsilon; }
  // Greedy sampling of exactly n tokens (EOS ignored): the benchmarks' and tests' requests.
  static SamplingParams greedy_tokens(int n) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = n;
    p.ignore_eos = true;
    return p;
  }
  bool has_penalties() const {
    return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0;
  }

  // Throws an Error naming the first invalid parameter and its value ("top_p must be in (0, 1],
  // got 1.5"). vocab_size bounds token ids (logit_bias, stop_token_ids) and logprob counts.
  void validate(int64_t vocab_size) const;

  static constexpr double kGreedyEpsilon = 1e-5;  // vLLM's _SAMPLING_EPS
};

// vLLM's defaults overlaid with the model's generation_config.json (temperature, top_p, top_k,
// min_p, repetition_penalty, max_new_tokens -> max_tokens), as vLLM's --generation-config auto.
SamplingParams sampling_params_defaults(const GenerationConfig& gen);

// Overlays the fields present in a request object (OpenAI / vLLM names: temperature, top_p, top_k,
// min_p, repetition_penalty, presence_penalty, frequency_penalty, logit_bias {"id": bias}, seed,
// n, max_tokens (or max_completion_tokens), min_tokens, stop (string or list), stop_token_ids,
// ignore_eos, include_stop_str_in_output, skip_special_tokens, logprobs (int, or bool with
// top_logprobs), prompt_logprobs) on `base`. Unknown keys are left to the caller. Ill-typed values
// are Errors naming the field.
SamplingParams sampling_params_from_json(const nlohmann::json& request, SamplingParams base);

}  // namespace atom
