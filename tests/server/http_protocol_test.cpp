// The HTTP layer against a fake backend: vLLM's response shapes, SSE framing, error envelope and
// codes, auth, aborts on disconnect, and hostile requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "server/fake_backend.h"
#include "server/fake_server.h"
#include "server/http_server.h"
#include "server/reasoning.h"

namespace atom::test {
namespace {

using json = nlohmann::ordered_json;

class Http : public FakeServerTest {
 protected:
  // SSE events of a streamed body, [DONE] included as the string "[DONE]".
  static std::vector<json> events(const std::string& body, bool* done = nullptr) {
    std::vector<json> out;
    size_t pos = 0;
    if (done) *done = false;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
      const size_t end = body.find("\n\n", pos);
      const std::string payload = body.substr(pos + 6, end - pos - 6);
      if (payload == "[DONE]") {
        if (done) *done = true;
      } else {
        out.push_back(json::parse(payload));
      }
      pos = end + 2;
    }
    return out;
  }
  void expect_error(const httplib::Result& r, int status, const std::string& type,
                    const std::string& param, const std::string& fragment = "") {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["type"], type) << r->body;
    EXPECT_EQ(j["error"]["code"], status);
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (param.empty()) {
      EXPECT_TRUE(j["error"]["param"].is_null()) << r->body;
    } else {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
    if (!fragment.empty()) {
      EXPECT_NE(r->body.find(fragment), std::string::npos) << r->body;
    }
  }
};

TEST_F(Http, HealthVersionModels) {
  start();
  EXPECT_EQ(cli->Get("/health")->status, 200);
  EXPECT_EQ(json::parse(cli->Get("/version")->body)["version"], "0.1.0");
  const json m = json::parse(cli->Get("/v1/models")->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "fake-model");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["max_model_len"], 256);
  EXPECT_EQ(cli->Get("/nope")->status, 404);
}

TEST_F(Http, CompletionNonStreaming) {
  start();
  auto r = post(
      "/v1/completions",
      {{"model", "fake-model"}, {"prompt", "Hi"}, {"max_tokens", 5}, {"some_unknown_field", 1}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);  // BOS + 2 bytes
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
  // Defaults: max_tokens 16 for completions.
  r = post("/v1/completions", {{"prompt", "Hi"}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], backend.reply.substr(0, 16));
}

TEST_F(Http, CompletionEchoLogprobsAndN) {
  start();
  auto r =
      post("/v1/completions",
           {{"prompt", {1, 70, 71}}, {"max_tokens", 3}, {"echo", true}, {"n", 2}, {"logprobs", 1}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][0]["text"], "</s>CDHel");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // the first prompt token has none
  EXPECT_EQ(lp["tokens"].size(), 6u);
  EXPECT_EQ(lp["token_logprobs"][5], -0.5);
  EXPECT_EQ(lp["top_logprobs"][5]["l"], -0.5);
}

TEST_F(Http, CompletionStreamingWithUsage) {
  start();
  auto r = post("/v1/completions", {{"prompt", "Hi"},
                                    {"max_tokens", 4},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  bool done;
  const auto ev = events(r->body, &done);
  EXPECT_TRUE(done);
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["object"], "text_completion");
    text += ev[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Hell");
  EXPECT_EQ(ev[ev.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_EQ(ev.back()["usage"]["completion_tokens"], 4);
}

TEST_F(Http, ChatNonStreamingAndStreaming) {
  start();
  json msgs = json::array(
      {{{"role", "system"}, {"content", "be nice"}},
       {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}});
  auto r = post("/v1/chat/completions",
                {{"model", "fake-model"}, {"messages", msgs}, {"max_completion_tokens", 5}});
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // Chat max_tokens defaults to what fits: the whole scripted reply, ending with "stop".
  r = post("/v1/chat/completions", {{"messages", msgs}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], backend.reply);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "stop");

  r = post("/v1/chat/completions", {{"messages", msgs},
                                    {"max_tokens", 3},
                                    {"stream", true},
                                    {"logprobs", true},
                                    {"top_logprobs", 1}});
  bool done;
  const auto ev = events(r->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& e : ev) {
    if (e["choices"][0]["delta"].contains("content"))
      text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "Hel");
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev.back()["choices"][0]["logprobs"]["content"][0]["token"], "l");
  EXPECT_EQ(ev.back()["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["logprob"], -0.5);
}

// Content given as parts: text parts joined by newlines into the prompt; any other part type (an
// image) is a 400 naming the part, in chat completions and in the Responses and Messages APIs.
TEST_F(Http, ContentPartsJoinedOrRefusedByName) {
  start();
  json parts =
      json::array({{{"type", "text"}, {"text", "one"}}, {{"type", "text"}, {"text", "two"}}});
  auto r = post("/v1/chat/completions",
                {{"messages", json::array({{{"role", "user"}, {"content", parts}}})}});
  ASSERT_EQ(r->status, 200) << r->body;
  const server::BackendRequest last = backend.last_request();
  EXPECT_NE(backend.detokenize(last.prompt_ids, false).find("<|user|>one\ntwo"), std::string::npos);
  json image = json::array({{{"type", "text"}, {"text", "see"}},
                            {{"type", "image_url"}, {"image_url", {{"url", "x"}}}}});
  r = post("/v1/chat/completions",
           {{"messages", json::array({{{"role", "user"}, {"content", image}}})}});
  ASSERT_EQ(r->status, 400);
  json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], "messages");
  // This model takes no images (chat_images_test.cpp has a model that does).
  EXPECT_NE(e["message"].get<std::string>().find(
                "messages[0].content[1]: this model (fake-model) takes no images"),
            std::string::npos)
      << e;
  r = post(
      "/v1/responses",
      {{"input",
        json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_file"}}})}}})}});
  ASSERT_EQ(r->status, 400);
  e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], "input");
  EXPECT_NE(e["message"].get<std::string>().find("input[0].content[0].type 'input_file'"),
            std::string::npos)
      << e;
  r = post("/v1/messages", {{"max_tokens", 4},
                            {"system", json::array({{{"type", "image"}}})},
                            {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
  ASSERT_EQ(r->status, 400);
  e = json::parse(r->body);
  EXPECT_EQ(e["type"], "error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("system[0].type 'image'"),
            std::string::npos)
      << e;
  r = post("/v1/messages", {{"max_tokens", 4},
                            {"system", json::array({{{"type", "text"}}})},
                            {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
  ASSERT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("system[0] needs a string 'text'"), std::string::npos) << r->body;
}

TEST_F(Http, ReasoningIsSplitOut) {
  backend.reasoning = true;
  backend.reply = "plan it</think>\n\nThe answer.";
  start();
  json msgs = json::array({{{"role", "user"}, {"content", "q"}}});
  auto r = post("/v1/chat/completions", {{"messages", msgs}});
  json m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "plan it");
  EXPECT_EQ(m["content"], "The answer.");
  r = post("/v1/chat/completions", {{"messages", msgs}, {"stream", true}});
  std::string reasoning, content;
  for (const auto& e : events(r->body)) {
    const json& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "plan it");
  EXPECT_EQ(content, "The answer.");
}

TEST(Reasoning, SplitsAcrossArbitraryChunkBoundaries) {
  const std::string out = "<think>a < b and </th not yet</think>\n\nfinal <b>answer</b>";
  for (size_t step = 1; step <= 7; ++step) {
    server::ReasoningParser p(false);
    std::string r, c;
    for (size_t i = 0; i < out.size(); i += step) {
      const auto d = p.feed(out.substr(i, step));
      r += d.reasoning;
      c += d.content;
    }
    const auto d = p.finish();
    r += d.reasoning;
    c += d.content;
    EXPECT_EQ(r, "a < b and </th not yet") << step;
    EXPECT_EQ(c, "final <b>answer</b>") << step;
  }
  EXPECT_EQ(server::ReasoningParser::split("no thinking here", false).content, "no thinking here");
  EXPECT_EQ(server::ReasoningParser::split("still thinking", true).reasoning, "still thinking");
  EXPECT_TRUE(server::ReasoningParser::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(server::ReasoningParser::prompt_opens_reasoning("<think>\n\n</think>\n\n"));
}

// Tool calls with --enable-auto-tool-choice --tool-call-parser: the scripted reply is what the
// model "wrote".
class HttpTools : public Http {
 protected:
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const json msgs = json::array({{{"role", "user"}, {"content", "q"}}});
  void start_with(const std::string& parser) {
    server::ServerOptions o{};
    o.enable_auto_tool_choice = true;
    o.tool_call_parser = parser;
    start(o);
  }
  // Streamed content, and per tool-call index its id, name and concatenated arguments.
  struct Streamed {
    std::string content, reasoning;
    std::vector<json> calls;  // {"id", "type", "name", "arguments"}
    json finish_reason;
    int finish_chunks = 0;
    bool first_is_role = false;
  };
  Streamed stream(json body) {
    body["stream"] = true;
    auto r = post("/v1/chat/completions", body);
    EXPECT_EQ(r->status, 200) << r->body;
    bool done = false;
    Streamed st;
    const auto ev = events(r->body, &done);
    EXPECT_TRUE(done);
    if (ev.empty()) return st;
    st.first_is_role = ev[0]["choices"][0]["delta"]["role"] == "assistant";
    for (const auto& e : ev) {
      if (e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      const json& d = c["delta"];
      if (d.contains("content")) st.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) {
        st.reasoning += d["reasoning_content"].get<std::string>();
        EXPECT_EQ(d["reasoning"], d["reasoning_content"]);
      }
      if (!c["finish_reason"].is_null()) {
        st.finish_reason = c["finish_reason"];
        ++st.finish_chunks;
      }
      if (!d.contains("tool_calls")) continue;
      for (const auto& tc : d["tool_calls"]) {
        const size_t i = tc["index"].get<size_t>();
        if (i == st.calls.size()) {
          // The first delta of a call names it.
          EXPECT_TRUE(tc.contains("id") && tc["function"].contains("name")) << tc.dump();
          st.calls.push_back({{"id", tc["id"]},
                              {"type", tc["type"]},
                              {"name", tc["function"]["name"]},
                              {"arguments", ""}});
        }
        EXPECT_LT(i, st.calls.size()) << tc.dump();
        if (i < st.calls.size() && tc["function"].contains("arguments"))
          st.calls[i]["arguments"] = st.calls[i]["arguments"].get<std::string>() +
                                     tc["function"]["arguments"].get<std::string>();
      }
    }
    return st;
  }
};

TEST_F(HttpTools, HermesCallsNonStreamedAndStreamed) {
  backend.reply = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                  "\"Paris\"}}\n</tool_call>\n"
                  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                  "\"Zürich\"}}\n</tool_call>";
  start_with("hermes");
  const json body = {{"messages", msgs}, {"tools", tools}, {"tool_choice", "auto"}};
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Checking.\n");
  const json& calls = c["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << r->body;
  for (const auto& call : calls) {
    EXPECT_EQ(call["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_TRUE(call["function"]["arguments"].is_string());
  }
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(json::parse(calls[1]["function"]["arguments"].get<std::string>()),
            json({{"city", "Zürich"}}));
  // Usage counts every generated token, calls included.
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], backend.reply.size());

  // Tools default to tool_choice "auto".
  const Streamed st = stream({{"messages", msgs}, {"tools", tools}});
  EXPECT_TRUE(st.first_is_role);
  EXPECT_EQ(st.content, "Checking.\n");
  ASSERT_EQ(st.calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(st.calls[i]["type"], "function");
    EXPECT_EQ(st.calls[i]["name"], "get_weather");
    EXPECT_EQ(st.calls[i]["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
    EXPECT_EQ(st.calls[i]["arguments"], calls[i]["function"]["arguments"]);
  }
  EXPECT_EQ(st.finish_reason, "tool_calls");
  EXPECT_EQ(st.finish_chunks, 1);
}

TEST_F(HttpTools, OnlyACallMeansNullContent) {
  backend.reply =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  start_with("hermes");
  auto r =
      post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "auto"}});
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_TRUE(c["message"]["content"].is_null()) << r->body;
  EXPECT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  // Cut off by max_tokens at the last byte: the call is parsed, but the finish reason stays
  // "length".
  r = post("/v1/chat/completions",
           {{"messages", msgs}, {"tools", tools}, {"max_tokens", backend.reply.size()}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "length") << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["tool_calls"].size(), 1u) << r->body;
  const Streamed st =
      stream({{"messages", msgs}, {"tools", tools}, {"max_tokens", backend.reply.size()}});
  EXPECT_EQ(st.finish_reason, "length");
  EXPECT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.content, "");
}

TEST_F(HttpTools, MalformedCallsAndToolChoiceNoneAreContent) {
  backend.reply =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {city: Paris}}\n</tool_call>";
  start_with("hermes");
  for (const json& choice : {json("auto"), json("none")}) {
    auto r = post("/v1/chat/completions",
                  {{"messages", msgs}, {"tools", tools}, {"tool_choice", choice}});
    ASSERT_EQ(r->status, 200) << r->body;
    const json c = json::parse(r->body)["choices"][0];
    EXPECT_EQ(c["message"]["content"], backend.reply);
    EXPECT_TRUE(c["message"]["tool_calls"].empty());
    EXPECT_EQ(c["finish_reason"], "stop");
    const Streamed st = stream({{"messages", msgs}, {"tools", tools}, {"tool_choice", choice}});
    EXPECT_EQ(st.content, backend.reply);
    EXPECT_TRUE(st.calls.empty());
    EXPECT_EQ(st.finish_reason, "stop");
  }
  // tool_choice "none" parses nothing, even a well-formed call; so do requests without tools.
  backend.reply = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
  auto r =
      post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], backend.reply);
  r = post("/v1/chat/completions", {{"messages", msgs}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], backend.reply);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "stop");
  // "required" constrains decoding itself: another structured output beside it is refused.
  expect_error(post("/v1/chat/completions", {{"messages", msgs},
                                             {"tools", tools},
                                             {"tool_choice", "required"},
                                             {"guided_regex", "a+"}}),
               400, "BadRequestError", "tool_choice");
}

TEST_F(HttpTools, ReasoningThenACallWithLogprobs) {
  backend.reasoning = true;
  backend.reply = "use the tool</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                  "{}}\n</tool_call>";
  start_with("hermes");
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"logprobs", true}});
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["message"]["reasoning_content"], "use the tool");
  EXPECT_TRUE(c["message"]["content"].is_null()) << r->body;
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(c["logprobs"]["content"].size(), backend.reply.size());
  // Streamed, every token's logprob is still sent exactly once.
  auto sr = post("/v1/chat/completions",
                 {{"messages", msgs}, {"tools", tools}, {"logprobs", true}, {"stream", true}});
  size_t lps = 0;
  for (const auto& e : events(sr->body))
    if (!e["choices"].empty() && !e["choices"][0]["logprobs"].is_null())
      lps += e["choices"][0]["logprobs"]["content"].size();
  EXPECT_EQ(lps, backend.reply.size());
}

TEST_F(HttpTools, Llama3Json) {
  backend.reply = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}";
  start_with("llama3_json");
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}});
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_TRUE(c["message"]["content"].is_null()) << r->body;
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Lima"}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  const Streamed st = stream({{"messages", msgs}, {"tools", tools}});
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls[0]["arguments"], c["message"]["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(st.content, "");
  EXPECT_EQ(st.finish_reason, "tool_calls");
}

TEST_F(HttpTools, HermesKeepsSpecialTokensInTheTextItParses) {
  start_with("hermes");
  // As vLLM: <tool_call> is a special token in some tokenizers, so auto tool requests keep them.
  ASSERT_EQ(post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}})->status, 200);
  EXPECT_FALSE(backend.last_request().sampling.skip_special_tokens);
  ASSERT_EQ(
      post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}})
          ->status,
      200);
  EXPECT_TRUE(backend.last_request().sampling.skip_special_tokens);
  ASSERT_EQ(post("/v1/chat/completions", {{"messages", msgs}})->status, 200);
  EXPECT_TRUE(backend.last_request().sampling.skip_special_tokens);
}

TEST_F(HttpTools, DeepSeekV31) {
  backend.reply =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
      "\"Rome\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  start_with("deepseek_v31");
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}});
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["message"]["content"], "Sure.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r->body;
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(backend.last_request().sampling.skip_special_tokens);
  const Streamed st = stream({{"messages", msgs}, {"tools", tools}});
  EXPECT_EQ(st.content, "Sure.");
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls[0]["arguments"], c["message"]["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(st.finish_reason, "tool_calls");
}

TEST_F(HttpTools, AutoWithoutTheFlagsIsRefusedAsVllm) {
  start();  // no --enable-auto-tool-choice
  for (bool streamed : {false, true})
    expect_error(
        post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"stream", streamed}}),
        400, "BadRequestError", "tool_choice",
        "\\\"auto\\\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be "
        "set");
  EXPECT_EQ(
      post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}})
          ->status,
      200);
}

// gpt-oss: a chat template with harmony channels makes the server split them (vLLM always does
// for gpt-oss), and its calls need no tool flags.
TEST_F(HttpTools, HarmonyChannelsAndACallWithoutToolFlags) {
  backend.harmony = true;
  backend.reply =
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
  start();
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["message"]["reasoning_content"], "Need the weather.");
  EXPECT_EQ(c["message"]["reasoning"], "Need the weather.");
  EXPECT_TRUE(c["message"]["content"].is_null()) << r->body;
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  // vLLM's openai parser: json.dumps(json.loads(text)).
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  // Harmony's markers are special tokens: they stay in the text the parser reads.
  EXPECT_FALSE(backend.last_request().sampling.skip_special_tokens);
  const Streamed st = stream({{"messages", msgs}, {"tools", tools}});
  EXPECT_EQ(st.reasoning, "Need the weather.");
  EXPECT_EQ(st.content, "");
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls[0]["arguments"], "{\"city\":\"Paris\"}");  // streamed as the model wrote it
  EXPECT_EQ(st.finish_reason, "tool_calls");
  EXPECT_EQ(st.finish_chunks, 1);

  // Without tools: reasoning and content; tool_choice none drops calls.
  backend.reply = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
                  "<|message|>4";
  r = post("/v1/chat/completions", {{"messages", msgs}});
  json m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Simple.");
  EXPECT_EQ(m["content"], "4");
  EXPECT_TRUE(m["tool_calls"].empty());
  const Streamed plain = stream({{"messages", msgs}});
  EXPECT_EQ(plain.reasoning, "Simple.");
  EXPECT_EQ(plain.content, "4");
  EXPECT_EQ(plain.finish_reason, "stop");
}

TEST_F(HttpTools, Qwen3CoderTypesArgumentsByTheRequestsToolsAndStreamsThem) {
  backend.reply =
      "Checking.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  start_with("qwen3_coder");
  const json typed = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}}}}])");
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", typed}});
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["message"]["content"], "Checking.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r->body;
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\": \"Paris\", \"days\": 3}");
  EXPECT_FALSE(backend.last_request().sampling.skip_special_tokens);
  const Streamed st = stream({{"messages", msgs}, {"tools", typed}});
  EXPECT_EQ(st.content, "Checking.");
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls[0]["arguments"], c["message"]["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(st.finish_reason, "tool_calls");
}

TEST_F(HttpTools, KimiK2CallsKeepTheModelsIds) {
  backend.reply =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
      "<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>";
  start_with("kimi_k2");
  auto r = post("/v1/chat/completions", {{"messages", msgs}, {"tools", tools}});
  json call = json::parse(r->body)["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"], "functions.get_weather:0");  // the model's own id, as vLLM returns it
  EXPECT_EQ(call["function"]["arguments"], "{\"city\": \"Oslo\"}");
  const Streamed st = stream({{"messages", msgs}, {"tools", tools}});
  ASSERT_EQ(st.calls.size(), 1u);
  EXPECT_EQ(st.calls[0]["id"], "functions.get_weather:0");
}

TEST_F(Http, ReasoningParserFlagAndTemplateVariables) {
  backend.reply = "weighing it</think>\n\nanswer";
  server::ServerOptions o;
  o.reasoning_parser = "deepseek_r1";  // reasoning from the first token, no <think> needed
  o.default_chat_template_kwargs = {{"x", 0}, {"y", 2}};
  start(o);
  const json msgs = json::array({{{"role", "user"}, {"content", "q"}}});
  auto r = post("/v1/chat/completions",
                {{"messages", msgs},
                 {"reasoning_effort", "high"},
                 {"chat_template_kwargs", {{"reasoning_effort", "low"}, {"x", 1}}}});
  const json m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "weighing it");
  EXPECT_EQ(m["content"], "answer");
  // The template sees the server's defaults under the request's variables, and the request's
  // reasoning_effort over both (vLLM's order).
  EXPECT_EQ(backend.last_chat_template_kwargs().dump(),
            json({{"x", 1}, {"y", 2}, {"reasoning_effort", "high"}}).dump());
}

TEST_F(Http, DeepSeekV3ReasoningFollowsThinking) {
  backend.reply = "hmm</think>Paris.";
  server::ServerOptions o;
  o.reasoning_parser = "deepseek_v3";
  o.default_chat_template_kwargs = {{"thinking", true}};
  start(o);
  const json msgs = json::array({{{"role", "user"}, {"content", "q"}}});
  json m = json::parse(
      post("/v1/chat/completions", {{"messages", msgs}})->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "hmm");
  EXPECT_EQ(m["content"], "Paris.");
  m = json::parse(post("/v1/chat/completions",
                       {{"messages", msgs}, {"chat_template_kwargs", {{"thinking", false}}}})
                      ->body)["choices"][0]["message"];
  EXPECT_TRUE(m["reasoning_content"].is_null());
  EXPECT_EQ(m["content"], "hmm</think>Paris.");
}

TEST_F(Http, ErrorsUseVllmEnvelopeAndCodes) {
  start();
  auto r = cli->Post("/v1/completions", "{not json", "application/json");
  expect_error(r, 400, "BadRequestError", "");
  expect_error(post("/v1/completions", json::array({1, 2})), 400, "BadRequestError", "");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", "many"}}), 400,
               "BadRequestError", "max_tokens");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", -3}}), 400,
               "BadRequestError", "max_tokens");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"temperature", -1}}), 400,
               "BadRequestError", "temperature");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"top_p", 0}}), 400, "BadRequestError",
               "top_p");
  expect_error(post("/v1/completions", {{"prompt", 5}}), 400, "BadRequestError", "prompt");
  expect_error(post("/v1/completions", {{"max_tokens", 5}}), 400, "BadRequestError", "prompt");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"model", "gpt-9"}}), 404, "NotFoundError",
               "model", "The model `gpt-9` does not exist.");
  expect_error(
      post("/v1/completions", {{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}),
      400, "BadRequestError", "stream_options");
  expect_error(post("/v1/completions", {{"prompt", std::string(300, 'a')}}), 400, "BadRequestError",
               "input_tokens", "maximum context length is 256 tokens");
  expect_error(post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 1000}}), 400,
               "BadRequestError", "input_tokens", "you requested 1000 output tokens");
  expect_error(post("/v1/completions", {{"prompt", {1, 999999}}}), 400, "BadRequestError",
               "prompt");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}}), 400,
               "BadRequestError", "logit_bias");
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logprobs", 50}}), 400, "BadRequestError",
               "logprobs");
  json msgs = json::array({{{"role", "user"}, {"content", "q"}}});
  expect_error(post("/v1/chat/completions", {{"messages", msgs}, {"top_logprobs", 2}}), 400,
               "BadRequestError", "top_logprobs");
  expect_error(post("/v1/chat/completions", {{"messages", msgs}, {"tools", json::array()}}), 400,
               "BadRequestError", "tools");
  expect_error(post("/v1/chat/completions", {{"messages", msgs}, {"tool_choice", "auto"}}), 400,
               "BadRequestError", "tool_choice");
  expect_error(post("/v1/chat/completions", {{"messages", json::array()}}), 400, "BadRequestError",
               "messages");
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "raise"}}}}}), 400,
               "BadRequestError", "", "template error");
  expect_error(
      post("/v1/chat/completions",
           {{"messages", msgs}, {"continue_final_message", true}, {"add_generation_prompt", true}}),
      400, "BadRequestError", "continue_final_message");
  // The server is healthy after all that, with nothing left running.
  EXPECT_EQ(cli->Get("/health")->status, 200);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}})->status, 200);
}

TEST_F(Http, ApiKeyGuardsV1Only) {
  server::ServerOptions o;
  o.api_key = "sekret";
  start(o);
  auto r = post("/v1/completions", {{"prompt", "x"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body), json::parse(R"({"error":"Unauthorized"})"));
  EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}}, {{"Authorization", "Bearer wrong"}})->status,
            401);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}},
                 {{"Authorization", "Bearer sekret"}})
                ->status,
            200);
  EXPECT_EQ(cli->Get("/health")->status, 200);
  EXPECT_EQ(cli->Get("/metrics")->status, 200);
}

TEST_F(Http, QueueFullIs503) {
  backend.max_waiting = 0;
  start();
  expect_error(post("/v1/completions", {{"prompt", "x"}}), 503, "ServiceUnavailableError", "");
}

TEST_F(Http, ClientDisconnectMidStreamAbortsTheRequest) {
  backend.delay = std::chrono::milliseconds(20);
  backend.reply = std::string(200, 'x');
  start();
  httplib::Client c("127.0.0.1", srv->port());
  int chunks = 0;
  json body = {{"prompt", "go"}, {"max_tokens", 200}, {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  // Hang up after a few chunks.
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 5; };
  httplib::Response res;
  httplib::Error err;
  EXPECT_FALSE(c.send(req, res, err));
  for (int i = 0; i < 200 && backend.live() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend.live(), 0);
  EXPECT_EQ(backend.aborted_count(), 1);
}

TEST_F(Http, ClientDisconnectWhileWaitingAbortsNonStreamed) {
  backend.delay = std::chrono::milliseconds(20);
  backend.reply = std::string(200, 'x');
  start();
  std::thread t([&] {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(0, 300000);  // give up after 0.3 s
    c.Post("/v1/completions", json{{"prompt", "go"}, {"max_tokens", 200}}.dump(),
           "application/json");
  });
  t.join();
  for (int i = 0; i < 300 && backend.live() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend.live(), 0);
  EXPECT_EQ(backend.aborted_count(), 1);
}

// An abort whose answer comes later than the half second the HTTP thread waits for it (a long
// engine step; every step under the sanitizers): the late final update is still counted, once,
// in every series. It used to be dropped: the request counted as aborted but its prompt tokens,
// latency and phases never (metrics.test.mjs failed this way under ASan).
TEST_F(Http, AnAbortAnsweredLateIsCountedOnce) {
  backend.delay = std::chrono::milliseconds(1500);  // the first step ends after the wait
  backend.reply = std::string(8, 'x');
  start();
  std::thread t([&] {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(0, 200000);  // gone after 0.2 s, long before the step ends
    c.Post("/v1/completions", json{{"prompt", "late"}, {"max_tokens", 8}}.dump(),
           "application/json");
  });
  t.join();
  for (int i = 0; i < 400 && backend.live() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(backend.live(), 0);
  EXPECT_EQ(backend.aborted_count(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the update's accounting
  const std::string m = metrics.render();
  auto value = [&](const std::string& series) {
    const size_t at = m.find(series);
    if (at == std::string::npos) return std::string("(missing)");
    const size_t sp = m.find(' ', m.find('}', at));
    return m.substr(sp + 1, m.find('\n', sp) - sp - 1);
  };
  EXPECT_EQ(value("vllm:prompt_tokens_total{"),
            std::to_string(backend.tokenize("late", true).size()))
      << m;
  EXPECT_EQ(value("vllm:e2e_request_latency_seconds_count{"), "1") << m;
  EXPECT_EQ(value("finished_reason=\"abort\""), "1") << m;
  EXPECT_EQ(value("finished_reason=\"length\""), "0") << m;
}

TEST_F(Http, HostileBodiesLeaveTheServerHealthy) {
  server::ServerOptions o;
  o.max_body_bytes = 1 << 20;
  o.http.header_timeout_s = 1;
  start(o);
  const std::string big(10 << 20, 'a');
  auto r = cli->Post("/v1/completions", big, "application/json");
  if (r) {
    EXPECT_GE(r->status, 400);
  }
  r = post("/v1/completions", {{"prompt", std::string(600 << 10, 'b')}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  // A slow client that never finishes its headers blocks nobody and is dropped after the read
  // timeout.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(srv->port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
  ASSERT_EQ(send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  EXPECT_EQ(cli->Get("/health")->status, 200);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "ok"}, {"max_tokens", 2}})->status, 200);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  const auto t0 = std::chrono::steady_clock::now();
  const ssize_t got = recv(fd, buf, sizeof buf, 0);
  // Dropped, or answered with a client error; never served.
  if (got > 0) {
    const std::string reply(buf, static_cast<size_t>(got));
    EXPECT_EQ(reply.rfind("HTTP/1.1 4", 0), 0u) << reply;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  close(fd);
  EXPECT_EQ(cli->Get("/health")->status, 200);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "ok"}, {"max_tokens", 2}})->status, 200);
  for (int i = 0; i < 100 && backend.live() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend.live(), 0);
}

TEST_F(Http, TokenizeDetokenizeAndMetrics) {
  start();
  auto r = post("/tokenize", {{"prompt", "ab"}});
  json j = json::parse(r->body);
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["tokens"], json::array({0, 'a' + 3, 'b' + 3}));
  EXPECT_EQ(j["max_model_len"], 256);
  r = post("/detokenize", {{"tokens", {'h' + 3, 'i' + 3}}});
  EXPECT_EQ(json::parse(r->body)["prompt"], "hi");
  expect_error(post("/detokenize", {{"tokens", {-1}}}), 400, "BadRequestError", "tokens");
  post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}});
  const std::string m = cli->Get("/metrics")->body;
  for (const char* name :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
        "vllm:request_success_total", "# TYPE vllm:generation_tokens_total counter",
        "# TYPE vllm:time_to_first_token_seconds histogram"})
    EXPECT_NE(m.find(name), std::string::npos) << name;
  EXPECT_NE(m.find("vllm:generation_tokens_total{engine=\"0\",model_name=\"fake-model\"} 3"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("finished_reason=\"length\"} 1"), std::string::npos);
}

}  // namespace
}  // namespace atom::test
