// Finding a model's chat template and special tokens (transformers' and vLLM's rules), and the
// request checks of ChatTemplate::render. The templates here are trivial on purpose: rendering
// itself is compared with jinja2 in the reference tests; these check which template and which
// variables are used.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "reference_util.h"
#include "tokenizer/chat_template.h"

namespace atom {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;
using tokenizer::ChatRenderOptions;
using tokenizer::ChatTemplate;

class ModelDir {
 public:
  ModelDir() {
    path_ = fs::temp_directory_path() /
            ("atom_chat_template_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~ModelDir() { fs::remove_all(path_); }
  void write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  void write_json(const std::string& name, const json& j) const { write(name, j.dump()); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

const json kHello = json::array({{{"role", "user"}, {"content", "hello"}}});

std::string render(const ChatTemplate& ct, ChatRenderOptions o = {}) {
  return ct.render(kHello, o);
}

TEST(ChatTemplateLoader, ConfigStringAndAddedTokens) {
  ModelDir d;
  d.write_json("tokenizer_config.json",
               {{"chat_template",
                 "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ "
                 "messages[0].content }}"},
                {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}, {"lstrip", false}}},
                {"eos_token", "</s>"},
                {"pad_token", nullptr},
                {"unk_token", ""}});
  auto ct = ChatTemplate::from_model_dir(d.path());
  EXPECT_EQ(render(ct), "<s>|</s>||False|hello");
  EXPECT_EQ(ct.special_tokens().dump(), R"({"bos_token":"<s>","eos_token":"</s>"})");
}

TEST(ChatTemplateLoader, SpecialTokensMapOverridesConfig) {
  ModelDir d;
  d.write_json("tokenizer_config.json",
               {{"chat_template", "{{ bos_token }}{{ additional_special_tokens }}"},
                {"bos_token", "<old>"}});
  d.write_json("special_tokens_map.json",
               {{"bos_token", {{"content", "<new>"}}},
                {"additional_special_tokens", json::array({"<a>", {{"content", "<b>"}}})}});
  EXPECT_EQ(render(ChatTemplate::from_model_dir(d.path())), "<new>['<a>', '<b>']");
}

TEST(ChatTemplateLoader, NamedTemplatesChooseLikeTransformers) {
  ModelDir d;
  d.write_json("tokenizer_config.json",
               {{"chat_template",
                 json::array({{{"name", "default"}, {"template", "default"}},
                              {{"name", "tool_use"}, {"template", "tools:{{ tools|length }}"}},
                              {{"name", "rag"}, {"template", "rag:{{ documents[0].title }}"}}})}});
  auto ct = ChatTemplate::from_model_dir(d.path());
  EXPECT_EQ(render(ct), "default");
  ChatRenderOptions with_tools;
  with_tools.tools = json::array({{{"type", "function"}}});
  EXPECT_EQ(render(ct, with_tools), "tools:1");
  ChatRenderOptions empty_tools;  // an empty list is still "tools given" to transformers
  empty_tools.tools = json::array();
  EXPECT_EQ(render(ct, empty_tools), "tools:0");
  ChatRenderOptions rag;
  rag.template_name = "rag";
  rag.documents = json::array({{{"title", "T"}, {"text", "x"}}});
  EXPECT_EQ(render(ct, rag), "rag:T");
  ChatRenderOptions unknown;
  unknown.template_name = "nope";
  EXPECT_THROW(render(ct, unknown), Error);
  EXPECT_EQ(ct.template_sources().size(), 3u);
}

TEST(ChatTemplateLoader, NamedTemplatesWithoutDefault) {
  ModelDir d;
  d.write_json("tokenizer_config.json",
               {{"chat_template", json::array({{{"name", "a"}, {"template", "A"}},
                                               {{"name", "b"}, {"template", "B"}}})}});
  auto ct = ChatTemplate::from_model_dir(d.path());
  try {
    render(ct);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a, b"), std::string::npos) << e.what();
  }
  ChatRenderOptions b;
  b.template_name = "b";
  EXPECT_EQ(render(ct, b), "B");
}

TEST(ChatTemplateLoader, JinjaFileTakesPrecedence) {
  ModelDir d;
  d.write_json("tokenizer_config.json", {{"chat_template", "from config"}, {"eos_token", "E"}});
  d.write("chat_template.jinja", "from file {{ eos_token }}\n");
  EXPECT_EQ(render(ChatTemplate::from_model_dir(d.path())), "from file E");
}

TEST(ChatTemplateLoader, AdditionalChatTemplates) {
  ModelDir d;
  d.write("chat_template.jinja", "main");
  d.write("additional_chat_templates/tool_use.jinja", "tool template");
  auto ct = ChatTemplate::from_model_dir(d.path());
  EXPECT_EQ(render(ct), "main");
  ChatRenderOptions o;
  o.tools = json::array({json::object()});
  EXPECT_EQ(render(ct, o), "tool template");
}

TEST(ChatTemplateLoader, ProcessorChatTemplateJson) {
  ModelDir d;
  d.write_json("chat_template.json", {{"chat_template", "processor {{ messages|length }}"}});
  EXPECT_EQ(render(ChatTemplate::from_model_dir(d.path())), "processor 1");
}

TEST(ChatTemplateLoader, OverrideTemplate) {
  ModelDir d;
  d.write_json("tokenizer_config.json", {{"chat_template", "model"}, {"bos_token", "B"}});
  d.write("custom.jinja", "file {{ bos_token }}");
  EXPECT_EQ(render(ChatTemplate::from_model_dir(d.path(), (d.path() / "custom.jinja").string())),
            "file B");
  // A literal template on the command line: Python escapes are decoded, as vLLM does.
  EXPECT_EQ(
      render(ChatTemplate::from_model_dir(d.path(), "{{ bos_token }}\\n{{ messages[0].content }}")),
      "B\nhello");
  EXPECT_THROW(ChatTemplate::from_model_dir(d.path(), "no/such/file.jinja"), Error);
}

TEST(ChatTemplateLoader, MissingTemplate) {
  ModelDir d;
  d.write_json("tokenizer_config.json", {{"eos_token", "E"}});
  auto ct = ChatTemplate::from_model_dir(d.path());
  EXPECT_FALSE(ct.has_template());
  try {
    render(ct);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::from_model_dir(d.path() / "absent"), Error);
}

TEST(ChatTemplateLoader, SyntaxErrorReportedAtRenderWithLine) {
  ModelDir d;
  d.write("chat_template.jinja", "line one\n{% if %}\n");
  auto ct = ChatTemplate::from_model_dir(d.path());  // loading alone does not fail
  try {
    render(ct);
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kSyntax);
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateRender, RaiseExceptionKeepsTheTemplatesMessage) {
  auto ct = ChatTemplate::from_string("{{ raise_exception('Roles must alternate') }}");
  try {
    render(ct);
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kRaised);
    EXPECT_STREQ(e.what(), "Roles must alternate");
  }
}

TEST(ChatTemplateRender, RuntimeErrorNamesTheLine) {
  auto ct = ChatTemplate::from_string("a\nb\n{{ messages[0].content + 1 }}");
  try {
    render(ct);
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("can only concatenate str"), std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplateRender, VariablesTransformersPasses) {
  auto ct = ChatTemplate::from_string(
      "{{ add_generation_prompt }}|{{ tools }}|{{ documents }}|{{ bos_token }}|{{ enable_thinking "
      "}}",
      {{"bos_token", "<s>"}});
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  o.kwargs = {{"enable_thinking", false}, {"bos_token", "<override>"}};
  EXPECT_EQ(render(ct, o), "False|None|None|<override>|False");
}

TEST(ChatTemplateRender, RequestChecks) {
  auto ct = ChatTemplate::from_string("{{ messages|length }}");
  ChatRenderOptions both;
  both.continue_final_message = true;  // add_generation_prompt defaults to true
  EXPECT_THROW(render(ct, both), Error);
  ChatRenderOptions reserved;
  reserved.kwargs = {{"messages", json::array()}};
  EXPECT_THROW(render(ct, reserved), Error);
  ChatRenderOptions bad_tools;
  bad_tools.tools = json::array({"not an object"});
  EXPECT_THROW(render(ct, bad_tools), Error);
  ChatRenderOptions bad_docs;
  bad_docs.documents = json::array({1});
  EXPECT_THROW(render(ct, bad_docs), Error);
  EXPECT_THROW(ct.render(json::object()), Error);
}

TEST(ChatTemplateRender, ContinueFinalMessageCutsAtTheMessageEnd) {
  auto ct = ChatTemplate::from_string(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  o.continue_final_message = true;
  json chat = json::array(
      {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Once upon"}}});
  EXPECT_EQ(ct.render(chat, o), "<user>hi</user><assistant>Once upon");
  // A template that strips the message loses the tag's space: the cut then strips too.
  auto trimming =
      ChatTemplate::from_string("{% for m in messages %}[{{ m.content|trim }}]{% endfor %}");
  json spaced = json::array({{{"role", "assistant"}, {"content", "text  "}}});
  EXPECT_EQ(trimming.render(spaced, o), "[text");
  // A template that drops the message cannot be continued.
  auto dropping = ChatTemplate::from_string("nothing");
  EXPECT_THROW(dropping.render(chat, o), Error);
}

TEST(ChatTemplateRender, StrftimeNow) {
  auto ct = ChatTemplate::from_string("{{ strftime_now('%Y-%m-%d %H:%M') }}");
  ChatRenderOptions pinned;
  pinned.now = test::fixed_now();
  EXPECT_EQ(render(ct, pinned), "2025-07-04 15:30");
  std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  EXPECT_EQ(render(ct).substr(0, 4), std::to_string(local.tm_year + 1900));
}

TEST(ChatTemplateRender, KeyOrderOfToolsIsKept) {
  auto ct = ChatTemplate::from_string("{{ tools[0]|tojson }}");
  ChatRenderOptions o;
  o.tools = json::parse(
      R"([{"type": "function", "function": {"name": "z", "description": "d", "parameters": {}}}])");
  EXPECT_EQ(
      render(ct, o),
      R"({"type": "function", "function": {"name": "z", "description": "d", "parameters": {}}})");
}

TEST(ChatTemplateRender, ToolCallArgumentsBecomeDictsAsInVllm) {
  json messages = json::parse(R"([
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [true]}"}},
      {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
      {"id": "c", "type": "function", "function": {"name": "h"}},
      {"id": "d", "type": "function", "function": {"name": "k", "arguments": {"already": "dict"}}}]},
    {"role": "tool", "tool_call_id": "a", "content": "{\"not\": \"touched\"}"}])");
  tokenizer::tool_call_arguments_to_dicts(messages);
  const json& calls = messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"z":1,"a":[true]})");
  EXPECT_EQ(calls[1]["function"]["arguments"].dump(), "{}");
  EXPECT_EQ(calls[2]["function"]["arguments"].dump(), "{}");
  EXPECT_EQ(calls[3]["function"]["arguments"].dump(), R"({"already":"dict"})");
  EXPECT_TRUE(messages[2]["content"].is_string());
  json bad = json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])");
  EXPECT_THROW(tokenizer::tool_call_arguments_to_dicts(bad), Error);
}

}  // namespace
}  // namespace atom

namespace atom {
namespace {

// A checkpoint's template and a request's template (from_string) go through the same limits.
TEST(ChatTemplateLoader, LimitsApplyToCheckpointAndRequestTemplates) {
  std::string deep = "{{ 1";
  for (int i = 0; i < 299; ++i) deep += " + 1";
  deep += " }}";
  ModelDir d;
  d.write("chat_template.jinja", deep);
  auto from_dir = ChatTemplate::from_model_dir(d.path());
  EXPECT_NE(from_dir.parse_error().find("depth limit of 256"), std::string::npos)
      << from_dir.parse_error();
  EXPECT_THROW(render(from_dir), jinja::TemplateError);
  EXPECT_NE(ChatTemplate::from_string(deep).parse_error().find("depth limit of 256"),
            std::string::npos);
  jinja::Limits more;
  more.max_depth = 400;
  auto raised = ChatTemplate::from_model_dir(d.path(), "", more);
  EXPECT_EQ(raised.parse_error(), "");
  EXPECT_EQ(render(raised), "300");
  EXPECT_EQ(raised.limits().max_depth, 400);
  EXPECT_EQ(render(ChatTemplate::from_string(deep, json::object(), raised.limits())), "300");
  // Steps and output size too.
  jinja::Limits small;
  small.max_steps = 1000;
  small.max_output_bytes = 100;
  const std::string loop = "{% for i in range(100000) %}{% endfor %}";
  d.write("chat_template.jinja", loop);
  for (const auto& ct : {ChatTemplate::from_model_dir(d.path(), "", small),
                         ChatTemplate::from_string(loop, json::object(), small)}) {
    try {
      render(ct);
      ADD_FAILURE() << "expected an error";
    } catch (const jinja::TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find("more than 1000 steps"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(render(ChatTemplate::from_string("{{ 'x' * 200 }}", json::object(), small)),
               jinja::TemplateError);
}

}  // namespace
}  // namespace atom
