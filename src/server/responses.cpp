#include "server/responses.h"

#include <chrono>
#include <random>

#include <fmt/format.h>

namespace atom::server {

std::string response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}-{:016x}{:016x}", prefix, rng(), rng());
}

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ojson LogprobRenderer::bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

ojson LogprobRenderer::completion_empty() {
  return ojson{{"text_offset", ojson::array()},
               {"token_logprobs", ojson::array()},
               {"tokens", ojson::array()},
               {"top_logprobs", ojson::array()}};
}

void LogprobRenderer::completion(const std::vector<TokenLogprob>& lps, size_t& text_offset,
                                 ojson& into, bool first_is_prompt_start) {
  for (size_t i = 0; i < lps.size(); ++i) {
    const TokenLogprob& lp = lps[i];
    const std::string tok = backend_.token_text(lp.token_id);
    into["tokens"].push_back(tok);
    into["text_offset"].push_back(text_offset);
    text_offset += tok.size();
    if (first_is_prompt_start && i == 0) {
      // The first prompt token has no logprob (nothing precedes it).
      into["token_logprobs"].push_back(nullptr);
      into["top_logprobs"].push_back(nullptr);
      continue;
    }
    into["token_logprobs"].push_back(lp.logprob);
    ojson top = ojson::object();
    for (const auto& t : lp.top) top[backend_.token_text(t.token_id)] = t.logprob;
    into["top_logprobs"].push_back(top);
  }
}

ojson LogprobRenderer::chat(const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (const auto& lp : lps) {
    const std::string tok = backend_.token_text(lp.token_id);
    ojson top = ojson::array();
    for (const auto& t : lp.top) {
      const std::string tt = backend_.token_text(t.token_id);
      top.push_back({{"token", tt}, {"logprob", t.logprob}, {"bytes", bytes_of(tt)}});
    }
    content.push_back(
        {{"token", tok}, {"logprob", lp.logprob}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}});
  }
  return content;
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens,
                 std::optional<int64_t> cached_tokens) {
  ojson u = {{"prompt_tokens", prompt_tokens},
             {"total_tokens", prompt_tokens + completion_tokens},
             {"completion_tokens", completion_tokens}};
  u["prompt_tokens_details"] =
      cached_tokens ? ojson{{"cached_tokens", *cached_tokens}} : ojson(nullptr);
  return u;
}

std::string sse_event(const ojson& j) {
  return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::string sse_named_event(const std::string& event, const ojson& j) {
  return "event: " + event + "\n" + sse_event(j);
}

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace atom::server
