// Splits a model's reasoning (<think> ... </think>) from its answer, on whole outputs and on a
// stream of text deltas whose tag boundaries may fall anywhere; and vLLM's --reasoning-parser
// names for the families that write it that way. (gpt-oss's harmony channels are split by the
// harmony parser, make_tool_parser("openai"), since its calls live in the same structure.)
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atom::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

struct ReasoningFormat {
  std::string start = "<think>", end = "</think>";
  // The output is reasoning until the end tag (the prompt opened the block, or the model's
  // format starts there); a start tag at the output's beginning is dropped. Otherwise the
  // output is reasoning only when it begins with the start tag.
  bool starts_in_reasoning = false;
  // A tag that also ends reasoning and begins the content, kept there (Kimi K2 may go straight
  // from thinking to its tool-call section).
  std::string also_ends;
  // The prompt already closed the block (Qwen3's `<think>\n\n</think>\n\n` when thinking is off),
  // or the request turned thinking off: the output is the answer, so a grammar constrains it
  // from its first token (vLLM's reasoning end found in the prompt) instead of after an end tag.
  bool ended_in_prompt = false;
};

class ReasoningParser {
 public:
  // starts_in_reasoning: the prompt already opened the block (templates that end the generation
  // prompt with "<think>"), so output is reasoning until the end tag.
  explicit ReasoningParser(bool starts_in_reasoning, std::string start_tag = "<think>",
                           std::string end_tag = "</think>");
  explicit ReasoningParser(ReasoningFormat format);

  // Feeds the next piece of output; returns what can be attributed now (a possible partial tag is
  // held back until the next piece decides it).
  ReasoningDelta feed(const std::string& text);
  // End of output: releases anything held back.
  ReasoningDelta finish();

  // Whole-output convenience.
  static ReasoningDelta split(const std::string& output, bool starts_in_reasoning);

  const ReasoningFormat& format() const { return format_; }

  // True when a rendered prompt leaves the model inside a reasoning block.
  static bool prompt_opens_reasoning(const std::string& prompt);
  // True when a rendered prompt ends (whitespace aside) with the block's end tag: it opened and
  // closed the block itself.
  static bool prompt_closes_reasoning(const std::string& prompt, const std::string& end_tag);

 private:
  enum class State { kStart, kStartReasoning, kReasoning, kContent };
  State state_;
  ReasoningFormat format_;
  std::string held_;            // text not yet attributed
  bool skip_newlines_ = false;  // newlines right after the end tag are dropped
};

// vLLM's --reasoning-parser names that atom implements: deepseek_r1, deepseek_v3, glm45,
// kimi_k2, openai_gptoss, qwen3; reasoning_parser_known also takes "none" (no split, where
// without a parser atom splits what the chat template shows; docs/serving.md).
const std::vector<std::string>& reasoning_parser_names();
bool reasoning_parser_known(const std::string& name);
// The parser `name` sets up for one request, given its rendered prompt and its chat template
// variables (deepseek_v3 splits only with `thinking`, kimi_k2 not with `thinking: false`, as
// vLLM's); nullptr when it splits nothing for this request, and for openai_gptoss (see above).
// Throws std::invalid_argument for an unknown name.
std::unique_ptr<ReasoningParser> make_reasoning_parser(
    const std::string& name, const std::string& prompt,
    const nlohmann::ordered_json& chat_template_kwargs);

}  // namespace atom::server
