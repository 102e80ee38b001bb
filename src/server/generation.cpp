#include "server/generation.h"

#include <httplib.h>

#include "core/log.h"
#include "server/api_error.h"
#include "server/connection_probe.h"
#include "server/http_server.h"
#include "server/chat_flow.h"
#include "server/job.h"
#include "server/responses.h"
#include "server/tool_parser.h"

namespace atom::server {

using json = nlohmann::ordered_json;

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
    json body = {
        {"id", id},
        {"object", "text_completion"},
        {"created", created},
        {"model", model},
        {"choices", choices},
        {"usage", usage_json(job->prompt_tokens(), job->completion_tokens(), cached(s, *job))}};
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
    return;
  }

  auto offsets = std::make_shared<std::vector<size_t>>(job->choices().size(), 0);
  auto echoed = std::make_shared<std::vector<bool>>(job->choices().size(), !r.echo);
  const StreamOptions so = r.stream_options;
  auto chunk = [id, created, model](json choice) {
    return json{{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model},
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
      out += sse_event(chunk({{"index", ev.choice},
                              {"text", er.prompt_text},
                              {"logprobs", lp},
                              {"finish_reason", nullptr},
                              {"stop_reason", nullptr}}));
    }
    if (ev.delta.text.empty() && ev.delta.token_ids.empty() && !ev.delta.finish_reason) return out;
    json lp = nullptr;
    if (want_logprobs) {
      lp = LogprobRenderer::completion_empty();
      lr.completion(ev.delta.logprobs, (*offsets)[ev.choice], lp);
    }
    json c = {
        {"index", ev.choice},
        {"text", ev.delta.text},
        {"logprobs", lp},
        {"finish_reason", ev.delta.finish_reason ? json(*ev.delta.finish_reason) : json(nullptr)},
        {"stop_reason",
         ev.delta.stop_reason.is_null() ? json(nullptr) : json(ev.delta.stop_reason)}};
    if (r.return_token_ids) c["token_ids"] = ev.delta.token_ids;
    json ch = chunk(c);
    if (so.continuous_usage_stats)
      ch["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), std::nullopt);
    return out + sse_event(ch);
  };
  auto finish = [=, &s]() {
    return stream_tail(s, *job, so, id, "text_completion", created, model);
  };
  stream_job(res, req, job, emit, finish);
}

void handle_chat_completions(HttpServer& s, const httplib::Request& req, httplib::Response& res) {
  ChatRequest r = chat_request_parse(request_body_parse(req.body), s.options().limits);
  ChatFlow flow = chat_flow_start(s, r, "chatcmpl");
  std::shared_ptr<Job> job = flow.job;
  const bool harmony = flow.harmony;
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
      ChatMessage m = chat_message(c);
      std::string& content = m.content;
      const std::string& reasoning_text = m.reasoning;
      json tool_calls = json::array();
      for (const ToolCall& call : m.calls)
        tool_calls.push_back({{"id", call.id},
                              {"type", "function"},
                              {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
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
    json body = {
        {"id", id},
        {"object", "chat.completion"},
        {"created", created},
        {"model", model},
        {"choices", choices},
        {"usage", usage_json(job->prompt_tokens(), job->completion_tokens(), cached(s, *job))}};
    if (r.return_token_ids) body["prompt_token_ids"] = job->requests()[0].prompt_ids;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
    return;
  }

  auto started = std::make_shared<std::vector<bool>>(job->choices().size(), false);
  const StreamOptions so = r.stream_options;
  auto chunk = [id, created, model](json choice) {
    return json{{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
  };
  const bool named = r.named_tool.has_value();
  auto emit = [=, &s, lr = LogprobRenderer(s.backend())](ChoiceEvent& ev) mutable {
    std::string out;
    ChoiceState& c = job->choices()[ev.choice];
    if (!(*started)[ev.choice]) {
      (*started)[ev.choice] = true;
      out += sse_event(chunk({{"index", ev.choice},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}}));
      if (!echo_text.empty())
        out += sse_event(chunk({{"index", ev.choice},
                                {"delta", {{"content", echo_text}}},
                                {"logprobs", nullptr},
                                {"finish_reason", nullptr}}));
    }
    json delta = json::object();
    ChatDelta parsed = chat_delta(c, ev.delta);
    const std::string& content = parsed.content;
    const std::string& reasoning_text = parsed.reasoning;
    const std::vector<ToolCallDelta>& calls = parsed.calls;
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
  auto finish = [=, &s]() {
    return stream_tail(s, *job, so, id, "chat.completion.chunk", created, model);
  };
  stream_job(res, req, job, emit, finish);
}

}  // namespace atom::server
