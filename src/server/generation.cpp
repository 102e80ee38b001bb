#include "server/generation.h"

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "core/log.h"
#include "server/api_error.h"
#include "server/connection_probe.h"
#include "server/http_server.h"
#include "server/responses.h"
#include "server/tool_parser.h"

namespace atom::server {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

// One engine request: a prompt and its n choices.
struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;  // for echo
  int prompt_tokens = 0;
  int cached_tokens = 0;
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;
  Clock::time_point first_token{}, last_token{};
  int generated = 0;
};

// Updates from the engine thread, handed to the HTTP thread. Shared with the callbacks, which may
// outlive the HTTP request (an abort's final update arrives after the client is gone).
struct UpdateQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, RequestUpdate>> items;
  void push(int request, RequestUpdate u) {
    {
      std::lock_guard<std::mutex> lock(mu);
      items.emplace_back(request, std::move(u));
    }
    cv.notify_one();
  }
  std::deque<std::pair<int, RequestUpdate>> take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, wait, [&] { return !items.empty(); });
    std::deque<std::pair<int, RequestUpdate>> out;
    out.swap(items);
    return out;
  }
};

struct ChoiceEvent {
  int choice;  // global choice index
  ChoiceDelta delta;
};

// Everything one HTTP request waits for.
class Job {
 public:
  Job(HttpServer& s, SamplingRequest sampling)
      : s_(s), sampling_(std::move(sampling)), queue_(std::make_shared<UpdateQueue>()),
        arrival_(Clock::now()) {}

  // Gives each choice its reasoning and tool-call parsers.
  void set_choice_setup(std::function<void(ChoiceState&)> setup) { setup_ = std::move(setup); }

  void add_prompt(std::vector<int32_t> ids, std::string text) {
    EngineRequest r;
    r.prompt_ids = std::move(ids);
    r.prompt_text = std::move(text);
    r.prompt_tokens = static_cast<int>(r.prompt_ids.size());
    requests_.push_back(std::move(r));
    for (int j = 0; j < sampling_.n; ++j) {
      ChoiceState c;
      c.index = static_cast<int>(choices_.size());
      if (setup_) setup_(c);
      choices_.push_back(std::move(c));
    }
  }

  void submit_all(const std::optional<std::string>& request_id, const std::string& prefix) {
    const std::string base = request_id ? *request_id : response_id(prefix);
    for (size_t p = 0; p < requests_.size(); ++p) {
      EngineRequest& r = requests_[p];
      r.id = requests_.size() == 1 ? base : fmt::format("{}-{}", base, p);
      BackendRequest b{r.id, r.prompt_ids, sampling_, arrival_};
      auto q = queue_;
      const int idx = static_cast<int>(p);
      s_.backend().submit(std::move(b), [q, idx](RequestUpdate u) { q->push(idx, std::move(u)); });
      ++submitted_;
    }
  }

  // Applies pending updates; returns the per-choice deltas they carried.
  std::vector<ChoiceEvent> poll(std::chrono::milliseconds wait) {
    std::vector<ChoiceEvent> events;
    for (auto& [p, u] : queue_->take(wait)) {
      EngineRequest& r = requests_[p];
      if (r.finished) continue;  // aborted here already: its last update changes nothing
      if (!u.error.empty()) error_ = u.error;
      if (u.prompt_tokens) r.prompt_tokens = u.prompt_tokens;
      r.cached_tokens = u.cached_tokens;
      if (!u.prompt_logprobs.empty()) r.prompt_logprobs = u.prompt_logprobs;
      const auto now = Clock::now();
      for (auto& d : u.choices) {
        const int global = p * sampling_.n + d.index;
        if (global < 0 || global >= static_cast<int>(choices_.size())) continue;
        ChoiceState& c = choices_[global];
        if (!d.token_ids.empty()) {
          if (r.generated == 0) {
            r.first_token = now;
            s_.metrics().observe_ttft(std::chrono::duration<double>(now - arrival_).count());
          } else {
            s_.metrics().observe_inter_token_latency(std::chrono::duration<double>(now - r.last_token).count());
          }
          r.last_token = now;
          r.generated += static_cast<int>(d.token_ids.size());
          s_.metrics().add_generation_tokens(static_cast<int64_t>(d.token_ids.size()));
        }
        c.text += d.text;
        c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
        c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        if (d.finish_reason) {
          c.finish_reason = d.finish_reason;
          c.stop_reason = d.stop_reason;
          s_.metrics().add_request_success(*d.finish_reason);
        }
        events.push_back({global, std::move(d)});
      }
      if (u.finished) {
        r.finished = true;
        ++finished_;
        s_.metrics().add_prompt_tokens(r.prompt_tokens);
        const double e2e = std::chrono::duration<double>(now - arrival_).count();
        s_.metrics().observe_e2e_latency(e2e);
        s_.metrics().observe_request_tokens(r.prompt_tokens, r.generated, sampling_.n, sampling_.max_tokens.value_or(0));
        if (r.generated > 1)
          s_.metrics().observe_tpot(std::chrono::duration<double>(r.last_token - r.first_token).count() / (r.generated - 1));
        if (u.phases) {
          s_.metrics().observe_queue_time(u.phases->queue);
          if (u.phases->prefilled) {
            s_.metrics().observe_prefill_time(u.phases->prefill);
            s_.metrics().observe_decode_time(u.phases->decode);
            s_.metrics().observe_inference_time(u.phases->inference);
          }
        }
      }
    }
    return events;
  }

  bool all_finished() const { return finished_ == submitted_; }
  // Aborts what is still running. The engine answers each abort with a final update (finish
  // reason abort, the request's phases), taken here so an aborted request is counted in every
  // series as any other is; one whose answer does not come within half a second is counted as
  // aborted here.
  void abort_unfinished() {
    for (auto& r : requests_)
      if (!r.finished && !r.id.empty()) s_.backend().abort(r.id);
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (!all_finished() && Clock::now() < deadline) poll(std::chrono::milliseconds(20));
    for (size_t p = 0; p < requests_.size(); ++p) {
      EngineRequest& r = requests_[p];
      if (r.finished || r.id.empty()) continue;
      r.finished = true;
      ++finished_;
      for (int j = 0; j < sampling_.n; ++j)
        if (!choices_[p * sampling_.n + j].finish_reason) s_.metrics().add_request_success("abort");
    }
  }
  const std::string& error() const { return error_; }
  std::vector<ChoiceState>& choices() { return choices_; }
  std::vector<EngineRequest>& requests() { return requests_; }
  int n() const { return sampling_.n; }
  int64_t prompt_tokens() const {
    int64_t t = 0;
    for (const auto& r : requests_) t += r.prompt_tokens;
    return t;
  }
  int64_t cached_tokens() const {
    int64_t t = 0;
    for (const auto& r : requests_) t += r.cached_tokens;
    return t;
  }
  int64_t completion_tokens() const {
    int64_t t = 0;
    for (const auto& c : choices_) t += static_cast<int64_t>(c.token_ids.size());
    return t;
  }

 private:
  HttpServer& s_;
  SamplingRequest sampling_;
  std::shared_ptr<UpdateQueue> queue_;
  Clock::time_point arrival_;
  std::vector<EngineRequest> requests_;
  std::vector<ChoiceState> choices_;
  int submitted_ = 0, finished_ = 0;
  std::string error_;
  std::function<void(ChoiceState&)> setup_;
};

// Tokenised prompt checks shared by both endpoints.
void check_prompt(HttpServer& s, const std::vector<int32_t>& ids, SamplingRequest& sampling, bool chat) {
  const BackendInfo& info = s.backend().info();
  if (ids.empty()) bad_request("prompt", "The prompt is empty.");
  for (int32_t id : ids)
    if (id < 0 || id >= info.vocab_size) bad_request("prompt", fmt::format("Token id {} is out of vocabulary", id));
  const int64_t n = static_cast<int64_t>(ids.size());
  if (!sampling.max_tokens && chat) sampling.max_tokens = std::max<int64_t>(1, info.max_model_len - n);
  const int64_t want = sampling.max_tokens.value_or(16);
  if (n >= info.max_model_len || want > info.max_model_len - n)  // no overflow for any want
    bad_request("input_tokens",
                fmt::format("This model's maximum context length is {} tokens. However, you requested {} output "
                            "tokens and your prompt contains at least {} input tokens, for a total of at least {} "
                            "tokens. Please reduce the length of the input prompt or the number of requested output "
                            "tokens.",
                            info.max_model_len, want, n, n + want));
}

std::optional<int64_t> cached(HttpServer& s, const Job& job) {
  if (!s.options().enable_prompt_tokens_details) return std::nullopt;
  return job.cached_tokens();
}

// The end of a stream: an error event if the engine failed, the usage chunk when asked for, then
// [DONE].
std::string stream_tail(HttpServer& s, const Job& job, const StreamOptions& so, const std::string& id,
                        const char* object, int64_t created, const std::string& model) {
  std::string out;
  if (!job.error().empty()) out += "data: " + error_body(500, "InternalServerError", job.error()) + "\n\n";
  if (so.include_usage)
    out += sse_event({{"id", id}, {"object", object}, {"created", created}, {"model", model},
                      {"choices", json::array()},
                      {"usage", usage_json(job.prompt_tokens(), job.completion_tokens(), cached(s, job))}});
  return out + sse_done();
}

// Waits for a non-streamed job, aborting it if the client goes away. Returns false on abort.
bool wait_unstreamed(Job& job, const httplib::Request& req) {
  ConnectionProbe probe(req.remote_addr, req.remote_port);
  auto last_probe = Clock::now();
  while (!job.all_finished()) {
    job.poll(std::chrono::milliseconds(100));
    if (Clock::now() - last_probe > std::chrono::milliseconds(200)) {
      last_probe = Clock::now();
      if (probe.closed()) {
        job.abort_unfinished();
        return false;
      }
    }
  }
  return true;
}

// A streaming response: the content provider pulls from the job and writes SSE events; when the
// client disconnects (a failed write, or the probe), unfinished engine requests are aborted.
template <typename Emit, typename Finish>
void stream_job(httplib::Response& res, const httplib::Request& req, std::shared_ptr<Job> job, Emit emit,
                Finish finish) {
  auto probe = std::make_shared<ConnectionProbe>(req.remote_addr, req.remote_port);
  auto done = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, probe, done, emit, finish](size_t, httplib::DataSink& sink) mutable {
        if (*done) return false;
        std::string out;
        if (!job->all_finished()) {
          for (auto& ev : job->poll(std::chrono::milliseconds(100))) out += emit(ev);
          if (out.empty() && probe->closed()) {
            job->abort_unfinished();
            return false;
          }
        }
        if (job->all_finished()) {
          // Drain anything that arrived with the final update.
          for (auto& ev : job->poll(std::chrono::milliseconds(0))) out += emit(ev);
          out += finish();
          *done = true;
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          job->abort_unfinished();
          return false;
        }
        if (*done) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->abort_unfinished();
      });
}

}  // namespace

void handle_completions(HttpServer& s, const httplib::Request& req, httplib::Response& res) {
  CompletionRequest r = completion_request_parse(request_body_parse(req.body), s.options().limits);
  s.check_model(r.model);
  auto job = std::make_shared<Job>(s, r.sampling);
  for (const auto& p : r.prompts) {
    std::vector<int32_t> ids;
    std::string text;
    const bool is_text = std::holds_alternative<std::string>(p);
    if (is_text) {
      text = std::get<std::string>(p);
      ids = s.backend().tokenize(text, r.add_special_tokens);
    } else {
      ids = std::get<std::vector<int32_t>>(p);
    }
    check_prompt(s, ids, r.sampling, false);
    if (!is_text && r.echo) text = s.backend().detokenize(ids, false);
    job->add_prompt(std::move(ids), std::move(text));
  }
  job->submit_all(r.request_id, "cmpl");
  const std::string id = response_id("cmpl");
  const int64_t created = unix_time_now();
  const std::string model = s.model_name();
  const bool want_logprobs = r.sampling.logprobs.has_value();
  LogprobRenderer lr(s.backend());

  if (!r.stream) {
    if (!wait_unstreamed(*job, req)) return;
    if (!job->error().empty()) throw ApiError(500, "InternalServerError", job->error());
    json choices = json::array();
    for (auto& c : job->choices()) {
      const EngineRequest& er = job->requests()[c.index / job->n()];
      json lp = nullptr;
      if (want_logprobs) {
        lp = LogprobRenderer::completion_empty();
        size_t off = 0;
        if (r.echo) lr.completion(er.prompt_logprobs, off, lp, true);
        lr.completion(c.logprobs, off, lp);
      }
      json choice = {{"index", c.index},
                     {"text", (r.echo ? er.prompt_text : std::string()) + c.text},
                     {"logprobs", lp},
                     {"finish_reason", c.finish_reason ? json(*c.finish_reason) : json(nullptr)},
                     {"stop_reason", c.stop_reason.is_null() ? json(nullptr) : json(c.stop_reason)},
                     {"prompt_logprobs", nullptr}};
      if (r.return_token_ids) {
        choice["prompt_token_ids"] = er.prompt_ids;
        choice["token_ids"] = c.token_ids;
      }
      choices.push_back(choice);
    }
    json body = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                 {"choices", choices},
                 {"usage", usage_json(job->prompt_tokens(), job->completion_tokens(), cached(s, *job))}};
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
    return;
  }

  auto offsets = std::make_shared<std::vector<size_t>>(job->choices().size(), 0);
  auto echoed = std::make_shared<std::vector<bool>>(job->choices().size(), !r.echo);
  const StreamOptions so = r.stream_options;
  auto chunk = [id, created, model](json choice) {
    return json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                {"choices", json::array({choice})}};
  };
  auto emit = [=, &s, lr = LogprobRenderer(s.backend())](ChoiceEvent& ev) mutable {
    std::string out;
    if (!(*echoed)[ev.choice]) {
      (*echoed)[ev.choice] = true;
      const EngineRequest& er = job->requests()[ev.choice / job->n()];
      json lp = nullptr;
      if (want_logprobs) {
        lp = LogprobRenderer::completion_empty();
        lr.completion(er.prompt_logprobs, (*offsets)[ev.choice], lp, true);
      }
      out += sse_event(chunk({{"index", ev.choice}, {"text", er.prompt_text}, {"logprobs", lp},
                              {"finish_reason", nullptr}, {"stop_reason", nullptr}}));
    }
    if (ev.delta.text.empty() && ev.delta.token_ids.empty() && !ev.delta.finish_reason) return out;
    json lp = nullptr;
    if (want_logprobs) {
      lp = LogprobRenderer::completion_empty();
      lr.completion(ev.delta.logprobs, (*offsets)[ev.choice], lp);
    }
    json c = {{"index", ev.choice}, {"text", ev.delta.text}, {"logprobs", lp},
              {"finish_reason", ev.delta.finish_reason ? json(*ev.delta.finish_reason) : json(nullptr)},
              {"stop_reason", ev.delta.stop_reason.is_null() ? json(nullptr) : json(ev.delta.stop_reason)}};
    if (r.return_token_ids) c["token_ids"] = ev.delta.token_ids;
    json ch = chunk(c);
    if (so.continuous_usage_stats)
      ch["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), std::nullopt);
    return out + sse_event(ch);
  };
  auto finish = [=, &s]() { return stream_tail(s, *job, so, id, "text_completion", created, model); };
  stream_job(res, req, job, emit, finish);
}

void handle_chat_completions(HttpServer& s, const httplib::Request& req, httplib::Response& res) {
  ChatRequest r = chat_request_parse(request_body_parse(req.body), s.options().limits);
  s.check_model(r.model);
  r.chat_template_kwargs = chat_template_variables(r, s.options().default_chat_template_kwargs);
  // How answers are taken apart: vLLM's --reasoning-parser, or without one what the chat
  // template shows (<think> blocks; gpt-oss's harmony channels, which vLLM always parses).
  const BackendInfo& info = s.backend().info();
  std::string reasoning = s.options().reasoning_parser;
  if (reasoning.empty()) reasoning = info.harmony ? "openai_gptoss" : info.reasoning ? "qwen3" : "";
  const std::string& tool_parser = s.options().tool_call_parser;
  // One parser splits harmony's reasoning, content and calls, which live in one structure.
  const bool harmony = reasoning == "openai_gptoss" || tool_parser == "openai";
  // Tools are rendered into the prompt. As vLLM, tool_choice "auto" parses calls back out of the
  // answer only when the server runs with --enable-auto-tool-choice and a --tool-call-parser,
  // except for harmony models, whose calls are part of the format.
  const bool auto_tools = !r.tools.is_null() && r.tool_choice == "auto";
  if (auto_tools && !harmony && !(s.options().enable_auto_tool_choice && !tool_parser.empty()))
    bad_request("tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
  // "required" and a named function constrain decoding to the calls' JSON (vLLM's way), whatever
  // the model's own call format.
  const bool forced_tools = !r.tools.is_null() && (r.tool_choice == "required" || r.tool_choice == "named");
  if (forced_tools) {
    if (r.sampling.structured)
      bad_request("tool_choice", fmt::format("tool_choice \"{}\" cannot be combined with '{}'",
                                             r.tool_choice, r.sampling.structured->param));
    r.sampling.structured = StructuredOutput{StructuredOutput::kJsonSchema,
                                             forced_tool_schema(r.tools, r.named_tool), {}, "tool_choice"};
  }
  // The parsers read markers that are special tokens in these tokenizers (all of harmony's).
  if (harmony || (auto_tools && tool_parser_keeps_special_tokens(tool_parser)))
    r.sampling.skip_special_tokens = false;
  const std::string prompt = s.backend().render_chat(r);
  std::vector<int32_t> ids = s.backend().tokenize(prompt, r.add_special_tokens);
  check_prompt(s, ids, r.sampling, true);
  auto job = std::make_shared<Job>(s, r.sampling);
  job->set_choice_setup([&](ChoiceState& c) {
    if (harmony) {
      ToolParserOptions o;
      o.tools = r.tools;
      o.parse_calls = auto_tools;
      c.tool_parser = make_tool_parser("openai", o);
      return;
    }
    if (!reasoning.empty())
      c.reasoning_parser = make_reasoning_parser(reasoning, prompt, r.chat_template_kwargs);
    if (forced_tools) {
      c.tool_parser = make_forced_tool_parser(r.named_tool);
    } else if (auto_tools) {
      ToolParserOptions o;
      o.tools = r.tools;
      c.tool_parser = make_tool_parser(tool_parser, o);
    }
  });
  job->add_prompt(std::move(ids), prompt);
  job->set_choice_setup(nullptr);  // only add_prompt uses it, with this scope's variables
  job->submit_all(r.request_id, "chatcmpl");
  const std::string id = response_id("chatcmpl");
  const int64_t created = unix_time_now();
  const std::string model = s.model_name();
  std::string echo_text;
  if (r.echo && !r.messages.empty() && r.messages.back().value("role", "") == "assistant" &&
      r.messages.back().contains("content") && r.messages.back()["content"].is_string())
    echo_text = r.messages.back()["content"].get<std::string>();
  const bool want_logprobs = r.logprobs;

  if (!r.stream) {
    if (!wait_unstreamed(*job, req)) return;
    if (!job->error().empty()) throw ApiError(500, "InternalServerError", job->error());
    LogprobRenderer lr(s.backend());
    json choices = json::array();
    for (auto& c : job->choices()) {
      json message = {{"role", "assistant"}};
      // Reasoning is split off first, then calls are parsed out of what remains.
      std::string content = c.text, reasoning_text;
      if (c.reasoning_parser) {
        ReasoningDelta d = c.reasoning_parser->feed(c.text);
        const ReasoningDelta rest = c.reasoning_parser->finish();
        reasoning_text = d.reasoning + rest.reasoning;
        content = d.content + rest.content;
      }
      json tool_calls = json::array();
      if (c.tool_parser) {
        ToolDelta t = c.tool_parser->parse(content);
        content = std::move(t.content);
        reasoning_text += t.reasoning;
        for (const ToolCall& call : t.calls)
          tool_calls.push_back(
              {{"id", call.id},
               {"type", "function"},
               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      if (c.reasoning_parser || harmony) {
        message["reasoning_content"] =
            reasoning_text.empty() ? json(nullptr) : json(reasoning_text);
        message["reasoning"] = message["reasoning_content"];
      }
      // With tool calls and no text around them, content is null (as vLLM).
      const bool no_content = !tool_calls.empty() && echo_text.empty() && content.empty();
      message["content"] = no_content ? json(nullptr) : json(echo_text + content);
      message["tool_calls"] = tool_calls;
      std::optional<std::string> finish = c.finish_reason;
      // A named function's answer finishes with "stop", as vLLM's does.
      if (!tool_calls.empty() && finish == "stop" && !r.named_tool) finish = "tool_calls";
      json choice = {
          {"index", c.index},
          {"message", message},
          {"logprobs", want_logprobs ? json{{"content", lr.chat(c.logprobs)}} : json(nullptr)},
          {"finish_reason", finish ? json(*finish) : json(nullptr)},
          {"stop_reason", c.stop_reason.is_null() ? json(nullptr) : json(c.stop_reason)}};
      if (r.return_token_ids) choice["token_ids"] = c.token_ids;
      choices.push_back(choice);
    }
    json body = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                 {"choices", choices},
                 {"usage", usage_json(job->prompt_tokens(), job->completion_tokens(), cached(s, *job))}};
    if (r.return_token_ids) body["prompt_token_ids"] = job->requests()[0].prompt_ids;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
    return;
  }

  auto started = std::make_shared<std::vector<bool>>(job->choices().size(), false);
  const StreamOptions so = r.stream_options;
  auto chunk = [id, created, model](json choice) {
    return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                {"choices", json::array({choice})}};
  };
  const bool named = r.named_tool.has_value();
  auto emit = [=, &s, lr = LogprobRenderer(s.backend())](ChoiceEvent& ev) mutable {
    std::string out;
    ChoiceState& c = job->choices()[ev.choice];
    if (!(*started)[ev.choice]) {
      (*started)[ev.choice] = true;
      out += sse_event(chunk({{"index", ev.choice}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      if (!echo_text.empty())
        out += sse_event(chunk({{"index", ev.choice}, {"delta", {{"content", echo_text}}},
                                {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
    json delta = json::object();
    std::string content = ev.delta.text, reasoning_text;
    if (c.reasoning_parser) {
      ReasoningDelta d = c.reasoning_parser->feed(ev.delta.text);
      if (ev.delta.finish_reason) {
        const ReasoningDelta rest = c.reasoning_parser->finish();
        d.reasoning += rest.reasoning;
        d.content += rest.content;
      }
      reasoning_text = std::move(d.reasoning);
      content = std::move(d.content);
    }
    std::vector<ToolCallDelta> calls;
    if (c.tool_parser) {
      ToolDelta t = c.tool_parser->feed(content);
      if (ev.delta.finish_reason) t.append(c.tool_parser->finish());
      content = std::move(t.content);
      reasoning_text += t.reasoning;
      calls = std::move(t.deltas);
    }
    if (!reasoning_text.empty()) {
      delta["reasoning_content"] = reasoning_text;
      delta["reasoning"] = reasoning_text;
    }
    if (!content.empty()) delta["content"] = content;
    // One chunk for the text, then per call piece one (vLLM's delta shapes): a call's first
    // names it, the others carry its arguments; logprobs ride on the first chunk, finish_reason
    // on the last.
    std::vector<json> deltas;
    if (!delta.empty()) deltas.push_back(delta);
    for (const ToolCallDelta& call : calls) {
      if (!call.id.empty()) {
        ++c.tool_calls_sent;
        deltas.push_back({{"tool_calls", json::array({{{"index", call.index},
                                                       {"id", call.id},
                                                       {"type", "function"},
                                                       {"function", {{"name", call.name}}}}})}});
      }
      if (!call.arguments.empty())
        deltas.push_back(
            {{"tool_calls", json::array({{{"index", call.index},
                                          {"function", {{"arguments", call.arguments}}}}})}});
    }
    const bool has_tokens = !ev.delta.token_ids.empty();
    if (deltas.empty() && !ev.delta.finish_reason && !(want_logprobs && has_tokens)) return out;
    if (deltas.empty()) deltas.push_back(json::object());
    std::optional<std::string> finish = ev.delta.finish_reason;
    if (c.tool_calls_sent > 0 && finish == "stop" && !named) finish = "tool_calls";
    for (size_t k = 0; k < deltas.size(); ++k) {
      const bool first = k == 0, last = k + 1 == deltas.size();
      json ch = chunk({{"index", ev.choice},
                       {"delta", deltas[k]},
                       {"logprobs", first && want_logprobs && has_tokens
                                        ? json{{"content", lr.chat(ev.delta.logprobs)}}
                                        : json(nullptr)},
                       {"finish_reason", last && finish ? json(*finish) : json(nullptr)}});
      if (last && finish)
        ch["choices"][0]["stop_reason"] =
            ev.delta.stop_reason.is_null() ? json(nullptr) : json(ev.delta.stop_reason);
      if (r.return_token_ids)
        ch["choices"][0]["token_ids"] = first ? json(ev.delta.token_ids) : json::array();
      if (so.continuous_usage_stats)
        ch["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), std::nullopt);
      out += sse_event(ch);
    }
    return out;
  };
  auto finish = [=, &s]() { return stream_tail(s, *job, so, id, "chat.completion.chunk", created, model); };
  stream_job(res, req, job, emit, finish);
}

}  // namespace atom::server
