// Splits a model's reasoning (<think> ... </think>) from its answer, on whole outputs and on a
// stream of text deltas whose tag boundaries may fall anywhere.
#pragma once

#include <string>

namespace atom::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // starts_in_reasoning: the prompt already opened the block (templates that end the generation
  // prompt with "<think>"), so output is reasoning until the end tag.
  explicit ReasoningParser(bool starts_in_reasoning, std::string start_tag = "<think>",
                           std::string end_tag = "</think>");

  // Feeds the next piece of output; returns what can be attributed now (a possible partial tag is
  // held back until the next piece decides it).
  ReasoningDelta feed(const std::string& text);
  // End of output: releases anything held back.
  ReasoningDelta finish();

  // Whole-output convenience.
  static ReasoningDelta split(const std::string& output, bool starts_in_reasoning);

  // True when a rendered prompt leaves the model inside a reasoning block.
  static bool prompt_opens_reasoning(const std::string& prompt);

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string start_, end_;
  std::string held_;  // text not yet attributed
  bool skip_newlines_ = false;  // newlines right after the end tag are dropped
};

}  // namespace atom::server
