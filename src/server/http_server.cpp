#include "server/http_server.h"

#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/log.h"
#include "server/api_error.h"
#include "server/api_messages.h"
#include "server/api_responses.h"
#include "server/chat_flow.h"
#include "server/generation.h"
#include "server/responses.h"

namespace atom::server {

using json = nlohmann::ordered_json;

std::string error_body(int status, const std::string& type, const std::string& message,
                       const std::string& param) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}};
  return json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// cpp-httplib's request parser, router and response writer, run on a request the gate has read
// whole (the library's own accept loop and thread-per-connection reads are not used).
class Router : public httplib::Server {
 public:
  // The library takes an invalid listening socket to mean it is shutting down and cuts streamed
  // responses short; it gets a descriptor of its own that nothing reads.
  Router() : placeholder_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) { svr_sock_ = placeholder_; }
  ~Router() override {
    svr_sock_ = INVALID_SOCKET;
    if (placeholder_ >= 0) ::close(placeholder_);
  }
  // Serves the request at the front of the stream; false when the connection cannot be reused.
  bool serve_one(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    static const std::function<void(httplib::Request&)> kNoSetup = [](httplib::Request&) {};
    return process_request(strm, close_connection, connection_closed, kNoSetup);
  }

 private:
  int placeholder_;
};

namespace {

// One request of a gate connection: reads come from the bytes the gate buffered (never from the
// socket, so a handler thread never waits for a client), writes go to the socket with a deadline.
class GateStream final : public httplib::Stream {
 public:
  GateStream(Connection& c, int write_timeout_ms) : c_(c), timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return pos_ < c_.request_bytes; }
  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, timeout_ms_) > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.request_bytes - pos_);
    std::memcpy(ptr, c_.buf.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{c_.fd, POLLOUT, 0};
        if (::poll(&p, 1, timeout_ms_) <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) {
          failed_ = true;
          return -1;
        }
      } else {
        failed_ = true;
        return -1;
      }
    }
    return static_cast<ssize_t>(done);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.remote_ip;
    port = c_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ip.clear();
    port = 0;
    if (getsockname(c_.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
      port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    } else {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
      port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    }
    ip = buf;
  }
  socket_t socket() const override { return c_.fd; }
  bool failed() const { return failed_; }

 private:
  Connection& c_;
  int timeout_ms_;
  size_t pos_ = 0;
  bool failed_ = false;
};

// A connection that is a string both ways (HttpServer::serve_bytes).
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(const Connection& c, std::string& out) : c_(c), out_(out) {}
  bool is_readable() const override { return pos_ < c_.request_bytes; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.request_bytes - pos_);
    std::memcpy(ptr, c_.buf.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 2;
  }
  socket_t socket() const override { return -1; }

 private:
  const Connection& c_;
  std::string& out_;
  size_t pos_ = 0;
};

constexpr size_t kTrimAfterBytes = 1u << 20;

// Cheap routes served by the reserved threads, so a server busy with generation still answers them.
bool control_route(const Connection& c) {
  if (c.method != "GET") return false;
  const std::string path = c.target.substr(0, c.target.find('?'));
  return path == "/health" || path == "/ping" || path == "/version" || path == "/metrics" ||
         path == "/v1/models";
}

}  // namespace

HttpServer::HttpServer(Backend& backend, Metrics& metrics, ServerOptions options)
    : backend_(backend),
      metrics_(metrics),
      options_(std::move(options)),
      http_(std::make_unique<Router>()),
      responses_(std::make_unique<ResponseStore>(options_.responses_store_max_entries,
                                                 options_.responses_store_max_bytes)) {
  if (options_.served_model_names.empty())
    options_.served_model_names.push_back(backend_.info().model_name);
  options_.http.max_body_bytes = options_.max_body_bytes;
  routes();
  gate_ = std::make_unique<ConnectionGate>(options_.http, [this](std::shared_ptr<Connection> c) {
    (control_route(*c) ? control_ : workers_)->enqueue([this, c] { serve_connection(c); });
  });
}

HttpServer::~HttpServer() {
  stop();
  if (workers_) workers_->shutdown();
  if (control_) control_->shutdown();
}

std::string HttpServer::serve_bytes(const std::string& bytes) {
  std::string out;
  Connection c;
  c.buf = bytes;
  while (!c.buf.empty()) {
    RequestFramer f(options_.http.max_header_bytes, options_.max_body_bytes);
    const RequestFramer::State st = f.feed(c.buf);
    if (st == RequestFramer::State::kError)
      return out + gate_error_response(f.error_status(), f.error_message());
    if (st != RequestFramer::State::kComplete) break;  // the gate would wait for more
    c.request_bytes = f.request_bytes();
    MemoryStream strm(c, out);
    bool closed = false;
    const bool ok = http_->serve_one(strm, false, closed);
    if (!ok || closed) break;
    c.buf.erase(0, c.request_bytes);
  }
  return out;
}

void HttpServer::serve_connection(const std::shared_ptr<Connection>& c) {
  GateStream strm(*c, options_.write_timeout_s * 1000);
  bool closed = false;
  const bool ok = http_->serve_one(strm, stopping_.load() || gate_->draining(), closed);
  // A big request (its body, the prompt's tokenization) freed its memory into this thread's malloc
  // arena, which glibc does not hand back to the system on its own: with hundreds of handler
  // threads each arena would keep its largest request's worth (issue 22).
  const size_t served = c->request_bytes;
  c->buf.erase(0, served);
  c->request_bytes = 0;
  if (c->buf.capacity() > (64u << 10)) std::string(c->buf).swap(c->buf);
  if (served > kTrimAfterBytes) malloc_trim(0);
  if (!ok || closed || strm.failed() || stopping_.load() || gate_->draining())
    gate_->close(c);
  else
    gate_->resume(c);
}

void HttpServer::check_model(const std::optional<std::string>& model) const {
  if (!model) return;
  for (const auto& n : options_.served_model_names)
    if (n == *model) return;
  throw ApiError(404, "NotFoundError", fmt::format("The model `{}` does not exist.", *model),
                 "model");
}

namespace {

void send_error(httplib::Response& res, int status, const std::string& type, const std::string& msg,
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(status, type, msg, param), "application/json");
}

// The error envelope an endpoint answers with.
enum class ErrorStyle { kOpenAI, kAnthropic };

// Runs a handler, turning ApiError and any other exception into the endpoint's error envelope
// (vLLM's, or Anthropic's for /v1/messages).
template <typename F>
void guarded(HttpServer& s, const std::string& handler, const httplib::Request& req,
             httplib::Response& res, F&& f, ErrorStyle style = ErrorStyle::kOpenAI) {
  s.in_flight_counter()++;
  auto fail = [&](int status, const std::string& type, const std::string& msg,
                  const std::string& param) {
    if (style == ErrorStyle::kAnthropic) {
      res.status = status;
      res.set_content(anthropic_error_body(status, param.empty() ? msg : param + ": " + msg),
                      "application/json");
    } else {
      send_error(res, status, type, msg, param);
    }
  };
  try {
    f();
  } catch (const ApiError& e) {
    fail(e.status(), e.type(), e.what(), e.param());
  } catch (const std::exception& e) {
    log_warn("{} {}: {}", req.method, req.path, e.what());
    fail(500, "InternalServerError", e.what(), "");
  }
  s.in_flight_counter()--;
  s.metrics().add_http_request(handler, req.method, res.status == -1 ? 200 : res.status);
}

}  // namespace

void HttpServer::routes() {
  httplib::Server& h = *http_;
  // The gate has framed the whole request: the parser sees it all, in memory.
  h.set_payload_max_length(options_.max_body_bytes);
  h.set_keep_alive_max_count(std::numeric_limits<size_t>::max() / 2);
  h.set_keep_alive_timeout(options_.http.keep_alive_timeout_s);
  h.set_write_timeout(options_.write_timeout_s, 0);

  // vLLM guards /v1 with the API key and answers a bad key with {"error": "Unauthorized"}.
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key && req.path.rfind("/v1", 0) == 0) {
      const std::string want = "Bearer " + *options_.api_key;
      // Anthropic's clients send the key as x-api-key.
      const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
      if (req.get_header_value("Authorization") != want &&
          !(anthropic && req.get_header_value("x-api-key") == *options_.api_key)) {
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
        data.push_back({{"id", name},
                        {"object", "model"},
                        {"created", info.created},
                        {"owned_by", "vllm"},
                        {"root", info.model_path},
                        {"parent", nullptr},
                        {"max_model_len", info.max_model_len},
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
    metrics_.set_engine_steps(st.num_steps, st.step_seconds, st.step_host_seconds);
    if (!st.spec_accepted_per_position.empty())
      metrics_.set_spec_decode(st.spec_num_drafts, st.spec_num_draft_tokens,
                               st.spec_num_accepted_tokens, st.spec_accepted_per_position);
    metrics_.set_kv_cache_usage(st.kv_blocks_total > 0
                                    ? 1.0 - static_cast<double>(st.kv_blocks_free) /
                                                static_cast<double>(st.kv_blocks_total)
                                    : 0.0);
    metrics_.set_state_slot_usage(st.state_slots_total > 0
                                      ? 1.0 - static_cast<double>(st.state_slots_free) /
                                                  static_cast<double>(st.state_slots_total)
                                      : 0.0);
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/tokenize", req, res, [&] {
      const json body = request_body_parse(req.body);
      check_model(body.contains("model") && body["model"].is_string()
                      ? std::optional<std::string>(body["model"].get<std::string>())
                      : std::nullopt);
      std::vector<int32_t> ids;
      if (body.contains("messages")) {
        ChatRequest chat = chat_request_parse(body, options_.limits);
        chat.chat_template_kwargs =
            chat_template_variables(chat, options_.default_chat_template_kwargs);
        // Images are decoded and processed as chat does (a bad one is the same 400) and each
        // placeholder expanded to its image's tokens, as the engine expands it; no tower runs.
        const std::vector<vision::VisionInput> images = chat_images(*this, chat);
        ids = chat_prompt_expand(
            *this, backend_.tokenize(backend_.render_chat(chat), chat.add_special_tokens), images);
      } else {
        if (!body.contains("prompt") || !body["prompt"].is_string())
          bad_request("prompt", "'prompt' must be a string");
        bool add_special = true;
        if (body.contains("add_special_tokens")) {
          if (!body["add_special_tokens"].is_boolean())
            bad_request("add_special_tokens", "'add_special_tokens' must be a boolean");
          add_special = body["add_special_tokens"].get<bool>();
        }
        ids = backend_.tokenize(body["prompt"].get<std::string>(), add_special);
      }
      json out = {
          {"count", ids.size()}, {"max_model_len", backend_.info().max_model_len}, {"tokens", ids}};
      if (body.contains("return_token_strs") && body["return_token_strs"] == true) {
        json strs = json::array();
        for (int32_t id : ids) strs.push_back(backend_.token_text(id));
        out["token_strs"] = strs;
      }
      res.set_content(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
    });
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/detokenize", req, res, [&] {
      const json body = request_body_parse(req.body);
      if (!body.contains("tokens") || !body["tokens"].is_array())
        bad_request("tokens", "'tokens' must be a list of token ids");
      std::vector<int32_t> ids;
      for (const auto& t : body["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= backend_.info().vocab_size)
          bad_request("tokens", fmt::format("token id {} is not in the vocabulary", t.dump()));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      res.set_content(json{{"prompt", backend_.detokenize(ids, false)}}.dump(
                          -1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
    });
  });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/completions", req, res, [&] { handle_completions(*this, req, res); });
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/chat/completions", req, res,
            [&] { handle_chat_completions(*this, req, res); });
  });
  h.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/responses", req, res, [&] { handle_responses(*this, req, res); });
  });
  h.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/responses/{response_id}", req, res,
            [&] { handle_response_get(*this, req.matches[1], res); });
  });
  h.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(*this, "/v1/responses/{response_id}", req, res,
            [&] { handle_response_delete(*this, req.matches[1], res); });
  });
  h.Post(R"(/v1/responses/([^/]+)/cancel)",
         [this](const httplib::Request& req, httplib::Response& res) {
           guarded(*this, "/v1/responses/{response_id}/cancel", req, res,
                   [&] { handle_response_cancel(*this, req.matches[1], res); });
         });
  h.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(
        *this, "/v1/messages", req, res, [&] { handle_messages(*this, req, res); },
        ErrorStyle::kAnthropic);
  });
  h.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(
        *this, "/v1/messages/count_tokens", req, res,
        [&] { handle_messages_count_tokens(*this, req, res); }, ErrorStyle::kAnthropic);
  });
}

bool HttpServer::bind() {
  bind_error_ = gate_->listen(options_.host, options_.port);
  if (!bind_error_.empty()) return false;
  port_ = gate_->port();
  return true;
}

void HttpServer::serve() {
  workers_ =
      std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, options_.threads)));
  control_ = std::make_unique<httplib::ThreadPool>(
      static_cast<size_t>(std::max(1, options_.control_threads)));
  gate_->run();
  // Requests being served run to completion; their connections close.
  workers_->shutdown();
  control_->shutdown();
  workers_.reset();
  control_.reset();
}

void HttpServer::stop() {
  stopping_.store(true);
  gate_->stop();
}

void HttpServer::begin_drain() { gate_->begin_drain(); }

bool HttpServer::drained() const { return gate_->drained(); }

}  // namespace atom::server
