#include "server/http_server.h"

#include <httplib.h>

#include "core/log.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/responses.h"

namespace atom::server {

using json = nlohmann::ordered_json;

std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::string& param) {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}};
  return json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpServer::HttpServer(Backend& backend, Metrics& metrics, ServerOptions options)
    : backend_(backend), metrics_(metrics), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  if (options_.served_model_names.empty()) options_.served_model_names.push_back(backend_.info().model_name);
  routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::check_model(const std::optional<std::string>& model) const {
  if (!model) return;
  for (const auto& n : options_.served_model_names)
    if (n == *model) return;
  throw ApiError(404, "NotFoundError", fmt::format("The model `{}` does not exist.", *model), "model");
}

namespace {

void send_error(httplib::Response& res, int status, const std::string& type, const std::string& msg,
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(status, type, msg, param), "application/json");
}

// Runs a handler, turning ApiError and any other exception into vLLM's error envelope.
template <typename F>
void guarded(HttpServer& s, const std::string& handler, const httplib::Request& req, httplib::Response& res, F&& f) {
  s.in_flight_counter()++;
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e.status(), e.type(), e.what(), e.param());
  } catch (const std::exception& e) {
    log_warn("{} {}: {}", req.method, req.path, e.what());
    send_error(res, 500, "InternalServerError", e.what());
  }
  s.in_flight_counter()--;
  s.metrics().add_http_request(handler, req.method, res.status == -1 ? 200 : res.status);
}

}  // namespace

void HttpServer::routes() {
  httplib::Server& h = *http_;
  h.new_task_queue = [n = options_.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  h.set_payload_max_length(options_.max_body_bytes);
  h.set_read_timeout(options_.read_timeout_s, 0);
  h.set_write_timeout(options_.read_timeout_s, 0);
  h.set_keep_alive_timeout(30);

  // vLLM guards /v1 with the API key and answers a bad key with {"error": "Unauthorized"}.
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key && req.path.rfind("/v1", 0) == 0) {
      const std::string want = "Bearer " + *options_.api_key;
      if (req.get_header_value("Authorization") != want) {
        res.status = 401;
        res.set_content(R"({"error":"Unauthorized"})", "application/json");
        metrics_.add_http_request(req.path, req.method, 401);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, 404, "NotFoundError", fmt::format("Not Found: {} {}", req.method, req.path));
    } else if (res.status == 413) {
      send_error(res, 413, "BadRequestError", "Request body too large");
    } else {
      send_error(res, res.status, "BadRequestError", "Bad request");
    }
  });

  h.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 200;
    metrics_.add_http_request("/health", req.method, 200);
  });
  h.Get("/ping", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  h.Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"version", options_.version}}.dump(), "application/json");
  });
  h.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/models", req, res, [&] {
      json data = json::array();
      const BackendInfo& info = backend_.info();
      for (const auto& name : options_.served_model_names)
        // vLLM's ModelCard, field for field (owned_by "vllm": clients that filter on it), plus
        // vocab_size (ids a prompt may use; `atom bench serve` draws random prompts from it).
        data.push_back({{"id", name}, {"object", "model"}, {"created", info.created}, {"owned_by", "vllm"},
                        {"root", info.model_path}, {"parent", nullptr}, {"max_model_len", info.max_model_len},
                        {"vocab_size", info.vocab_size},
                        {"permission", json::array({json{{"id", "modelperm-" + name},
                                                         {"object", "model_permission"},
                                                         {"created", info.created},
                                                         {"allow_create_engine", false},
                                                         {"allow_sampling", true},
                                                         {"allow_logprobs", true},
                                                         {"allow_search_indices", false},
                                                         {"allow_view", true},
                                                         {"allow_fine_tuning", false},
                                                         {"organization", "*"},
                                                         {"group", nullptr},
                                                         {"is_blocking", false}}})}});
      res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
    });
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const BackendStats st = backend_.stats();
    metrics_.set_running(st.running);
    metrics_.set_waiting(st.waiting);
    metrics_.set_prefix_cache(st.prefix_cache_queries, st.prefix_cache_hits);
    metrics_.set_preemptions(st.num_preemptions);
    metrics_.set_kv_cache_usage(st.kv_blocks_total > 0
                                    ? 1.0 - static_cast<double>(st.kv_blocks_free) / static_cast<double>(st.kv_blocks_total)
                                    : 0.0);
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/tokenize", req, res, [&] {
      const json body = request_body_parse(req.body);
      check_model(body.contains("model") && body["model"].is_string() ? std::optional<std::string>(body["model"].get<std::string>()) : std::nullopt);
      std::vector<int32_t> ids;
      if (body.contains("messages")) {
        ChatRequest chat = chat_request_parse(body, options_.limits);
        chat.chat_template_kwargs =
            chat_template_variables(chat, options_.default_chat_template_kwargs);
        ids = backend_.tokenize(backend_.render_chat(chat), chat.add_special_tokens);
      } else {
        if (!body.contains("prompt") || !body["prompt"].is_string()) bad_request("prompt", "'prompt' must be a string");
        bool add_special = true;
        if (body.contains("add_special_tokens")) {
          if (!body["add_special_tokens"].is_boolean()) bad_request("add_special_tokens", "'add_special_tokens' must be a boolean");
          add_special = body["add_special_tokens"].get<bool>();
        }
        ids = backend_.tokenize(body["prompt"].get<std::string>(), add_special);
      }
      json out = {{"count", ids.size()}, {"max_model_len", backend_.info().max_model_len}, {"tokens", ids}};
      if (body.contains("return_token_strs") && body["return_token_strs"] == true) {
        json strs = json::array();
        for (int32_t id : ids) strs.push_back(backend_.token_text(id));
        out["token_strs"] = strs;
      }
      res.set_content(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
    });
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/detokenize", req, res, [&] {
      const json body = request_body_parse(req.body);
      if (!body.contains("tokens") || !body["tokens"].is_array()) bad_request("tokens", "'tokens' must be a list of token ids");
      std::vector<int32_t> ids;
      for (const auto& t : body["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= backend_.info().vocab_size)
          bad_request("tokens", fmt::format("token id {} is not in the vocabulary", t.dump()));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      res.set_content(json{{"prompt", backend_.detokenize(ids, false)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
    });
  });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/completions", req, res, [&] { handle_completions(*this, req, res); });
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/chat/completions", req, res, [&] { handle_chat_completions(*this, req, res); });
  });
}

bool HttpServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    return port_ > 0;
  }
  port_ = options_.port;
  return http_->bind_to_port(options_.host, options_.port);
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::stop() { http_->stop(); }

}  // namespace atom::server
