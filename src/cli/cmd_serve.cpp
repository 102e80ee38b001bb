// atom serve MODEL: an OpenAI-compatible server with vLLM's flags and routes.
#include <fmt/ranges.h>
#include <malloc.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/engine_args.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/llm_engine.h"
#include "loader/hf_config.h"
#include "engine/tokenizer_text.h"
#include "server/engine_backend.h"
#include "server/http_server.h"
#include "server/reasoning.h"
#include "server/tool_parser.h"
#include "tokenizer/chat_template.h"

namespace {

struct ServeArgs {
  std::string model;
  std::string model_flag;  // --model DIR, vLLM's other spelling of the positional
  std::string tokenizer;   // --tokenizer DIR; empty: the model folder
  int max_logprobs = 20;
  std::vector<std::string> ignored;  // vLLM flags accepted that mean nothing here
  atom::cli::ModelArgs load;
  atom::cli::EngineArgs engine;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string api_key;
  std::vector<std::string> served_model_names;
  std::string chat_template;
  std::string default_chat_template_kwargs;
  std::string limit_mm_per_prompt;  // vLLM's JSON: {"image": N}
  double mm_processor_cache_gb = 4.0;
  std::string generation_config = "auto";
  bool enable_prompt_tokens_details = false;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  int max_waiting = 4096;
  int64_t max_body_bytes = 32 << 20;
  atom::jinja::Limits template_limits;  // chat templates: the model's, --chat-template, requests'
  atom::server::GateLimits http;  // header/body/keep-alive deadlines, connection and header bounds
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void serve(ServeArgs& a) {
  // Allocations from 256 KiB up get their own mappings, returned to the system when freed. glibc's
  // default threshold rises to the largest block freed so far (up to 32 MiB), after which a huge
  // prompt's buffers come from the handler threads' arenas and stay there: RSS grew with every
  // rejected oversized prompt (issue 22; serving.md, "Memory").
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (!a.model_flag.empty()) {
    if (!a.model.empty() && a.model != a.model_flag)
      atom::fail("the model is given twice: '{}' and --model '{}'", a.model, a.model_flag);
    a.model = a.model_flag;
  }
  if (a.model.empty())
    atom::fail("atom serve needs a model folder: atom serve DIR (or --model DIR)");
  for (const auto& line : a.ignored) atom::log_info("{}", line);
  const std::string tokenizer_dir = a.tokenizer.empty() ? a.model : a.tokenizer;
  // vLLM's API key may also come from the environment.
  if (a.api_key.empty()) {
    if (const char* k = std::getenv("VLLM_API_KEY")) a.api_key = k;
  }
  a.load.model = a.model;
  // vLLM's start-up checks of the tool flags, before anything is loaded.
  if (a.enable_auto_tool_choice && a.tool_call_parser.empty())
    atom::fail("--enable-auto-tool-choice requires --tool-call-parser");
  if (!a.tool_call_parser.empty() && !atom::server::tool_parser_known(a.tool_call_parser))
    atom::fail("invalid tool call parser: {} (choose from {{ {} }})", a.tool_call_parser,
               fmt::join(atom::server::tool_parser_names(), ", "));
  if (!a.reasoning_parser.empty() && !atom::server::reasoning_parser_known(a.reasoning_parser))
    atom::fail("invalid reasoning parser: {} (choose from {{ {} }})", a.reasoning_parser,
               fmt::join(atom::server::reasoning_parser_names(), ", "));
  nlohmann::ordered_json default_kwargs = nlohmann::ordered_json::object();
  if (!a.default_chat_template_kwargs.empty()) {
    try {
      default_kwargs = nlohmann::ordered_json::parse(a.default_chat_template_kwargs);
    } catch (const nlohmann::json::exception& e) {
      atom::fail("--default-chat-template-kwargs is not JSON: {}", e.what());
    }
    if (!default_kwargs.is_object())
      atom::fail("--default-chat-template-kwargs must be a JSON object");
  }
  // --limit-mm-per-prompt '{"image": N}' (or vLLM's {"image": {"count": N, ...}}): images per
  // prompt; other modalities are none here.
  int max_images = atom::server::ProtocolLimits{}.max_images;
  if (!a.limit_mm_per_prompt.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(a.limit_mm_per_prompt);
    } catch (const nlohmann::json::exception& e) {
      atom::fail("--limit-mm-per-prompt is not JSON: {}", e.what());
    }
    if (!j.is_object())
      atom::fail("--limit-mm-per-prompt must be a JSON object such as '{{\"image\": 4}}'");
    for (auto it = j.begin(); it != j.end(); ++it) {
      const nlohmann::json& v =
          it.value().is_object() && it.value().contains("count") ? it.value()["count"] : it.value();
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1024)
        atom::fail("--limit-mm-per-prompt: '{}' must be a count from 0 to 1024, got {}", it.key(),
                   it.value().dump());
      if (it.key() == "image")
        max_images = static_cast<int>(v.get<int64_t>());
      else
        atom::log_info("--limit-mm-per-prompt: '{}' is ignored: atom's models take images only",
                       it.key());
    }
  }

  if (!(a.mm_processor_cache_gb >= 0.0 && a.mm_processor_cache_gb <= 1024.0))
    atom::fail("--mm-processor-cache-gb must be from 0 to 1024, got {}", a.mm_processor_cache_gb);

  // Signals go to a dedicated thread (blocked here, before any thread starts).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // What can be checked from the folders alone comes before the weights load: the config, the
  // length asked for, the tokenizer and the chat template.
  const atom::ModelConfig config = atom::model_config_load(a.model);
  const int want_len = a.engine.config.max_model_len;
  if (want_len > 0 && config.max_position_embeddings > 0 &&
      want_len > config.max_position_embeddings)
    atom::fail("--max-model-len {} is longer than the model's max_position_embeddings {} ({})",
               want_len, config.max_position_embeddings, config.path);
  auto t = Clock::now();
  atom::log_info("atom serve {}: loading the tokenizer{}", a.model,
                 a.tokenizer.empty() ? "" : " from " + a.tokenizer);
  if (!std::filesystem::exists(std::filesystem::path(tokenizer_dir) / "tokenizer.json"))
    atom::fail("{}: the server needs the model's tokenizer.json (or --tokenizer DIR)",
               tokenizer_dir);
  atom::tokenizer::Tokenizer tok = atom::tokenizer::Tokenizer::from_dir(tokenizer_dir);
  atom::log_info("tokenizer ready in {:.2f} s ({} tokens)", since(t), tok.vocab_size());
  // Ids the tokenizer can produce must index the model's embedding; a model that pads its
  // vocabulary beyond the tokenizer's (common: rows rounded up for kernels) is only noted.
  if (config.vocab_size > 0 && tok.id_limit() > config.vocab_size)
    atom::fail("the tokenizer in {} produces ids up to {}, but the model's vocab_size is {} ({}): "
               "its text prompts cannot be embedded (is --tokenizer the model's?)",
               tokenizer_dir, tok.id_limit() - 1, config.vocab_size, config.path);
  if (config.vocab_size > tok.id_limit())
    atom::log_warn(
        "the model's vocab_size {} is larger than the tokenizer's {} ids: rows {}..{} have "
        "no token (sampled, they decode to nothing)",
        config.vocab_size, tok.id_limit(), tok.id_limit(), config.vocab_size - 1);
  {
    const auto tpl = atom::tokenizer::ChatTemplate::from_model_dir(tokenizer_dir, a.chat_template,
                                                                   a.template_limits);
    if (const std::string e = tpl.parse_error(); !e.empty())
      atom::fail("the chat template does not parse: {}", e);
  }

  t = Clock::now();
  atom::log_info("loading the model ({})", a.load.load_format);
  std::unique_ptr<atom::ModelGroup> m = atom::cli::model_args_load(a.load);
  if (atom::cli::worker_ran(*m)) return;
  atom::log_info("model ready in {:.2f} s", since(t));

  atom::GenerationConfig gen;
  if (a.generation_config == "auto") {
    gen = atom::generation_config_load(a.model);
  } else if (a.generation_config != "vllm") {
    gen = atom::generation_config_load(a.generation_config);
  }

  t = Clock::now();
  const atom::EngineConfig engine_config = atom::cli::engine_args_config(a.engine);
  const auto drafter = atom::cli::model_args_load_drafter(a.load, *m, engine_config);
  atom::LLMEngine engine(*m, engine_config, gen, atom::tokenizer_text_streams(tok),
                         atom::cli::drafter_of(drafter));
  atom::log_info("engine ready in {:.2f} s (KV cache and start-up)", since(t));

  atom::server::EngineBackendOptions bo;
  bo.served_model_name = a.served_model_names.empty() ? a.model : a.served_model_names[0];
  bo.model_path = a.model;
  bo.tokenizer_path = tokenizer_dir;  // the chat template lives with the tokenizer
  bo.max_waiting = a.max_waiting;
  bo.chat_template = a.chat_template;
  bo.template_limits = a.template_limits;
  bo.image_cache_bytes = static_cast<int64_t>(a.mm_processor_cache_gb * 1073741824.0);
  atom::server::EngineBackend backend(engine, tok, bo);

  atom::server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  if (!a.api_key.empty()) so.api_key = a.api_key;
  so.served_model_names =
      a.served_model_names.empty() ? std::vector<std::string>{a.model} : a.served_model_names;
  so.enable_prompt_tokens_details = a.enable_prompt_tokens_details;
  so.enable_auto_tool_choice = a.enable_auto_tool_choice;
  so.tool_call_parser = a.tool_call_parser;
  so.reasoning_parser = a.reasoning_parser;
  so.default_chat_template_kwargs = default_kwargs;
  so.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
  so.http = a.http;
  so.limits.max_logprobs = a.max_logprobs;
  so.limits.max_images = max_images;
  atom::server::Metrics metrics(so.served_model_names[0]);
  metrics.set_cache_config(
      {{"block_size", std::to_string(engine.kv_plan().block_size)},
       {"num_gpu_blocks", std::to_string(engine.kv_plan().num_blocks)},
       {"enable_prefix_caching", engine.config().enable_prefix_caching ? "True" : "False"}});
  atom::server::HttpServer http(backend, metrics, so);
  if (!http.bind()) atom::fail("{}", http.bind_error());

  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    atom::log_info("signal {}: draining {} running request(s), then exiting", sig,
                   backend.live_requests());
    // Requests already received or being received are served (each connection closes after its
    // response); then the engine finishes what it still holds (background responses) and new
    // work is refused.
    http.begin_drain();
    while (!http.drained() || backend.live_requests() > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    backend.drain();
    http.stop();
  });
  atom::log_info("serving {} at http://{}:{} (started in {:.2f} s)", so.served_model_names[0],
                 a.host, http.port(), since(start));
  http.serve();
  // serve() returns after stop(); the signal thread has finished draining.
  signals.join();
  atom::log_info("server stopped");
}

// Flags vLLM launch scripts pass that mean nothing here: accepted, with one start-up line each.
void add_ignored_vllm_flags(CLI::App* cmd, const std::shared_ptr<ServeArgs>& a) {
  struct Ignored {
    const char* flag;
    bool takes_value;
    const char* why;
  };
  static const Ignored kIgnored[] = {
      {"--uvicorn-log-level", true,
       "atom's server is not uvicorn; ATOM_LOG_LEVEL sets its log level"},
      {"--disable-uvicorn-access-log", false, "atom's server writes no access log"},
      {"--disable-log-requests", false, "atom does not log requests"},
      {"--enable-log-requests", false, "atom does not log requests"},
      {"--disable-log-stats", false, "atom logs no periodic stats (see /metrics)"},
      {"--trust-remote-code", false, "atom runs no code from model folders"},
      {"--swap-space", true, "atom recomputes preempted requests instead of swapping their KV"},
      {"--enable-chunked-prefill", false, "atom always chunks long prefills"},
      {"--no-enable-chunked-prefill", false, "atom always chunks long prefills"},
      {"--disable-custom-all-reduce", false, "atom's all-reduce is NCCL's"},
      {"--tokenizer-mode", true, "atom reads tokenizer.json"},
      {"--distributed-executor-backend", true, "atom's ranks are threads of one process"},
  };
  for (const auto& ig : kIgnored) {
    const std::string line = std::string(ig.flag) + " is accepted and ignored: " + ig.why;
    if (ig.takes_value)
      cmd->add_option_function<std::string>(
          ig.flag, [a, line](const std::string&) { a->ignored.push_back(line); }, ig.why);
    else
      cmd->add_flag_callback(
          ig.flag, [a, line] { a->ignored.push_back(line); }, ig.why);
  }
}

}  // namespace

ATOM_REGISTER_COMMAND([](CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (like vllm serve)");
  cmd->add_option("model", a->model, "Hugging Face model folder");
  cmd->add_option("--model", a->model_flag, "the model folder (vLLM's other spelling)");
  cmd->add_option("--tokenizer", a->tokenizer, "folder of the tokenizer (default: the model's)");
  cmd->add_option("--max-logprobs", a->max_logprobs,
                  "largest logprobs / top_logprobs / prompt_logprobs a request may ask for")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  add_ignored_vllm_flags(cmd, a);
  atom::cli::model_args_add_placement(cmd, a->load);
  atom::cli::engine_args_add(cmd, a->engine);
  cmd->add_option("--host", a->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' on /v1 routes");
  cmd->add_option("--served-model-name", a->served_model_names,
                  "names reported by /v1/models; responses use the first");
  cmd->add_option("--chat-template", a->chat_template,
                  "chat template file or text (default: the model's)");
  cmd->add_option("--default-chat-template-kwargs", a->default_chat_template_kwargs,
                  "JSON object of template variables applied to every chat request, e.g. "
                  "'{\"enable_thinking\": false}'");
  cmd->add_option("--limit-mm-per-prompt", a->limit_mm_per_prompt,
                  "JSON object of the most items per prompt by modality, e.g. '{\"image\": 4}' "
                  "(default: 8 images; 0 refuses them)");
  cmd->add_option("--mm-processor-cache-gb", a->mm_processor_cache_gb,
                  "GiB of image features kept for images sent again (a chat resends its images "
                  "each turn); 0 keeps none")
      ->capture_default_str();
  cmd->add_option("--generation-config", a->generation_config,
                  "auto (the model's generation_config.json), vllm (ignore it), or a folder")
      ->capture_default_str();
  cmd->add_flag("--enable-prompt-tokens-details", a->enable_prompt_tokens_details,
                "report usage.prompt_tokens_details.cached_tokens");
  cmd->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice,
                "parse tool calls out of answers when a request has tools and tool_choice \"auto\" "
                "(needs --tool-call-parser)");
  cmd->add_option("--tool-call-parser", a->tool_call_parser,
                  "how the model writes tool calls: hermes (Qwen2.5, Qwen3, Hermes), qwen3_coder "
                  "(Qwen3-Coder), llama3_json (Llama 3.1-3.3), pythonic (Llama 3.2/4), "
                  "deepseek_v3 (DeepSeek-V3, R1), deepseek_v31 (DeepSeek-V3.1), glm45 "
                  "(GLM-4.5/4.6), kimi_k2 (Kimi K2), mistral, openai (gpt-oss)");
  cmd->add_option("--reasoning-parser", a->reasoning_parser,
                  "how the model marks its reasoning: qwen3, deepseek_r1, deepseek_v3, glm45, "
                  "kimi_k2, openai_gptoss, none (default: <think> blocks or harmony channels "
                  "when the chat template has them; none: no <think> split)");
  cmd->add_option("--max-waiting-requests", a->max_waiting, "queued requests beyond this get 503")
      ->capture_default_str();
  cmd->add_option("--max-request-body-bytes", a->max_body_bytes, "larger bodies get 413")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-template-depth", a->template_limits.max_depth,
                  "deepest nesting a chat template may have (blocks, brackets, links of a.b.c or "
                  "1 + 2 + 3); deeper templates are refused")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-template-steps", a->template_limits.max_steps,
                  "statements and loop iterations one chat-template render may run")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  cmd->add_option("--max-template-output-bytes", a->template_limits.max_output_bytes,
                  "largest prompt text (or string) one chat-template render may build")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 40));
  cmd->add_option("--http-header-timeout", a->http.header_timeout_s,
                  "seconds from a request's first byte to the end of its headers (else 408)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--http-body-timeout", a->http.body_timeout_s,
                  "seconds from the end of a request's headers to the end of its body (else 408)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--http-keep-alive-timeout", a->http.keep_alive_timeout_s,
                  "seconds an idle connection is kept open waiting for its next request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option(
         "--max-connections", a->http.max_connections,
         "open connections at once; more get 503 (also bounded by the file descriptor limit)")
      ->capture_default_str()
      ->check(CLI::Range(16, 1 << 24));
  cmd->add_option("--max-header-bytes", a->http.max_header_bytes,
                  "largest request line and headers; larger get 431")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1024}, size_t{1} << 24));
  cmd->callback([a] { serve(*a); });
});
