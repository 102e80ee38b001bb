// The parsers behind make_tool_parser, one factory per format (internal to atom_server; use
// make_tool_parser by vLLM's name).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "server/tool_parser.h"

namespace atom::server {

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
