// Response bodies and SSE chunks for /v1/completions and /v1/chat/completions, in vLLM's shapes.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/reasoning.h"
#include "server/tool_parser.h"

namespace atom::server {

using ojson = nlohmann::ordered_json;

// "cmpl-…" / "chatcmpl-…" ids.
std::string response_id(const std::string& prefix);
// `prefix` then 32 hex digits ("resp_…", "msg_…", "toolu_…").
std::string random_id(const std::string& prefix);
int64_t unix_time_now();

// Renders logprobs the two ways the APIs want them.
class LogprobRenderer {
 public:
  explicit LogprobRenderer(Backend& backend) : backend_(backend) {}
  // Completions: {"text_offset", "token_logprobs", "tokens", "top_logprobs"}, appended to `into`.
  void completion(const std::vector<TokenLogprob>& lps, size_t& text_offset, ojson& into,
                  bool first_is_prompt_start = false);
  static ojson completion_empty();
  // Chat: a list of {"token", "logprob", "bytes", "top_logprobs"}.
  ojson chat(const std::vector<TokenLogprob>& lps);

 private:
  ojson bytes_of(const std::string& s);
  Backend& backend_;
};

// The state of one choice over a request's life.
struct ChoiceState {
  int index = 0;
  std::string text;
  std::string reasoning;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  std::optional<std::string> finish_reason;
  nlohmann::json stop_reason;
  std::unique_ptr<ReasoningParser> reasoning_parser;  // chat models with <think> blocks
  std::unique_ptr<ToolParser> tool_parser;  // tool_choice "auto" with --enable-auto-tool-choice
  int tool_calls_sent = 0;                  // streamed so far
};

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens,
                 std::optional<int64_t> cached_tokens);

std::string sse_event(const ojson& j);
std::string sse_done();
// An SSE event with an event name (the Responses and Anthropic Messages streams).
std::string sse_named_event(const std::string& event, const ojson& j);

}  // namespace atom::server
