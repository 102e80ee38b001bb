// Integer request parameters out of the engine's range: each is a 400 naming the parameter, never a
// value wrapped to another one (4294967301 is token 5 in 32 bits) or a length check that overflows.
#include <gtest/gtest.h>

#include <cstdint>

#include "server/api_error.h"
#include "server/protocol.h"

namespace atom::test {
namespace {

using json = nlohmann::ordered_json;

// The parameter a completion (or chat) request body is refused for; "" when it parses.
std::string refused_param(json body, bool chat = false) {
  try {
    if (chat) {
      body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
      server::chat_request_parse(body);
    } else {
      body["prompt"] = "hi";
      server::completion_request_parse(body);
    }
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param();
  }
  return "";
}

const int64_t kI64Max = INT64_MAX;
const uint64_t kU64Max = UINT64_MAX;
const int64_t kWrapsTo5 = 4294967301;  // 2^32 + 5

TEST(RequestLimits, OversizedIntegersNameTheirParameter) {
  for (bool chat : {false, true}) {
    const char* mt = chat ? "max_completion_tokens" : "max_tokens";
    EXPECT_EQ(refused_param({{"max_tokens", kI64Max}}, chat), "max_tokens");
    EXPECT_EQ(refused_param({{mt, kI64Max}}, chat), mt);
    EXPECT_EQ(refused_param({{"max_tokens", kU64Max}}, chat), "max_tokens");
    EXPECT_EQ(refused_param({{"max_tokens", int64_t{INT32_MAX} + 1}}, chat), "max_tokens");
    EXPECT_EQ(refused_param({{"logit_bias", {{std::to_string(kWrapsTo5), 100}}}}, chat),
              "logit_bias");
    EXPECT_EQ(refused_param({{"logit_bias", {{"99999999999999999999999", 1}}}}, chat),
              "logit_bias");
    EXPECT_EQ(refused_param({{"stop_token_ids", {kWrapsTo5}}}, chat), "stop_token_ids");
    EXPECT_EQ(refused_param({{"stop_token_ids", {kU64Max}}}, chat), "stop_token_ids");
    EXPECT_EQ(refused_param({{"top_k", kWrapsTo5}}, chat), "top_k");
    EXPECT_EQ(refused_param({{"min_tokens", kWrapsTo5}}, chat), "min_tokens");
    EXPECT_EQ(refused_param({{"n", kWrapsTo5}}, chat), "n");
    EXPECT_EQ(refused_param({{"n", kU64Max}}, chat), "n");
    EXPECT_EQ(refused_param({{"seed", kU64Max}}, chat), "seed");
    EXPECT_EQ(refused_param({{"prompt_logprobs", kWrapsTo5}}, chat), "prompt_logprobs");
    EXPECT_EQ(refused_param({{"max_tokens", 1e300}}, chat), "max_tokens");
    // In range: accepted, and kept exactly.
    EXPECT_EQ(refused_param({{"max_tokens", INT32_MAX},
                             {"seed", kI64Max},
                             {"top_k", 40},
                             {"stop_token_ids", {INT32_MAX}},
                             {"logit_bias", {{"2147483647", 1}}}},
                            chat),
              "");
  }
  EXPECT_EQ(refused_param({{"logprobs", kWrapsTo5}}), "logprobs");
  EXPECT_EQ(refused_param({{"logprobs", true}, {"top_logprobs", kWrapsTo5}}, true), "top_logprobs");
  EXPECT_EQ(refused_param({{"best_of", kWrapsTo5}}), "best_of");
  json body = {{"prompt", "hi"},
               {"max_tokens", INT32_MAX},
               {"seed", kI64Max},
               {"stop_token_ids", {7}},
               {"logit_bias", {{"7", 1.5}}}};
  const auto r = server::completion_request_parse(body);
  EXPECT_EQ(*r.sampling.max_tokens, INT32_MAX);
  EXPECT_EQ(*r.sampling.seed, kI64Max);
  EXPECT_EQ(r.sampling.stop_token_ids, std::vector<int64_t>{7});
}

}  // namespace
}  // namespace atom::test
