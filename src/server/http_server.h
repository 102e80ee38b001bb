// atom's OpenAI-compatible HTTP server: vLLM's routes, request fields, response shapes, SSE
// framing, error envelope and metrics, over any Backend.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace httplib {
class Server;
}

namespace atom::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::optional<std::string> api_key;
  std::vector<std::string> served_model_names;  // responses use the first
  size_t max_body_bytes = 32u << 20;
  int threads = 512;                // connections served at once
  int read_timeout_s = 30;          // a client that sends nothing for this long is dropped
  bool enable_prompt_tokens_details = false;
  bool enable_auto_tool_choice = false;  // with tool_call_parser: tool_choice "auto" is served
  std::string tool_call_parser;          // a name from tool_parser_names(), or empty
  // --reasoning-parser: a name from reasoning_parser_names(); empty: what the chat template shows
  // (<think> blocks split as qwen3's, harmony channels as openai_gptoss), or nothing.
  std::string reasoning_parser;
  // --default-chat-template-kwargs: template variables under every chat request's own.
  nlohmann::ordered_json default_chat_template_kwargs = nlohmann::ordered_json::object();
  ProtocolLimits limits;
  std::string version = "0.1.0";
};

class HttpServer {
 public:
  HttpServer(Backend& backend, Metrics& metrics, ServerOptions options);
  ~HttpServer();

  // Binds (port 0 picks a free port) and serves until stop(); returns false when it cannot bind.
  bool bind();
  int port() const { return port_; }
  void serve();
  // Stops accepting connections; requests being served run to completion.
  void stop();
  // Requests in flight (between parse and response end).
  int in_flight() const { return in_flight_.load(); }

  // Exposed for the generation handlers.
  Backend& backend() { return backend_; }
  Metrics& metrics() { return metrics_; }
  const ServerOptions& options() const { return options_; }
  const std::string& model_name() const { return options_.served_model_names.at(0); }
  // Throws ApiError 404 when `model` names no served model.
  void check_model(const std::optional<std::string>& model) const;
  std::atomic<int>& in_flight_counter() { return in_flight_; }

 private:
  void routes();
  Backend& backend_;
  Metrics& metrics_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<int> in_flight_{0};
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::string& param = "");

}  // namespace atom::server
