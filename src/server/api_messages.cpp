#include "server/api_messages.h"

#include <httplib.h>

#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_flow.h"
#include "server/http_server.h"
#include "server/job.h"
#include "server/responses.h"

namespace atom::server {

using json = nlohmann::ordered_json;

std::string anthropic_error_body(int status, const std::string& message) {
  const char* type = status == 400   ? "invalid_request_error"
                     : status == 401 ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 529 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// Text of a content given as a string or as a list of text blocks (`where` names it in errors).
std::string blocks_text(const json& content, const std::string& where, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_request(param, where + " must be a string or a list of content blocks");
  return join_text_parts(content, {"text"}, where, param);
}

// An image block ({"type": "image", "source": {"type": "base64", "media_type", "data"}}) as the
// chat image part of its data: URL (checked and decoded there, named `bw` as here).
json image_block_part(const json& b, const std::string& bw) {
  if (!b.contains("source") || !b["source"].is_object())
    bad_request("messages", bw + " needs a 'source' object");
  const json& src = b["source"];
  const std::string st =
      src.contains("type") && src["type"].is_string() ? src["type"].get<std::string>() : "";
  if (st == "url")
    bad_request("messages",
                bw + ": the server fetches no URLs; send the image as a base64 source "
                     "({\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": ...})");
  if (st != "base64")
    bad_request("messages",
                fmt::format("{}.source.type '{}' is not supported (base64 is)", bw, st));
  if (!src.contains("media_type") || !src["media_type"].is_string() || !src.contains("data") ||
      !src["data"].is_string())
    bad_request("messages", bw + ".source needs string 'media_type' and 'data'");
  return {{"type", "image_url"},
          {"image_url",
           {{"url", "data:" + src["media_type"].get<std::string>() + ";base64," +
                        src["data"].get<std::string>()}}},
          {"atom_where", bw}};
}

// A tool_result's content: a string, or text blocks joined as one string; with image blocks the
// list of chat parts (text and image, in order), so the tool message's images reach the model as
// a user turn's do (the chat template renders a tool message's parts as it does a user's).
json tool_result_content(const json& content, const std::string& where) {
  bool images = false;
  if (content.is_array())
    for (const auto& b : content)
      images |= b.is_object() && b.contains("type") && b["type"] == "image";
  if (!images) return blocks_text(content, where, "messages");
  json parts = json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const json& b = content[j];
    const std::string bw = fmt::format("{}[{}]", where, j);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad_request("messages", bw + " must be an object with a string 'type'");
    const std::string& type = b["type"].get_ref<const std::string&>();
    if (type == "image") {
      parts.push_back(image_block_part(b, bw));
    } else if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        bad_request("messages", bw + " needs a string 'text'");
      parts.push_back({{"type", "text"}, {"text", b["text"]}});
    } else {
      refuse_video_part(type, bw, "messages");
      bad_request("messages", fmt::format("{}.type '{}' is not supported in a tool_result (text "
                                          "and image blocks are)",
                                          bw, type));
    }
  }
  return parts;
}

// One Anthropic message as chat messages: a user turn's tool_result blocks become tool messages
// (before its text), an assistant turn's tool_use blocks its tool_calls, thinking its reasoning.
void append_message(json& msgs, const json& m, size_t i) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    bad_request("messages", where + " must be an object with a string 'role'");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant")
    bad_request("messages", fmt::format("{}.role '{}' must be 'user' or 'assistant'", where, role));
  if (!m.contains("content")) bad_request("messages", where + " needs 'content'");
  const json& content = m["content"];
  if (content.is_string()) {
    msgs.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array())
    bad_request("messages", where + ".content must be a string or a list of content blocks");
  std::string text, thinking;
  json calls = json::array();
  // A user turn with images: its text and image blocks in order, as chat content parts.
  json parts = json::array();
  bool images = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& b = content[j];
    const std::string bw = fmt::format("{}.content[{}]", where, j);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad_request("messages", bw + " must be an object with a string 'type'");
    const std::string type = b["type"].get<std::string>();
    auto need_string = [&](const char* key) -> const std::string& {
      if (!b.contains(key) || !b[key].is_string())
        bad_request("messages", fmt::format("{} needs a string '{}'", bw, key));
      return b[key].get_ref<const std::string&>();
    };
    if (type == "text") {
      if (!text.empty()) text += "\n";
      text += need_string("text");
      parts.push_back({{"type", "text"}, {"text", b["text"]}});
    } else if (type == "image" && role == "user") {
      parts.push_back(image_block_part(b, bw));
      images = true;
    } else if (type == "tool_result" && role == "user") {
      const std::string& id = need_string("tool_use_id");
      msgs.push_back(
          {{"role", "tool"},
           {"tool_call_id", id},
           {"content", b.contains("content") ? tool_result_content(b["content"], bw + ".content")
                                             : json("")}});
    } else if (type == "tool_use" && role == "assistant") {
      const std::string& id = need_string("id");
      const std::string& name = need_string("name");
      const json input = b.contains("input") ? b["input"] : json::object();
      if (!input.is_object()) bad_request("messages", bw + ".input must be an object");
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input.dump()}}}});
    } else if (type == "thinking" && role == "assistant") {
      thinking += need_string("thinking");
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted by another server: nothing this model can read.
    } else {
      refuse_video_part(type, bw, "messages");
      bad_request("messages",
                  fmt::format("{}.type '{}' is not supported in a {} message", bw, type, role));
    }
  }
  if (role == "assistant") {
    json turn = {{"role", "assistant"}, {"content", text}};
    if (!thinking.empty()) turn["reasoning_content"] = thinking;
    if (!calls.empty()) turn["tool_calls"] = calls;
    msgs.push_back(std::move(turn));
  } else if (images) {
    msgs.push_back({{"role", "user"}, {"content", std::move(parts)}});
  } else if (!text.empty()) {
    msgs.push_back({{"role", "user"}, {"content", text}});
  }
}

// The Messages request as the chat request it is served as.
json messages_to_chat(const json& body, bool count_only) {
  json chat = json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  if (!count_only) {
    if (!body.contains("max_tokens")) bad_request("max_tokens", "max_tokens: Field required");
    const json& mt = body["max_tokens"];
    if (!mt.is_number_integer() || mt.get<int64_t>() < 1)
      bad_request("max_tokens", "max_tokens: must be a positive integer");
    chat["max_completion_tokens"] = mt;
  }
  json msgs = json::array();
  if (body.contains("system") && !body["system"].is_null())
    msgs.push_back(
        {{"role", "system"}, {"content", blocks_text(body["system"], "system", "system")}});
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    bad_request("messages", "messages: must be a non-empty list");
  for (size_t i = 0; i < body["messages"].size(); ++i) append_message(msgs, body["messages"][i], i);
  chat["messages"] = msgs;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad_request("tools", "tools: must be a list");
    json tools = json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
        bad_request("tools", fmt::format("tools[{}] needs a string 'name'", i));
      if (t.contains("type") && t["type"].is_string() && t["type"] != "custom")
        bad_request("tools", fmt::format("tools[{}].type '{}' is not supported (client tools are)",
                                         i, t["type"].get<std::string>()));
      json f = {{"name", t["name"]}};
      if (t.contains("description")) f["description"] = t["description"];
      f["parameters"] = t.contains("input_schema") ? t["input_schema"] : json{{"type", "object"}};
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    const std::string type = tc.is_object() && tc.contains("type") && tc["type"].is_string()
                                 ? tc["type"].get<std::string>()
                                 : "";
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string())
        bad_request("tool_choice", "tool_choice of type 'tool' needs a string 'name'");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      bad_request("tool_choice", "tool_choice.type must be one of: auto, any, tool, none");
    }
    if (!chat.contains("tools") && chat["tool_choice"].is_string()) chat.erase("tool_choice");
  }
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    if (!body["stop_sequences"].is_array())
      bad_request("stop_sequences", "stop_sequences: must be a list of strings");
    chat["stop"] = body["stop_sequences"];
  }
  json kwargs =
      body.contains("chat_template_kwargs") ? body["chat_template_kwargs"] : json::object();
  if (body.contains("thinking") && body["thinking"].is_object()) {
    const json type = body["thinking"].value("type", json());
    if (type == "enabled")
      kwargs["enable_thinking"] = true;
    else if (type == "disabled")
      kwargs["enable_thinking"] = false;
    else
      bad_request("thinking", "thinking.type must be 'enabled' or 'disabled'");
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = kwargs;
  for (const char* key :
       {"temperature", "top_p", "top_k", "stream", "min_p", "seed", "repetition_penalty",
        "stop_token_ids", "ignore_eos", "min_tokens", "structured_outputs", "request_id"})
    if (body.contains(key)) chat[key] = body[key];
  return chat;
}

// Anthropic's stop reason for a choice that ended with `finish` (stop_reason: the stop string or
// token id that ended it, vLLM's field).
std::pair<std::string, json> stop_of(const std::optional<std::string>& finish,
                                     const json& stop_reason, bool called) {
  if (called && finish != "length") return {"tool_use", nullptr};
  if (finish == "length") return {"max_tokens", nullptr};
  if (stop_reason.is_string()) return {"stop_sequence", stop_reason};
  return {"end_turn", nullptr};
}

json usage_of(const Job& job) {
  const int64_t cached = job.cached_tokens();
  return {{"input_tokens", job.prompt_tokens() - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", job.completion_tokens()}};
}

// A call's arguments as the tool_use block's input object; nullopt when they are not one.
std::optional<json> call_input(const std::string& arguments) {
  json j = json::parse(arguments.empty() ? std::string("{}") : arguments, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// The streamed content blocks of one message: blocks open, grow and stop as the answer's
// thinking, text and calls arrive.
class MessageEvents {
 public:
  std::string thinking(const std::string& t) {
    std::string out = open(kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    return out + delta({{"type", "thinking_delta"}, {"thinking", t}});
  }
  std::string text(const std::string& t) {
    std::string out = open(kText, {{"type", "text"}, {"text", ""}});
    return out + delta({{"type", "text_delta"}, {"text", t}});
  }
  std::string call(const ToolCallDelta& d) {
    std::string out;
    if (!d.id.empty() || open_ != kCall) {
      out += stop();
      out += open(kCall, {{"type", "tool_use"},
                          {"id", random_id("toolu_")},
                          {"name", d.name},
                          {"input", json::object()}});
      ++calls_;
    }
    if (!d.arguments.empty())
      out += delta({{"type", "input_json_delta"}, {"partial_json", d.arguments}});
    return out;
  }
  std::string stop() {
    if (open_ == kNone) return "";
    open_ = kNone;
    return sse_named_event("content_block_stop",
                           {{"type", "content_block_stop"}, {"index", index_++}});
  }
  int calls() const { return calls_; }

 private:
  enum Open { kNone, kThinking, kText, kCall };
  std::string open(Open kind, json block) {
    if (open_ == kind && kind != kCall) return "";
    std::string out = stop();
    open_ = kind;
    return out + sse_named_event("content_block_start", {{"type", "content_block_start"},
                                                         {"index", index_},
                                                         {"content_block", block}});
  }
  std::string delta(json d) {
    return sse_named_event("content_block_delta",
                           {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }
  Open open_ = kNone;
  int index_ = 0;
  int calls_ = 0;
};

}  // namespace

void handle_messages(HttpServer& s, const httplib::Request& req, httplib::Response& res) {
  const json body = request_body_parse(req.body);
  const json chat_body = messages_to_chat(body, false);
  ChatRequest r = chat_request_parse(chat_body, s.options().limits);
  const bool stream = r.stream;
  ChatFlow flow = chat_flow_start(s, r, "msg");
  std::shared_ptr<Job> job = flow.job;
  const std::string id = random_id("msg_");
  const std::string model = s.model_name();

  if (!stream) {
    if (!wait_unstreamed(*job, req)) return;
    if (!job->error().empty()) throw ApiError(500, "InternalServerError", job->error());
    ChoiceState& c = job->choices().at(0);
    ChatMessage m = chat_message(c);
    json content = json::array();
    if (!m.reasoning.empty())
      content.push_back({{"type", "thinking"}, {"thinking", m.reasoning}, {"signature", ""}});
    std::string text = m.content;
    json uses = json::array();
    for (const ToolCall& call : m.calls) {
      if (auto input = call_input(call.arguments)) {
        uses.push_back({{"type", "tool_use"},
                        {"id", random_id("toolu_")},
                        {"name", call.name},
                        {"input", *input}});
      } else {
        // Not an object: the answer's text, as the model wrote it.
        log_warn("/v1/messages: a call to '{}' has arguments that are not a JSON object; returned "
                 "as text",
                 call.name);
        text += call.arguments;
      }
    }
    if (!text.empty() || (uses.empty() && content.empty()))
      content.push_back({{"type", "text"}, {"text", text}});
    for (auto& u : uses) content.push_back(std::move(u));
    const auto [stop_reason, stop_sequence] =
        stop_of(c.finish_reason, c.stop_reason, !uses.empty());
    json out = {{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model},
                {"content", content},
                {"stop_reason", stop_reason},
                {"stop_sequence", stop_sequence},
                {"usage", usage_of(*job)}};
    res.set_content(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
    return;
  }

  json start = {{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model},
                {"content", json::array()},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage", {{"input_tokens", job->prompt_tokens()}, {"output_tokens", 0}}}};
  std::string prologue =
      sse_named_event("message_start", {{"type", "message_start"}, {"message", start}});
  prologue += sse_named_event("ping", {{"type", "ping"}});
  auto events = std::make_shared<MessageEvents>();
  auto emit = [job, events](ChoiceEvent& ev) {
    std::string out;
    if (ev.choice != 0) return out;
    ChatDelta d = chat_delta(job->choices()[0], ev.delta);
    if (!d.reasoning.empty()) out += events->thinking(d.reasoning);
    if (!d.content.empty()) out += events->text(d.content);
    for (const ToolCallDelta& call : d.calls) out += events->call(call);
    return out;
  };
  auto finish = [job, events]() {
    std::string out = events->stop();
    if (!job->error().empty())
      return out + sse_named_event("error", json::parse(anthropic_error_body(500, job->error())));
    const ChoiceState& c = job->choices()[0];
    const auto [stop_reason, stop_sequence] =
        stop_of(c.finish_reason, c.stop_reason, events->calls() > 0);
    out += sse_named_event(
        "message_delta",
        {{"type", "message_delta"},
         {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence}}},
         {"usage", usage_of(*job)}});
    return out + sse_named_event("message_stop", {{"type", "message_stop"}});
  };
  stream_job(res, req, job, emit, finish, prologue);
}

void handle_messages_count_tokens(HttpServer& s, const httplib::Request& req,
                                  httplib::Response& res) {
  const json body = request_body_parse(req.body);
  ChatRequest r = chat_request_parse(messages_to_chat(body, true), s.options().limits);
  s.check_model(r.model);
  r.chat_template_kwargs = chat_template_variables(r, s.options().default_chat_template_kwargs);
  const std::vector<vision::VisionInput> images = chat_images(s, r);
  const std::string prompt = s.backend().render_chat(r);
  const auto ids = s.backend().tokenize(prompt, r.add_special_tokens);
  const int64_t image_tokens = chat_image_tokens(s, ids, images);
  res.set_content(json{{"input_tokens", static_cast<int64_t>(ids.size()) + image_tokens}}.dump(),
                  "application/json");
}

}  // namespace atom::server
