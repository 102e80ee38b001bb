// The parsers behind make_tool_parser, one factory per format, and the base most of them share
// (internal to atom_server; use make_tool_parser by vLLM's name).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/tool_parser.h"

namespace atom::server {

// A parser that holds the text it cannot attribute yet (a tag may be arriving, a call may not be
// complete) and goes on from it as pieces arrive: feed appends a piece to held_ and runs, finish
// attributes what is left.
class HeldTextParser : public ToolParser {
 public:
  ToolDelta feed(const std::string& text) final;
  ToolDelta finish() final;

 protected:
  // Attributes what it can of held_, leaving in it what the next piece may decide.
  virtual void run(ToolDelta& out) = 0;
  // End of output: attributes the rest of held_ (cleared afterwards) and resets the state.
  virtual void flush(ToolDelta& out) = 0;
  // Appends text to the content; right after a call (after_call_) its leading whitespace is
  // dropped, as vLLM's parsers drop it, and the flag cleared once non-blank text arrives.
  void content(ToolDelta& out, std::string_view s);
  // Content up to `tag`, which is taken out too: false while the tag has not arrived (held_
  // then keeps only what may be its start).
  bool content_until(ToolDelta& out, std::string_view tag);

  std::string held_;  // text not yet attributed
  bool after_call_ = false;
};

// Qwen3-Coder: <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>...</function>
// \n</tool_call>; values typed by the tool's schema (tools: the request's list).
std::unique_ptr<ToolParser> make_qwen3_coder_parser(const nlohmann::ordered_json& tools);
// GLM-4.5/4.6: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>.
std::unique_ptr<ToolParser> make_glm45_parser(const nlohmann::ordered_json& tools);
// Kimi K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
// <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>.
std::unique_ptr<ToolParser> make_kimi_k2_parser();
// DeepSeek-V3 / R1:
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
// {...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>.
std::unique_ptr<ToolParser> make_deepseek_v3_parser();
// Mistral: [TOOL_CALLS][{"name", "arguments"}, ...] (tokenizers before v11) or
// [TOOL_CALLS]NAME{...} / [TOOL_CALLS]NAME[ARGS]{...} (v11 and later), repeated per call.
std::unique_ptr<ToolParser> make_mistral_parser();
// Llama 3.2 / 4 and others: the whole answer is [f(a=1), g(b="x")] with literal arguments.
std::unique_ptr<ToolParser> make_pythonic_parser();
// gpt-oss's harmony format (vLLM's "openai" parser): channels split into reasoning (analysis),
// content (final and preambles) and calls (messages to functions.NAME), which are dropped when
// parse_calls is false.
std::unique_ptr<ToolParser> make_harmony_parser(bool parse_calls);

}  // namespace atom::server
