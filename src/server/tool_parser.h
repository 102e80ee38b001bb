// Tool calls parsed back out of a model's answer, as vLLM's --tool-call-parser does: whole
// outputs and streams of text deltas whose tag boundaries may fall anywhere. Text that is not a
// well-formed call (bad JSON, an unknown shape) stays content.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace atom::server {

struct ToolCall {
  std::string id;  // "chatcmpl-tool-<hex>"
  std::string name;
  std::string arguments;  // a JSON text (an object, as the model wrote it, re-serialised)
};

struct ToolDelta {
  std::string content;
  std::vector<ToolCall> calls;  // calls completed by this piece, in order
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  // Feeds the next piece of answer text; returns what can be attributed now (text that may still
  // turn out to be part of a call is held back until the next piece decides it).
  virtual ToolDelta feed(const std::string& text) = 0;
  // End of output: parses or releases anything held back.
  virtual ToolDelta finish() = 0;
  // Whole-output convenience: feed(output) then finish().
  ToolDelta parse(const std::string& output);
};

// vLLM's parser names that atom implements.
const std::vector<std::string>& tool_parser_names();
bool tool_parser_known(const std::string& name);
// Throws std::invalid_argument for an unknown name (the message lists the supported ones).
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name);

// True when the parser needs special tokens left in the text: as vLLM's hermes parser, requests
// it parses get skip_special_tokens false (<tool_call> is a special token in some tokenizers).
bool tool_parser_keeps_special_tokens(const std::string& name);

// A fresh "chatcmpl-tool-<32 hex>" id.
std::string tool_call_id();

}  // namespace atom::server
