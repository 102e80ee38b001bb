// SamplingParams: vLLM's defaults, generation_config precedence, request JSON overlay, and errors
// that name the parameter.
#include "engine/sampling_params.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace atom {
namespace {

std::string error_of(const SamplingParams& p) {
  try {
    p.validate(1000);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SamplingParams, VllmDefaults) {
  const SamplingParams p = sampling_params_defaults(GenerationConfig{});
  EXPECT_EQ(p.temperature, 1.0);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0);
  EXPECT_EQ(p.repetition_penalty, 1.0);
  EXPECT_EQ(p.presence_penalty, 0.0);
  EXPECT_EQ(p.frequency_penalty, 0.0);
  EXPECT_EQ(p.n, 1);
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_EQ(error_of(p), "");
}

TEST(SamplingParams, RequestOverridesGenerationConfigOverridesDefaults) {
  GenerationConfig g;
  g.temperature = 0.6;
  g.top_p = 0.9;
  g.top_k = 20;
  g.repetition_penalty = 1.05;
  g.max_new_tokens = 100;
  const SamplingParams base = sampling_params_defaults(g);
  EXPECT_EQ(base.temperature, 0.6);
  EXPECT_EQ(base.top_k, 20);
  EXPECT_EQ(base.max_tokens, 100);
  const SamplingParams r = sampling_params_from_json(
      nlohmann::json::parse(R"({"temperature": 0.1, "top_k": -1, "stop": "x", "seed": 7,
        "logit_bias": {"5": -2.5}, "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 9,
        "stop_token_ids": [1, 2], "presence_penalty": null})"),
      base);
  EXPECT_EQ(r.temperature, 0.1);
  EXPECT_EQ(r.top_k, -1);
  EXPECT_EQ(r.top_p, 0.9) << "fields the request leaves out keep generation_config's value";
  EXPECT_EQ(r.repetition_penalty, 1.05);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.seed, 7);
  ASSERT_EQ(r.logit_bias.size(), 1u);
  EXPECT_EQ(r.logit_bias[0].first, 5);
  EXPECT_FLOAT_EQ(r.logit_bias[0].second, -2.5f);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.presence_penalty, 0.0);
}

TEST(SamplingParams, InvalidValuesNameTheParameter) {
  auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return error_of(p);
  };
  EXPECT_EQ(with([](SamplingParams& p) { p.top_p = 1.5; }), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(with([](SamplingParams& p) { p.top_p = 0; }), "top_p must be in (0, 1], got 0");
  EXPECT_EQ(with([](SamplingParams& p) { p.temperature = -1; }),
            "temperature must be non-negative, got -1");
  EXPECT_NE(with([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.min_p = 2; }).find("min_p"), std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.presence_penalty = 3; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.frequency_penalty = -3; }).find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.n = 0; }).find("n must be"), std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.max_tokens = -1; }).find("max_tokens"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.min_tokens = 20; }).find("min_tokens"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) {
              p.logit_bias = {{1000, 1.0f}};
            }).find("logit_bias"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.stop_token_ids = {-1}; }).find("stop_token_ids"),
            std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.stop = {""}; }).find("stop"), std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.logprobs = -2; }).find("logprobs"), std::string::npos);
  EXPECT_NE(with([](SamplingParams& p) { p.prompt_logprobs = 5000; }).find("prompt_logprobs"),
            std::string::npos);
}

TEST(SamplingParams, IllTypedJsonNamesTheField) {
  try {
    sampling_params_from_json(nlohmann::json::parse(R"({"top_p": "high"})"), SamplingParams{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'top_p'"), std::string::npos) << e.what();
  }
  try {
    sampling_params_from_json(nlohmann::json::parse(R"({"top_logprobs": 2})"), SamplingParams{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_logprobs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atom
