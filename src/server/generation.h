// The /v1/completions and /v1/chat/completions flows: prompts to engine requests, engine updates
// to JSON responses or SSE streams, aborting whatever the client stops waiting for.
#pragma once

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace atom::server {

class HttpServer;

void handle_completions(HttpServer& server, const httplib::Request& req, httplib::Response& res);
void handle_chat_completions(HttpServer& server, const httplib::Request& req,
                             httplib::Response& res);

}  // namespace atom::server
