// Tool-call parsers (vLLM's hermes and llama3_json): whole outputs and the same outputs streamed
// split at every position and in random chunks give the same calls and content.
#include "server/tool_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace atom::test {
namespace {

using server::ToolCall;
using server::ToolDelta;
using json = nlohmann::json;

struct Parsed {
  std::string content;
  std::vector<std::pair<std::string, json>> calls;  // name, parsed arguments
  std::vector<std::string> raw_arguments;
};

Parsed collect(const std::vector<ToolDelta>& ds) {
  Parsed p;
  for (const auto& d : ds) {
    p.content += d.content;
    for (const ToolCall& c : d.calls) {
      EXPECT_EQ(c.id.rfind("chatcmpl-tool-", 0), 0u) << c.id;
      EXPECT_EQ(c.id.size(), std::string("chatcmpl-tool-").size() + 32) << c.id;
      p.calls.emplace_back(c.name, json::parse(c.arguments));
      p.raw_arguments.push_back(c.arguments);
    }
  }
  return p;
}

Parsed whole(const std::string& parser, const std::string& text) {
  return collect({server::make_tool_parser(parser)->parse(text)});
}

Parsed chunked(const std::string& parser, const std::vector<std::string>& pieces) {
  auto p = server::make_tool_parser(parser);
  std::vector<ToolDelta> ds;
  for (const auto& s : pieces) ds.push_back(p->feed(s));
  ds.push_back(p->finish());
  return collect(ds);
}

// The whole-text result, checked equal to every two-way split, a byte-by-byte feed and random
// chunkings (fixed seed).
Parsed parse_every_way(const std::string& parser, const std::string& text) {
  const Parsed w = whole(parser, text);
  auto same = [&](const Parsed& o, const std::string& how) {
    EXPECT_EQ(o.content, w.content) << how;
    EXPECT_EQ(o.calls, w.calls) << how;
    EXPECT_EQ(o.raw_arguments, w.raw_arguments) << how;
  };
  for (size_t i = 0; i <= text.size(); ++i)
    same(chunked(parser, {text.substr(0, i), text.substr(i)}), "split at " + std::to_string(i));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  same(chunked(parser, bytes), "byte by byte");
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 9)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    same(chunked(parser, pieces), "random round " + std::to_string(round));
  }
  return w;
}

TEST(HermesToolParser, OneCallIsParsedAndNotContent) {
  const Parsed p = parse_every_way("hermes",
                                   "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, json({{"city", "Paris"}}));
}

TEST(HermesToolParser, TextBeforeAndSeveralCalls) {
  const Parsed p = parse_every_way(
      "hermes",
      "Let me check both < cities.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
      "{\"x\": 1, \"nested\": {\"l\": [1, 2, {\"k\": \"}\"}]}}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n");
  EXPECT_EQ(p.content, "Let me check both < cities.\n\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "a");
  EXPECT_EQ(p.calls[0].second["nested"]["l"][2]["k"], "}");
  EXPECT_EQ(p.calls[1].first, "b");
  EXPECT_EQ(p.raw_arguments[1], "{}");
}

TEST(HermesToolParser, ArgumentsKeepTheModelsKeyOrderInPythonsJsonFormat) {
  const Parsed p = parse_every_way(
      "hermes",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"z\":1,\"a\":[1,2.5,true,null],"
      "\"m\":{\"y\":\"\",\"b\":-3}}}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"z": 1, "a": [1, 2.5, true, null], "m": {"y": "", "b": -3}})");
}

TEST(HermesToolParser, UnicodeArgumentsSurviveAsUtf8) {
  const Parsed p = parse_every_way("hermes",
                                   "<tool_call>\n{\"name\": \"translate\", \"arguments\": "
                                   "{\"text\": \"naïve café 東京 🌧\", \"esc\": "
                                   "\"\\u00e9\\n\"}}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second["text"], "naïve café 東京 🌧");
  EXPECT_EQ(p.calls[0].second["esc"], "é\n");
  // Python's json.dumps(arguments, ensure_ascii=False), as vLLM returns them.
  EXPECT_EQ(p.raw_arguments[0], R"({"text": "naïve café 東京 🌧", "esc": "é\n"})");
}

TEST(HermesToolParser, MalformedCallStaysContent) {
  const std::string bad =
      "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>";
  Parsed p = parse_every_way("hermes", bad);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, bad);
  // Valid JSON of the wrong shape (no name, arguments not an object) is no call either.
  for (const std::string& s :
       {std::string("<tool_call>{\"arguments\": {}}</tool_call>"),
        std::string("<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>"),
        std::string("<tool_call>[1, 2]</tool_call>")}) {
    p = parse_every_way("hermes", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
  // A malformed call beside a good one: the good one is a call, the bad one text.
  p = parse_every_way("hermes",
                      "<tool_call>{\"name\": \"ok\", \"arguments\": "
                      "{}}</tool_call>\n<tool_call>{oops}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "ok");
  EXPECT_EQ(p.content, "<tool_call>{oops}</tool_call>");
}

TEST(HermesToolParser, PartialTagAtTheEndIsReleased) {
  Parsed p = parse_every_way("hermes", "The tag is <tool_ca");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "The tag is <tool_ca");
  // Held back while it could be the tag, released once it is not.
  auto parser = server::make_tool_parser("hermes");
  EXPECT_EQ(parser->feed("a <tool").content, "a ");
  EXPECT_EQ(parser->feed("box> b").content, "<toolbox> b");
  EXPECT_EQ(parser->finish().content, "");
}

TEST(HermesToolParser, UnclosedCallIsACallWhenItsJsonIsComplete) {
  Parsed p =
      parse_every_way("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}\n");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  p = parse_every_way("hermes", "<tool_call>\n{\"name\": \"f\", \"argu");  // cut off by max_tokens
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(HermesToolParser, PlainAnswerIsContent) {
  const Parsed p = parse_every_way("hermes", "No tools needed: 2 < 3 and <b>bold</b>.");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "No tools needed: 2 < 3 and <b>bold</b>.");
}

TEST(HermesToolParser, TextAfterCallsIsContentWithoutTheSeparatingNewlines) {
  const Parsed p = parse_every_way(
      "hermes",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>\n\nDone.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, json({{"q", 1}}));  // arguments given as a JSON string
  EXPECT_EQ(p.content, "Done.");
}

TEST(Llama3JsonToolParser, OneCallWithParameters) {
  const Parsed p = parse_every_way(
      "llama3_json",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, json({{"city", "San Francisco, CA"}}));
}

TEST(Llama3JsonToolParser, PythonTagArgumentsAndSeveralCalls) {
  const Parsed p =
      parse_every_way("llama3_json",
                      "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"s\": \"x; {y}\"}}; "
                      "{\"name\": \"b\", \"parameters\": {\"n\": [1, {\"m\": null}]}}\n");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "a");
  EXPECT_EQ(p.calls[0].second["s"], "x; {y}");
  EXPECT_EQ(p.calls[1].first, "b");
  EXPECT_TRUE(p.calls[1].second["n"][1]["m"].is_null());
}

TEST(Llama3JsonToolParser, UnicodeArguments) {
  const Parsed p = parse_every_way(
      "llama3_json", "{\"name\": \"say\", \"parameters\": {\"t\": \"Grüße, 世界 \\\"q\\\"\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second["t"], "Grüße, 世界 \"q\"");
}

TEST(Llama3JsonToolParser, TextIsContent) {
  for (const std::string& s :
       {std::string("The weather is {probably} fine."), std::string("  leading spaces then text"),
        std::string("{\"answer\": 42}"),                             // JSON, but no call
        std::string("{\"name\": \"f\", \"parameters\": {\"x\": }"),  // malformed
        std::string("<|python_tag|>print(1)"), std::string("<|python_ta"),
        std::string("{\"name\": \"f\", \"parameters\": {\"x\": 1")}) {  // cut off
    const Parsed p = parse_every_way("llama3_json", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
}

TEST(Llama3JsonToolParser, TrailingTextAfterACallIsContent) {
  const Parsed p =
      parse_every_way("llama3_json", "{\"name\": \"f\", \"parameters\": {}}\n\nI called f.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "I called f.");
}

// DeepSeek-V3.1's markers, as its chat template writes them.
const std::string kCallsBegin = "<｜tool▁calls▁begin｜>", kCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>";
const std::string kSep = "<｜tool▁sep｜>";

TEST(DeepSeekV31ToolParser, TextThenSeveralCalls) {
  const Parsed p = parse_every_way(
      "deepseek_v31", "I'll look both up.\n" + kCallsBegin + kCallBegin + "get_weather" + kSep +
                          "{\"city\": \"東京\"}" + kCallEnd + "\n" + kCallBegin + "get_time" +
                          kSep + "{\"tz\": \"JST\", \"fmt\": {\"h\": 24}}" + kCallEnd + kCallsEnd);
  EXPECT_EQ(p.content, "I'll look both up.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, json({{"city", "東京"}}));
  EXPECT_EQ(p.calls[1].first, "get_time");
  EXPECT_EQ(p.calls[1].second["fmt"]["h"], 24);
}

TEST(DeepSeekV31ToolParser, MalformedAndPartialStayContent) {
  const std::string bad = kCallBegin + "f" + kSep + "{\"x\": }" + kCallEnd;
  Parsed p = parse_every_way("deepseek_v31", kCallsBegin + bad + kCallsEnd);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, bad);
  p = parse_every_way("deepseek_v31",
                      kCallsBegin + kCallBegin + "no separator" + kCallEnd + kCallsEnd);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, kCallBegin + "no separator" + kCallEnd);
  // A partial marker at the end is released as text.
  const std::string cut = "answer " + kCallsBegin.substr(0, 7);
  p = parse_every_way("deepseek_v31", cut);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, cut);
  // Unclosed at the end: a call when its JSON is complete, text otherwise.
  p = parse_every_way("deepseek_v31", kCallsBegin + kCallBegin + "f" + kSep + "{\"a\": 1}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  p = parse_every_way("deepseek_v31", kCallsBegin + kCallBegin + "f" + kSep + "{\"a\": ");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, kCallBegin + "f" + kSep + "{\"a\": ");
  // A section that holds no call is text; a real section after it still parses.
  p = parse_every_way("deepseek_v31", kCallsBegin + "oops " + kCallsBegin + kCallBegin + "g" +
                                          kSep + "{}" + kCallEnd + kCallsEnd + "\n\nafter");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "g");
  EXPECT_EQ(p.content, "oops after");
}

TEST(ToolParsers, NamesAreVllms) {
  EXPECT_TRUE(server::tool_parser_known("hermes"));
  EXPECT_TRUE(server::tool_parser_known("llama3_json"));
  EXPECT_TRUE(server::tool_parser_known("deepseek_v31"));
  EXPECT_FALSE(server::tool_parser_known("nope"));
  EXPECT_TRUE(server::tool_parser_keeps_special_tokens("hermes"));
  EXPECT_FALSE(server::tool_parser_keeps_special_tokens("llama3_json"));
  try {
    server::make_tool_parser("nope");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hermes, llama3_json, deepseek_v31"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(server::tool_call_id(), server::tool_call_id());
}

}  // namespace
}  // namespace atom::test
