// The Anthropic Messages API, as ATOM serves it: POST /v1/messages (whole, or streamed as its
// event sequence: message_start, content blocks, message_delta, message_stop) and
// POST /v1/messages/count_tokens. `system`, text / tool_use / tool_result / thinking blocks, tools,
// tool_choice, stop sequences and stop reasons map onto the chat flow; errors use Anthropic's
// envelope {"type": "error", "error": {"type", "message"}}.
#pragma once

#include <string>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace atom::server {

class HttpServer;

void handle_messages(HttpServer& s, const httplib::Request& req, httplib::Response& res);
void handle_messages_count_tokens(HttpServer& s, const httplib::Request& req,
                                  httplib::Response& res);

// Anthropic's error envelope for an HTTP status (invalid_request_error, not_found_error, ...).
std::string anthropic_error_body(int status, const std::string& message);

}  // namespace atom::server
