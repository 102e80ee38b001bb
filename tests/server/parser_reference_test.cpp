// The parsers against the models' own chat templates, rendered by Python's jinja2
// (parser_reference.py, run by the server_parser_reference fixture): each template's tool-call
// turn, cut where the model's output begins, must parse back into the calls it was rendered from
// (after the reasoning split the server applies first), whole and cut anywhere; and gpt-oss's
// prompt must carry the reasoning_effort a request gives, at the top level or in
// chat_template_kwargs, as jinja2 renders it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "server/parser_harness.h"
#include "server/protocol.h"
#include "server/reasoning.h"
#include "tokenizer/chat_template.h"

namespace atom::test {
namespace {

using ojson = nlohmann::ordered_json;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const ojson& cases() {
  static const ojson j = [] {
    const std::string path = std::string(ATOM_SERVER_PARSER_REF_DIR) + "/cases.json";
    const std::string text = read(path);
    if (text.empty()) {
      ADD_FAILURE() << path << " is missing: run `ctest -R server_parser_reference` (or "
                    << "/usr/bin/python3 tests/server/parser_reference.py . "
                    << "build/server_parser_reference)";
    }
    return text.empty() ? ojson::object() : ojson::parse(text);
  }();
  return j;
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

TEST(ParserReference, ToolCallTurnsOfTheChatTemplatesParseBack) {
  ASSERT_TRUE(cases().contains("tool_calls"));
  std::set<std::string> templates;
  for (const ojson& c : cases()["tool_calls"]) {
    const std::string parser = c["parser"].get<std::string>();
    SCOPED_TRACE(c["template"].get<std::string>() + " " + c["case"].get<std::string>() + ": " +
                 c["output"].get<std::string>());
    templates.insert(c["template"].get<std::string>());
    std::string text = c["output"].get<std::string>(), reasoning;
    if (c["reasoning_parser"].is_string()) {
      auto rp = server::make_reasoning_parser(c["reasoning_parser"].get<std::string>(),
                                              c["prompt"].get<std::string>(), ojson::object());
      ASSERT_NE(rp, nullptr);
      server::ReasoningDelta d = rp->feed(text);
      const server::ReasoningDelta rest = rp->finish();
      reasoning = d.reasoning + rest.reasoning;
      text = d.content + rest.content;
    }
    server::ToolParserOptions o;
    o.tools = c["tools"];
    const Parsed p = parse_every_way(parser, text, o, /*stream_is_final=*/parser != "openai");
    reasoning += p.reasoning;
    ASSERT_EQ(p.calls.size(), c["calls"].size());
    for (size_t i = 0; i < p.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].first, c["calls"][i]["name"].get<std::string>());
      EXPECT_EQ(p.calls[i].second, nlohmann::json::parse(c["calls"][i]["arguments"].dump()))
          << p.raw_arguments[i];
    }
    EXPECT_EQ(trimmed(p.content), c["content"].get<std::string>());
    EXPECT_EQ(trimmed(reasoning), c["reasoning"].get<std::string>());
  }
  EXPECT_EQ(templates.size(), 5u);
}

TEST(ParserReference, GptOssPromptsCarryTheRequestsReasoningEffort) {
  ASSERT_TRUE(cases().contains("reasoning_effort"));
  const std::string dir = std::string(ATOM_SOURCE_DIR) + "/tests/fixtures/chat_templates/";
  const ojson special = ojson::parse(read(dir + "special_tokens.json"))["gpt-oss"];
  const auto tpl = tokenizer::ChatTemplate::from_string(read(dir + "gpt-oss.jinja"), special);
  // hf_jinja.FIXED_NOW, the date both renderers give strftime_now().
  std::tm now{};
  now.tm_year = 2025 - 1900;
  now.tm_mon = 6;
  now.tm_mday = 4;
  now.tm_hour = 15;
  now.tm_min = 30;
  now.tm_sec = 5;
  now.tm_wday = 5;
  now.tm_yday = 184;
  size_t n = 0;
  for (const ojson& c : cases()["reasoning_effort"]) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const server::ChatRequest r = server::chat_request_parse(c["body"]);
    tokenizer::ChatRenderOptions o;
    o.add_generation_prompt = r.add_generation_prompt;
    o.kwargs = server::chat_template_variables(r, c["defaults"]);
    o.now = now;
    EXPECT_EQ(tpl.render(r.messages, o), c["prompt"].get<std::string>());
    ++n;
  }
  EXPECT_EQ(n, 7u);
}

}  // namespace
}  // namespace atom::test
