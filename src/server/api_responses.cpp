#include "server/api_responses.h"

#include <httplib.h>

#include "server/api_error.h"
#include "server/chat_flow.h"
#include "server/http_server.h"
#include "server/job.h"
#include "server/responses.h"

namespace atom::server {

using json = nlohmann::ordered_json;

void ResponseStore::put(const std::string& id, Entry e) {
  const size_t bytes = e.response.dump().size() + e.messages.dump().size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    by_id_.erase(it);
  }
  if (max_entries_ == 0 || bytes > max_bytes_) return;
  lru_.push_front({id, std::move(e), bytes});
  by_id_[id] = lru_.begin();
  bytes_ += bytes;
  while (lru_.size() > max_entries_ || bytes_ > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    by_id_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

namespace {

// Text of a message's content: a string, or a list of text parts (input_text, output_text, text).
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    bad_request("input", where + ".content must be a string or a list of parts");
  return join_text_parts(content, {"input_text", "output_text", "text"}, where + ".content",
                         "input");
}

// A message's content as chat content: its text (content_text), or with input_image parts
// ({"type": "input_image", "image_url": "data:..."}) the list of chat parts, each image named as
// the request names it.
json message_content(const json& content, const std::string& where) {
  bool images = false;
  if (content.is_array())
    for (const auto& p : content)
      images |= p.is_object() && p.contains("type") && p["type"] == "input_image";
  if (!images) return content_text(content, where);
  json parts = json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const json& p = content[j];
    const std::string pw = fmt::format("{}.content[{}]", where, j);
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad_request("input", pw + " must be an object with a string 'type'");
    const std::string& type = p["type"].get_ref<const std::string&>();
    if (type == "input_image") {
      if (!p.contains("image_url") || !p["image_url"].is_string())
        bad_request("input", pw + (p.contains("file_id")
                                       ? ": file_id images are not supported; send the image as "
                                         "a data: URL in 'image_url'"
                                       : " needs a string 'image_url' (a data: URL)"));
      parts.push_back(
          {{"type", "image_url"}, {"image_url", {{"url", p["image_url"]}}}, {"atom_where", pw}});
    } else if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string())
        bad_request("input", pw + " needs a string 'text'");
      parts.push_back({{"type", "text"}, {"text", p["text"]}});
    } else {
      refuse_video_part(type, pw, "input");
      bad_request("input", fmt::format("{}.type '{}' is not supported (text and input_image "
                                       "parts are)",
                                       pw, type));
    }
  }
  return parts;
}

const std::string& string_field(const json& o, const char* key, const std::string& where) {
  if (!o.contains(key) || !o[key].is_string())
    bad_request("input", fmt::format("{} needs a string '{}'", where, key));
  return o[key].get_ref<const std::string&>();
}

// The request's input items as chat messages.
json input_messages(const json& input) {
  json msgs = json::array();
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return msgs;
  }
  if (!input.is_array()) bad_request("input", "'input' must be a string or a list of input items");
  std::string reasoning;  // a reasoning item's text, for the assistant turn that follows it
  auto assistant_turn = [&](json m) {
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
    msgs.push_back(std::move(m));
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& it = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!it.is_object()) bad_request("input", where + " must be an object");
    std::string type = "message";
    if (it.contains("type")) {
      if (!it["type"].is_string()) bad_request("input", where + ".type must be a string");
      type = it["type"].get<std::string>();
    }
    if (type == "message") {
      std::string role = string_field(it, "role", where);
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system")
        bad_request("input",
                    fmt::format("{}.role '{}' is not one of: user, assistant, system, developer",
                                where, role));
      json m = {
          {"role", role},
          {"content",
           role == "user"
               ? message_content(it.contains("content") ? it["content"] : json(nullptr), where)
               : json(
                     content_text(it.contains("content") ? it["content"] : json(nullptr), where))}};
      if (role == "assistant")
        assistant_turn(std::move(m));
      else
        msgs.push_back(std::move(m));
    } else if (type == "function_call") {
      json call = {{"id", string_field(it, "call_id", where)},
                   {"type", "function"},
                   {"function",
                    {{"name", string_field(it, "name", where)},
                     {"arguments", string_field(it, "arguments", where)}}}};
      // Calls that follow an assistant turn (its text, or other calls) belong to it.
      if (!msgs.empty() && msgs.back()["role"] == "assistant" && reasoning.empty()) {
        if (!msgs.back().contains("tool_calls")) msgs.back()["tool_calls"] = json::array();
        msgs.back()["tool_calls"].push_back(std::move(call));
      } else {
        assistant_turn(
            {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
      }
    } else if (type == "function_call_output") {
      const std::string& id = string_field(it, "call_id", where);
      if (!it.contains("output")) bad_request("input", where + " needs an 'output'");
      const json& out = it["output"];
      msgs.push_back({{"role", "tool"},
                      {"tool_call_id", id},
                      {"content", out.is_string() ? out.get<std::string>()
                                                  : content_text(out, where + ".output")}});
    } else if (type == "reasoning") {
      for (const char* key : {"content", "summary"}) {
        if (!it.contains(key) || !it[key].is_array()) continue;
        for (const auto& part : it[key])
          if (part.is_object() && part.contains("text") && part["text"].is_string())
            reasoning += part["text"].get<std::string>();
        if (!reasoning.empty()) break;
      }
    } else {
      bad_request("input", fmt::format("{}.type '{}' is not supported (message, function_call, "
                                       "function_call_output and reasoning items are)",
                                       where, type));
    }
  }
  return msgs;
}

// A Responses request taken apart: the chat request it is served as, and what the response object
// repeats back.
struct ResponsesRequest {
  json chat_body;
  json new_messages;             // this request's input, as chat messages
  json history = json::array();  // the previous response's conversation
  json body;
  bool stream = false, store = true;
};

ResponsesRequest responses_request_parse(HttpServer& s, const json& body) {
  ResponsesRequest q;
  q.body = body;
  if (!body.contains("input")) bad_request("input", "'input' is required");
  for (const char* key : {"stream", "store", "background", "parallel_tool_calls"})
    if (body.contains(key) && !body[key].is_boolean() && !body[key].is_null())
      bad_request(key, fmt::format("'{}' must be a boolean", key));
  q.stream = body.value("stream", false);
  q.store = body.contains("store") && body["store"].is_boolean() ? body["store"].get<bool>() : true;
  if (body.contains("background") && body["background"].is_boolean() &&
      body["background"].get<bool>())
    bad_request("background", "background responses are not supported by this server");
  json chat = json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  json messages = json::array();
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string())
      bad_request("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    if (!body["previous_response_id"].is_string())
      bad_request("previous_response_id", "'previous_response_id' must be a string");
    const std::string prev = body["previous_response_id"].get<std::string>();
    auto e = s.responses().get(prev);
    if (!e)
      throw ApiError(404, "NotFoundError", fmt::format("Response with id '{}' not found.", prev),
                     "previous_response_id");
    q.history = e->messages;
  }
  q.new_messages = input_messages(body["input"]);
  for (const auto& m : q.history) messages.push_back(m);
  for (const auto& m : q.new_messages) messages.push_back(m);
  chat["messages"] = messages;

  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad_request("tools", "'tools' must be a list");
    json tools = json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      if (!t.is_object() || t.value("type", json()).is_null() || !t["type"].is_string())
        bad_request("tools", fmt::format("tools[{}] must be an object with a string 'type'", i));
      if (t["type"] != "function")
        bad_request("tools",
                    fmt::format("tools[{}].type '{}' is not supported (function tools are)", i,
                                t["type"].get<std::string>()));
      if (!t.contains("name") || !t["name"].is_string())
        bad_request("tools", fmt::format("tools[{}] needs a string 'name'", i));
      json f = {{"name", t["name"]}};
      if (t.contains("description")) f["description"] = t["description"];
      if (t.contains("parameters") && !t["parameters"].is_null()) f["parameters"] = t["parameters"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (tc.is_object()) {
      if (tc.value("type", json()) != "function" || !tc.contains("name") || !tc["name"].is_string())
        bad_request("tool_choice",
                    "an object 'tool_choice' must be {\"type\": \"function\", \"name\": ...}");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      chat["tool_choice"] = tc;
    }
    // Without tools, "none" and "auto" mean plain text.
    if (!chat.contains("tools") && tc.is_string() && (tc == "none" || tc == "auto"))
      chat.erase("tool_choice");
  }
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) {
    const json& m = body["max_output_tokens"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1)
      bad_request("max_output_tokens", "'max_output_tokens' must be a positive integer");
    chat["max_completion_tokens"] = m;
  }
  if (body.contains("text") && body["text"].is_object() && body["text"].contains("format")) {
    const json& f = body["text"]["format"];
    const std::string type = f.is_object() && f.contains("type") && f["type"].is_string()
                                 ? f["type"].get<std::string>()
                                 : "";
    if (type == "json_object") {
      chat["response_format"] = {{"type", "json_object"}};
    } else if (type == "json_schema") {
      json js = json::object();
      for (const char* key : {"name", "schema", "strict", "description"})
        if (f.contains(key)) js[key] = f[key];
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
    } else if (type != "text") {
      bad_request("text", "'text.format.type' must be one of: text, json_object, json_schema");
    }
  }
  if (body.contains("reasoning") && body["reasoning"].is_object() &&
      body["reasoning"].contains("effort") && !body["reasoning"]["effort"].is_null())
    chat["reasoning_effort"] = body["reasoning"]["effort"];
  // Sampling fields, OpenAI's and vLLM's extensions (the client's extra_body).
  for (const char* key :
       {"temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
        "skip_special_tokens", "chat_template_kwargs", "structured_outputs", "logit_bias",
        "request_id", "include_stop_str_in_output"})
    if (body.contains(key)) chat[key] = body[key];
  chat["stream"] = q.stream;
  q.chat_body = std::move(chat);
  return q;
}

int64_t count_tokens(HttpServer& s, const std::string& text) {
  return text.empty() ? 0 : static_cast<int64_t>(s.backend().tokenize(text, false).size());
}

json usage_of(const Job& job, int64_t reasoning_tokens) {
  const int64_t in = job.prompt_tokens(), out = job.completion_tokens();
  return {{"input_tokens", in},
          {"input_tokens_details", {{"cached_tokens", job.cached_tokens()}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", in + out}};
}

// The response object: the request's settings repeated, then what was produced.
json response_object(const ResponsesRequest& q, const std::string& id, int64_t created,
                     const std::string& model, const std::string& status, json output, json usage,
                     json error = nullptr, json incomplete = nullptr) {
  const json& b = q.body;
  auto field = [&](const char* key, json fallback) {
    return b.contains(key) && !b[key].is_null() ? b[key] : fallback;
  };
  json tools = json::array();
  if (b.contains("tools") && b["tools"].is_array()) tools = b["tools"];
  return {{"id", id},
          {"object", "response"},
          {"created_at", created},
          {"status", status},
          {"background", false},
          {"error", error},
          {"incomplete_details", incomplete},
          {"instructions", field("instructions", nullptr)},
          {"max_output_tokens", field("max_output_tokens", nullptr)},
          {"max_tool_calls", nullptr},
          {"model", model},
          {"output", output},
          {"parallel_tool_calls", field("parallel_tool_calls", true)},
          {"previous_response_id", field("previous_response_id", nullptr)},
          {"reasoning",
           {{"effort", b.contains("reasoning") && b["reasoning"].is_object()
                           ? b["reasoning"].value("effort", json(nullptr))
                           : json(nullptr)},
            {"summary", nullptr}}},
          {"service_tier", "auto"},
          {"store", q.store},
          {"temperature", field("temperature", 1.0)},
          {"text", field("text", json{{"format", {{"type", "text"}}}})},
          {"tool_choice", field("tool_choice", "auto")},
          {"tools", tools},
          {"top_p", field("top_p", 1.0)},
          {"truncation", field("truncation", "disabled")},
          {"usage", usage},
          {"user", nullptr},
          {"metadata", field("metadata", json::object())}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id},
          {"type", "reasoning"},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})},
          {"encrypted_content", nullptr}};
}
json text_part(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", json::array()}};
}
json message_item(const std::string& id, const std::string& status, json content) {
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"status", status},
          {"content", content}};
}
json call_item(const std::string& id, const std::string& call_id, const std::string& name,
               const std::string& arguments, const std::string& status) {
  return {{"id", id},     {"type", "function_call"}, {"call_id", call_id},
          {"name", name}, {"arguments", arguments},  {"status", status}};
}

// The conversation after this response, as chat messages: what previous_response_id continues.
json conversation_after(const ResponsesRequest& q, const json& output) {
  json msgs = q.history;
  for (const auto& m : q.new_messages) msgs.push_back(m);
  json turn = {{"role", "assistant"}, {"content", ""}};
  bool any = false;
  for (const auto& item : output) {
    if (item["type"] == "reasoning") {
      turn["reasoning_content"] = item["content"][0]["text"];
    } else if (item["type"] == "message") {
      turn["content"] = item["content"][0]["text"];
      any = true;
    } else if (item["type"] == "function_call") {
      if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
      turn["tool_calls"].push_back(
          {{"id", item["call_id"]},
           {"type", "function"},
           {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      any = true;
    }
  }
  if (any || turn.contains("reasoning_content")) msgs.push_back(std::move(turn));
  return msgs;
}

std::pair<std::string, json> status_of(const std::optional<std::string>& finish) {
  if (finish == "length") return {"incomplete", {{"reason", "max_output_tokens"}}};
  return {"completed", nullptr};
}

// The streamed events of one response (the Responses API's event sequence): items open, grow and
// close as the answer's reasoning, text and calls arrive.
class ResponseEvents {
 public:
  ResponseEvents(std::string response_id) : response_id_(std::move(response_id)) {}
  std::string event(const std::string& type, const json& payload) {
    json e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = payload.begin(); it != payload.end(); ++it) e[it.key()] = it.value();
    return sse_named_event(type, e);
  }
  std::string reasoning(const std::string& text) {
    std::string out;
    if (open_ != kReasoning) {
      out += close();
      open(kReasoning,
           {{"id", random_id("rs_")},
            {"type", "reasoning"},
            {"summary", json::array()},
            {"content", json::array()},
            {"encrypted_content", nullptr}},
           out);
      out += event("response.content_part.added",
                   part_ref({{"part", {{"type", "reasoning_text"}, {"text", ""}}}}));
    }
    text_ += text;
    return out + event("response.reasoning_text.delta", part_ref({{"delta", text}}));
  }
  std::string content(const std::string& text) {
    std::string out;
    if (open_ != kMessage) {
      out += close();
      open(kMessage, message_item(random_id("msg_"), "in_progress", json::array()), out);
      out += event("response.content_part.added", part_ref({{"part", text_part("")}}));
    }
    text_ += text;
    return out + event("response.output_text.delta",
                       part_ref({{"delta", text}, {"logprobs", json::array()}}));
  }
  std::string call(const ToolCallDelta& d) {
    std::string out;
    if (!d.id.empty() || open_ != kCall) {
      out += close();
      open(kCall, call_item(random_id("fc_"), random_id("call_"), d.name, "", "in_progress"), out);
    }
    if (d.arguments.empty()) return out;
    text_ += d.arguments;
    return out + event("response.function_call_arguments.delta", {{"item_id", item_["id"]},
                                                                  {"output_index", output_.size()},
                                                                  {"delta", d.arguments}});
  }
  // Closes the open item; a message item still marked `status` (incomplete on a length stop).
  std::string close(const std::string& status = "completed") {
    std::string out;
    if (open_ == kReasoning) {
      out += event("response.reasoning_text.done", part_ref({{"text", text_}}));
      const json part = {{"type", "reasoning_text"}, {"text", text_}};
      out += event("response.content_part.done", part_ref({{"part", part}}));
      item_["content"] = json::array({part});
    } else if (open_ == kMessage) {
      out += event("response.output_text.done",
                   part_ref({{"text", text_}, {"logprobs", json::array()}}));
      out += event("response.content_part.done", part_ref({{"part", text_part(text_)}}));
      item_["content"] = json::array({text_part(text_)});
      item_["status"] = status;
    } else if (open_ == kCall) {
      out += event("response.function_call_arguments.done", {{"item_id", item_["id"]},
                                                             {"output_index", output_.size()},
                                                             {"name", item_["name"]},
                                                             {"arguments", text_}});
      item_["arguments"] = text_;
      item_["status"] = "completed";
    } else {
      return out;
    }
    out += event("response.output_item.done", {{"output_index", output_.size()}, {"item", item_}});
    output_.push_back(std::move(item_));
    open_ = kNone;
    text_.clear();
    return out;
  }
  // Ends the output: an answer with neither text nor calls still gets its (empty) message.
  std::string finish(const std::string& status) {
    std::string out = close(status);
    bool has_answer = false;
    for (const auto& item : output_) has_answer |= item["type"] != "reasoning";
    if (!has_answer) {
      open(kMessage, message_item(random_id("msg_"), "in_progress", json::array()), out);
      out += event("response.content_part.added", part_ref({{"part", text_part("")}}));
      out += close(status);
    }
    return out;
  }
  const json& output() const { return output_; }

 private:
  enum Open { kNone, kReasoning, kMessage, kCall };
  void open(Open kind, json item, std::string& out) {
    open_ = kind;
    item_ = std::move(item);
    text_.clear();
    out += event("response.output_item.added", {{"output_index", output_.size()}, {"item", item_}});
  }
  json part_ref(json extra) const {
    json e = {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"content_index", 0}};
    for (auto it = extra.begin(); it != extra.end(); ++it) e[it.key()] = it.value();
    return e;
  }
  std::string response_id_;
  int64_t seq_ = 0;
  Open open_ = kNone;
  json item_;
  std::string text_;
  json output_ = json::array();
};

}  // namespace

void handle_responses(HttpServer& s, const httplib::Request& req, httplib::Response& res) {
  ResponsesRequest q = responses_request_parse(s, request_body_parse(req.body));
  ChatRequest r = chat_request_parse(q.chat_body, s.options().limits);
  ChatFlow flow = chat_flow_start(s, r, "resp");
  std::shared_ptr<Job> job = flow.job;
  const std::string id = random_id("resp_");
  const int64_t created = unix_time_now();
  const std::string model = s.model_name();

  if (!q.stream) {
    if (!wait_unstreamed(*job, req)) return;
    if (!job->error().empty()) throw ApiError(500, "InternalServerError", job->error());
    ChoiceState& c = job->choices().at(0);
    ChatMessage m = chat_message(c);
    const auto [status, incomplete] = status_of(c.finish_reason);
    json output = json::array();
    if (!m.reasoning.empty()) output.push_back(reasoning_item(random_id("rs_"), m.reasoning));
    if (!m.content.empty() || m.calls.empty())
      output.push_back(
          message_item(random_id("msg_"), status, json::array({text_part(m.content)})));
    for (const ToolCall& call : m.calls)
      output.push_back(
          call_item(random_id("fc_"), random_id("call_"), call.name, call.arguments, "completed"));
    json body = response_object(q, id, created, model, status, output,
                                usage_of(*job, count_tokens(s, m.reasoning)), nullptr, incomplete);
    if (q.store) s.responses().put(id, {body, conversation_after(q, output)});
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
    return;
  }

  auto events = std::make_shared<ResponseEvents>(id);
  auto reasoning_text = std::make_shared<std::string>();
  const json in_progress =
      response_object(q, id, created, model, "in_progress", json::array(), nullptr);
  std::string prologue = events->event("response.created", {{"response", in_progress}});
  prologue += events->event("response.in_progress", {{"response", in_progress}});
  auto emit = [job, events, reasoning_text](ChoiceEvent& ev) {
    std::string out;
    if (ev.choice != 0) return out;
    ChatDelta d = chat_delta(job->choices()[0], ev.delta);
    if (!d.reasoning.empty()) {
      *reasoning_text += d.reasoning;
      out += events->reasoning(d.reasoning);
    }
    if (!d.content.empty()) out += events->content(d.content);
    for (const ToolCallDelta& call : d.calls) out += events->call(call);
    return out;
  };
  auto finish = [&s, job, events, reasoning_text, q, id, created, model]() {
    if (!job->error().empty()) {
      std::string out = events->close();
      const json failed =
          response_object(q, id, created, model, "failed", events->output(), nullptr,
                          {{"code", "server_error"}, {"message", job->error()}});
      return out + events->event("response.failed", {{"response", failed}});
    }
    const auto [status, incomplete] = status_of(job->choices()[0].finish_reason);
    std::string out = events->finish(status);
    const json body =
        response_object(q, id, created, model, status, events->output(),
                        usage_of(*job, count_tokens(s, *reasoning_text)), nullptr, incomplete);
    if (q.store) s.responses().put(id, {body, conversation_after(q, events->output())});
    return out + events->event(status == "completed" ? "response.completed" : "response.incomplete",
                               {{"response", body}});
  };
  stream_job(res, req, job, emit, finish, prologue);
}

void handle_response_get(HttpServer& s, const std::string& id, httplib::Response& res) {
  auto e = s.responses().get(id);
  if (!e)
    throw ApiError(404, "NotFoundError", fmt::format("Response with id '{}' not found.", id),
                   "response_id");
  res.set_content(e->response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void handle_response_delete(HttpServer& s, const std::string& id, httplib::Response& res) {
  if (!s.responses().erase(id))
    throw ApiError(404, "NotFoundError", fmt::format("Response with id '{}' not found.", id),
                   "response_id");
  res.set_content(json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump(),
                  "application/json");
}

void handle_response_cancel(HttpServer& s, const std::string& id, httplib::Response& res) {
  if (!s.responses().get(id))
    throw ApiError(404, "NotFoundError", fmt::format("Response with id '{}' not found.", id),
                   "response_id");
  (void)res;
  bad_request("response_id",
              "Only background responses can be cancelled, and this server runs none.");
}

}  // namespace atom::server
