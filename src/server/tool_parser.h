// Tool calls parsed back out of a model's answer, as vLLM's --tool-call-parser does: whole
// outputs and streams of text deltas whose tag boundaries may fall anywhere. Text that is not a
// well-formed call stays content.
//
// Every parser is one state machine fed text pieces: parse(output) is feed(output) + finish(),
// so a whole answer and the same answer cut anywhere give the same content and calls. A call is
// streamed as vLLM streams it: a first piece with its id and name, then pieces of its arguments
// (the whole arguments at once for formats whose calls are only known to be calls once closed),
// and it is listed complete in `calls` when it ends.
#pragma once

#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atom::server {

// A finished call, as a non-streamed response lists it.
struct ToolCall {
  std::string id;  // "chatcmpl-tool-<hex>", or the format's own (Kimi's, Mistral's)
  std::string name;
  std::string arguments;  // as vLLM's parser for the format writes them (usually a JSON object)
};

// One streamed piece of a call (vLLM's DeltaToolCall): the first piece of call `index` carries
// its id and name; later pieces append to its arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id, name;   // set on a call's first piece only
  std::string arguments;  // appended to what was streamed before
};

struct ToolDelta {
  std::string content;
  std::string reasoning;              // formats that mark reasoning themselves (harmony's analysis)
  std::vector<ToolCallDelta> deltas;  // streamed call pieces, in order
  std::vector<ToolCall> calls;        // calls completed by this piece, in order

  // Appends `next` (the pieces that follow this one).
  void append(ToolDelta next);
};

struct ToolParserOptions {
  // The request's tools: formats that write arguments as untyped text (qwen3_coder, glm45) take
  // each argument's type from its schema.
  nlohmann::ordered_json tools;
  // false: calls are not parsed (tool_choice "none"); the harmony parser then still splits
  // reasoning from content and drops the calls. Other parsers are not made in that case.
  bool parse_calls = true;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  // Feeds the next piece of answer text; returns what can be attributed now (text that may still
  // turn out to be part of a call is held back until the next piece decides it).
  virtual ToolDelta feed(const std::string& text) = 0;
  // End of output: parses or releases anything held back; calls still open are closed.
  virtual ToolDelta finish() = 0;
  // Whole-output convenience: feed(output) then finish().
  ToolDelta parse(const std::string& output);

 protected:
  // Call bookkeeping shared by the parsers. begin_call streams a call's first piece and returns
  // its index; call_arguments streams more of its arguments (streamed_arguments: all so far);
  // end_call lists it as complete, with the arguments streamed for it or with `arguments` when
  // the format rewrites them once whole. whole_call does all three for a call known only once
  // complete.
  int begin_call(ToolDelta& out, std::string id, std::string name);
  void call_arguments(ToolDelta& out, int index, const std::string& arguments);
  const std::string& streamed_arguments(int index) const;
  void end_call(ToolDelta& out, int index);
  void end_call(ToolDelta& out, int index, std::string arguments);
  void whole_call(ToolDelta& out, std::string id, std::string name, std::string arguments);

 private:
  struct Started {
    std::string id, name;
    std::string arguments;  // streamed so far; given to the finished call
  };
  std::vector<Started> started_;
};

// vLLM's parser names that atom implements.
const std::vector<std::string>& tool_parser_names();
bool tool_parser_known(const std::string& name);
// Throws std::invalid_argument for an unknown name (the message lists the supported ones).
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name,
                                             const ToolParserOptions& options = {});

// True when the parser needs special tokens left in the text: as vLLM's hermes, glm45 and
// mistral parsers, requests it parses get skip_special_tokens false (the call markers are
// special tokens in those models' tokenizers, and harmony's channels are all special tokens).
bool tool_parser_keeps_special_tokens(const std::string& name);

// tool_choice a named function (named set) or "required": the parser reading the constrained
// answer back as calls, and the JSON schema decoding is constrained to (vLLM's).
std::unique_ptr<ToolParser> make_forced_tool_parser(const std::optional<std::string>& named);
std::string forced_tool_schema(const nlohmann::ordered_json& tools,
                               const std::optional<std::string>& named);

// A fresh "chatcmpl-tool-<32 hex>" id.
std::string tool_call_id();
// A fresh 9-character alphanumeric id, the only kind Mistral's templates accept.
std::string mistral_tool_call_id();

}  // namespace atom::server
