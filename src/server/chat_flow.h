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

// The request's images (its image content parts) decoded and processed for the model, in order,
// on the calling (HTTP) thread. A 400 naming the part: a model that takes no images, a URL that
// is not a base64 PNG or JPEG data: URL, an image malformed, truncated or too large.
std::vector<vision::VisionInput> chat_images(HttpServer& s, const ChatRequest& r);

// The prompt's image placeholder tokens checked against its images (a 400 unless there is one
// per image); returns the tokens the images add to the prompt (less their placeholders).
int64_t chat_image_tokens(HttpServer& s, const std::vector<int32_t>& ids,
                          const std::vector<vision::VisionInput>& images);

// The prompt as the engine runs it (prompt_images_expand, without the tower): each image's
// placeholder token repeated its image's token count (num_tokens) times. A 400 unless there is
// one placeholder per image. `ids` as is for a model that takes no images.
std::vector<int32_t> chat_prompt_expand(HttpServer& s, const std::vector<int32_t>& ids,
                                        const std::vector<vision::VisionInput>& images);

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
