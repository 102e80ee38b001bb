// atom's OpenAI-compatible HTTP server: vLLM's routes, request fields, response shapes, SSE
// framing, error envelope and metrics, over any Backend.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/connection_gate.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace httplib {
class ThreadPool;
}

namespace atom::server {

class Router;
class ResponseStore;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::optional<std::string> api_key;
  std::vector<std::string> served_model_names;  // responses use the first
  size_t max_body_bytes = 32u << 20;
  // Header and body deadlines, keep-alive, connection and buffer bounds (max_body_bytes above
  // replaces http.max_body_bytes).
  GateLimits http;
  int threads = 512;         // requests served at once (complete requests only: see ConnectionGate)
  int control_threads = 4;   // reserved for GET /health, /ping, /version, /metrics, /v1/models
  int write_timeout_s = 30;  // a client that reads nothing of its answer for this long is dropped
  bool enable_prompt_tokens_details = false;
  bool enable_auto_tool_choice = false;  // with tool_call_parser: tool_choice "auto" is served
  std::string tool_call_parser;          // a name from tool_parser_names(), or empty
  // --reasoning-parser: a name from reasoning_parser_names(); empty: what the chat template shows
  // (<think> blocks split as qwen3's, harmony channels as openai_gptoss), or nothing.
  std::string reasoning_parser;
  // --default-chat-template-kwargs: template variables under every chat request's own.
  nlohmann::ordered_json default_chat_template_kwargs = nlohmann::ordered_json::object();
  ProtocolLimits limits;
  // Responses kept for previous_response_id and GET /v1/responses/{id} (store: true, the
  // default): at most this many, and this many bytes of JSON; the least recently used go first.
  size_t responses_store_max_entries = 1024;
  size_t responses_store_max_bytes = 256u << 20;
  std::string version = "0.1.0";
};

class HttpServer {
 public:
  HttpServer(Backend& backend, Metrics& metrics, ServerOptions options);
  ~HttpServer();

  // Listens (port 0 picks a free port); false when it cannot, with bind_error() saying why (a port
  // already in use is an error: no port sharing).
  bool bind();
  const std::string& bind_error() const { return bind_error_; }
  int port() const { return port_; }
  void serve();
  // Stops accepting connections; requests being served run to completion.
  void stop();
  // Graceful shutdown (SIGTERM): new connections are refused, idle ones close, requests already
  // begun are read and served, each connection closing after its response. drained(): none left.
  void begin_drain();
  bool drained() const;
  // Serves the requests in `bytes` as if read from one connection (framed by the gate's rules) and
  // returns what the server would write back; no socket (tests and fuzzing).
  std::string serve_bytes(const std::string& bytes);
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
  ResponseStore& responses() { return *responses_; }

 private:
  void routes();
  void serve_connection(const std::shared_ptr<Connection>& c);
  Backend& backend_;
  Metrics& metrics_;
  ServerOptions options_;
  std::unique_ptr<Router> http_;
  std::unique_ptr<httplib::ThreadPool> workers_, control_;
  std::unique_ptr<ConnectionGate> gate_;
  std::unique_ptr<ResponseStore> responses_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  std::string bind_error_;
  std::atomic<int> in_flight_{0};
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::string& param = "");

}  // namespace atom::server
