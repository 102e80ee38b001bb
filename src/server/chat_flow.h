// A chat request in flight, whatever API it came through (/v1/chat/completions, /v1/responses,
// /v1/messages): the prompt rendered by the chat template, the engine job, and how each choice's
// text is taken apart into reasoning, content and tool calls (the reasoning parser first, then the
// tool-call parser), whole or as it streams.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/job.h"
#include "server/protocol.h"
#include "server/tool_parser.h"

namespace atom::server {

struct ChatFlow {
  std::shared_ptr<Job> job;
  std::string prompt;
  bool harmony = false;     // gpt-oss: one parser takes reasoning, content and calls apart
  bool reasoning = false;   // a reasoning parser runs: answers report a reasoning field
  bool named_tool = false;  // tool_choice named one function
};

// Renders the request's chat, checks the prompt, gives each choice its parsers and submits the
// job (request ids "<id_prefix>-…"). Throws ApiError naming the parameter at fault.
ChatFlow chat_flow_start(HttpServer& s, ChatRequest& r, const std::string& id_prefix);

// A finished choice's whole answer, taken apart.
struct ChatMessage {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};
ChatMessage chat_message(ChoiceState& c);

// One streamed update of a choice, taken apart (the parsers keep what may still become a marker).
struct ChatDelta {
  std::string content, reasoning;
  std::vector<ToolCallDelta> calls;
};
ChatDelta chat_delta(ChoiceState& c, const ChoiceDelta& d);

}  // namespace atom::server
