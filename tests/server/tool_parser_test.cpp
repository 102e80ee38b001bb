// Tool-call parsers against the formats the models write (from their chat templates and vLLM's
// parser tests): whole outputs and the same outputs streamed split at every position, byte by
// byte and in random chunks give the same calls and content (tests/server/parser_harness.h).
#include "server/tool_parser.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "server/parser_harness.h"

namespace atom::test {
namespace {

using server::ToolDelta;
using json = nlohmann::json;

TEST(HermesToolParser, OneCallIsParsedAndNotContent) {
  const Parsed p =
      parse_every_way("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                "{\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, json({{"city", "Paris"}}));
}

TEST(HermesToolParser, TextBeforeAndSeveralCalls) {
  const Parsed p = parse_every_way(
      "hermes", "Let me check both < cities.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
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
      "hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"z\":1,\"a\":[1,2.5,true,null],"
                "\"m\":{\"y\":\"\",\"b\":-3}}}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"z": 1, "a": [1, 2.5, true, null], "m": {"y": "", "b": -3}})");
}

TEST(HermesToolParser, UnicodeArgumentsSurviveAsUtf8) {
  const Parsed p =
      parse_every_way("hermes", "<tool_call>\n{\"name\": \"translate\", \"arguments\": "
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
  p = parse_every_way("hermes", "<tool_call>{\"name\": \"ok\", \"arguments\": "
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
  const Parsed p = parse_every_way(
      "llama3_json", "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"s\": \"x; {y}\"}}; "
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
    EXPECT_NE(std::string(e.what()).find(
                  "hermes, llama3_json, deepseek_v3, deepseek_v31, qwen3_coder, glm45, "
                  "kimi_k2, mistral, pythonic, openai"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(server::tool_call_id(), server::tool_call_id());
}

// ---------------------------------------------------------------------------- qwen3_coder
// Outputs from vLLM's tests/tool_parsers/test_qwen3coder_tool_parser.py (Qwen3-Coder's format:
// one parameter a tag, one newline inside each side of a value).

const char* kWeatherAndAreaTools = R"([
  {"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "state": {"type": "string"},
    "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}}, "required": ["city", "state"]}}},
  {"type": "function", "function": {"name": "calculate_area", "parameters": {
    "type": "object", "properties": {"shape": {"type": "string"}, "dimensions": {"type": "object"},
    "precision": {"type": "integer"}}}}}])";

const std::string kDallas =
    "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(Qwen3CoderToolParser, OneCallWithoutAndWithContentBefore) {
  const auto tools = with_tools(kWeatherAndAreaTools);
  Parsed p = parse_every_way("qwen3_coder", kDallas, tools);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_current_weather");
  // json.dumps(arguments, ensure_ascii=False), as vLLM writes them.
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "Dallas", "state": "TX", "unit": "fahrenheit"})");
  p = parse_every_way("qwen3_coder", "Sure! Let me check the weather for you." + kDallas, tools);
  EXPECT_EQ(p.content, "Sure! Let me check the weather for you.");
  ASSERT_EQ(p.calls.size(), 1u);
}

TEST(Qwen3CoderToolParser, TypedMultilineAndParallelCalls) {
  const auto tools = with_tools(kWeatherAndAreaTools);
  Parsed p = parse_every_way(
      "qwen3_coder",
      "<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n"
      "<parameter=dimensions>\n{\"width\": 10, \n \"height\": 20}\n</parameter>\n"
      "<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>",
      tools);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0],
            R"({"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})");
  const std::string orlando =
      "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nOrlando\n</parameter>\n"
      "<parameter=state>\nFL\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
      "</function>\n</tool_call>";
  p = parse_every_way("qwen3_coder", kDallas + "\n" + orlando, tools);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].second["city"], "Orlando");
  EXPECT_EQ(p.content, "");
}

TEST(Qwen3CoderToolParser, ValuesTakeTheirSchemaTypes) {
  // vLLM's test_extract_tool_calls_type_conversion and its anyOf / nullable cases; values as the
  // Qwen3-Coder template writes them (`| string` gives Python's True and None).
  const auto tools = with_tools(R"([{"type": "function", "function": {"name": "test_types",
      "parameters": {"type": "object", "properties": {
        "int_param": {"type": "integer"}, "float_param": {"type": "float"},
        "whole_number": {"type": "number"}, "bool_param": {"type": "boolean"},
        "py_bool": {"type": "boolean"}, "str_param": {"type": "string"},
        "obj_param": {"type": "object"}, "py_obj": {"type": "object"},
        "anyof_int": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "anyof_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "type_list": {"type": ["integer", "null"]}, "str_null": {"type": "string"},
        "none_int": {"type": "integer"}, "bad_int": {"type": "integer"},
        "list_param": {"type": "array"}}}}}])");
  const Parsed p = parse_every_way(
      "qwen3_coder",
      "<tool_call>\n<function=test_types>\n"
      "<parameter=int_param>\n42\n</parameter>\n<parameter=float_param>\n3.14\n</parameter>\n"
      "<parameter=whole_number>\n3.0\n</parameter>\n<parameter=bool_param>\ntrue\n</parameter>\n"
      "<parameter=py_bool>\nTrue\n</parameter>\n<parameter=str_param>\nhello world\n</parameter>\n"
      "<parameter=obj_param>\n{\"key\": \"value\"}\n</parameter>\n"
      "<parameter=py_obj>\n{'k': [1, (2, 3)], 'n': None}\n</parameter>\n"
      "<parameter=anyof_int>\n5\n</parameter>\n<parameter=anyof_str>\nnull\n</parameter>\n"
      "<parameter=type_list>\n7\n</parameter>\n<parameter=str_null>\nnull\n</parameter>\n"
      "<parameter=none_int>\nNone\n</parameter>\n<parameter=bad_int>\nmany\n</parameter>\n"
      "<parameter=list_param>\n[1, "
      "\"two\"]\n</parameter>\n<parameter=undeclared>\n12\n</parameter>\n"
      "</function>\n</tool_call>",
      tools);
  ASSERT_EQ(p.calls.size(), 1u);
  const json& a = p.calls[0].second;
  EXPECT_EQ(a["int_param"], 42);
  EXPECT_EQ(a["float_param"], 3.14);
  EXPECT_EQ(a["whole_number"], 3);
  EXPECT_TRUE(a["whole_number"].is_number_integer());  // vLLM writes an integral number as an int
  EXPECT_EQ(a["bool_param"], true);
  EXPECT_EQ(a["py_bool"], true);
  EXPECT_EQ(a["str_param"], "hello world");
  EXPECT_EQ(a["obj_param"], json({{"key", "value"}}));
  EXPECT_EQ(a["py_obj"], json::parse(R"({"k": [1, [2, 3]], "n": null})"));
  EXPECT_EQ(a["anyof_int"], 5);
  EXPECT_TRUE(a["anyof_str"].is_null());
  EXPECT_EQ(a["type_list"], 7);
  EXPECT_EQ(a["str_null"], "null");  // a plain string keeps the word
  EXPECT_TRUE(a["none_int"].is_null());
  EXPECT_EQ(a["bad_int"], "many");  // not an integer: the text
  EXPECT_EQ(a["list_param"], json::parse(R"([1, "two"])"));
  EXPECT_EQ(a["undeclared"], "12");  // not in the schema: the text
}

TEST(Qwen3CoderToolParser, WithoutToolsEveryValueIsText) {
  const Parsed p = parse_every_way(
      "qwen3_coder",
      "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n<parameter=text>\nline 1\n"
      "line 2 < 3 & \"quoted\" 東京\n</parameter>\n</function>\n</tool_call>\n\nDone.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"n": "5", "text": "line 1\nline 2 < 3 & \"quoted\" 東京"})");
  EXPECT_EQ(p.content, "Done.");
}

TEST(Qwen3CoderToolParser, MalformedStaysContentAndCutOffCallsClose) {
  for (const std::string& s :
       {std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>\n<function=bad name\nmore</function></tool_call>"),
        std::string("<tool_call>\n<function=>\n</function>\n</tool_call>"),
        std::string("a <tool_call"), std::string("plain <b>text</b> < 3")}) {
    const Parsed p = parse_every_way("qwen3_coder", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
  // Cut off by max_tokens inside a value: the call closes with what arrived.
  Parsed p = parse_every_way("qwen3_coder",
                             "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDal",
                             with_tools(kWeatherAndAreaTools));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "Dal"})");
  // A missing </parameter>: the value ends before the closing tags the model wrote.
  p = parse_every_way("qwen3_coder",
                      "<tool_call>\n<function=f>\n<parameter=x>\nabc\n</function>\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"x": "abc"})");
  p = parse_every_way("qwen3_coder", "<tool_call>\n<function=noargs>\n</function>\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], "{}");
}

TEST(Qwen3CoderToolParser, ArgumentsStreamOneParameterAtATime) {
  auto parser = server::make_tool_parser("qwen3_coder");
  ToolDelta d = parser->feed("<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDal");
  ASSERT_EQ(d.deltas.size(), 1u);  // the call's name
  EXPECT_EQ(d.deltas[0].name, "get_current_weather");
  d = parser->feed("las\n</parameter>\n<parameter=state>\nTX\n</param");
  ASSERT_EQ(d.deltas.size(), 1u);
  EXPECT_EQ(d.deltas[0].arguments, R"({"city": "Dallas")");
  d = parser->feed("eter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.deltas.size(), 1u);
  EXPECT_EQ(d.deltas[0].arguments, R"(, "state": "TX"})");
  ASSERT_EQ(d.calls.size(), 1u);
}

// --------------------------------------------------------------------------------- glm45
// The format GLM-4.6's chat template writes calls in (tests/fixtures/chat_templates/
// glm-4.6.jinja: the name after <tool_call>, then a key/value pair per argument, string values
// as written and others as JSON) and vLLM's tests/tool_parsers/test_glm4_moe_tool_parser.py.

const char* kGlmTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
    "days": {"type": "integer"}, "note": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "search_docs", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "array"},
    "limit": {"type": "number"}, "exact": {"type": "boolean"}}}}}])";

TEST(Glm45ToolParser, CallsAsTheTemplateWritesThem) {
  const auto tools = with_tools(kGlmTools);
  const Parsed p = parse_every_way(
      "glm45",
      "Let me "
      "look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>search_docs\n"
      "<arg_key>query</arg_key>\n<arg_value>chat "
      "templates</arg_value>\n<arg_key>filters</arg_key>\n"
      "<arg_value>[\"jinja\", "
      "\"hf\"]</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>3</arg_value>"
      "\n<arg_key>exact</arg_key>\n<arg_value>false</arg_value>\n</tool_call>",
      tools);
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "Paris", "days": 2})");
  EXPECT_EQ(p.calls[1].second,
            json::parse(R"({"query": "chat templates", "filters": ["jinja", "hf"], "limit": 3,
                "exact": false})"));
}

TEST(Glm45ToolParser, StringValuesStayTextOthersAreJsonOrPythonOrText) {
  const auto tools = with_tools(kGlmTools);
  const Parsed p = parse_every_way(
      "glm45",
      "<tool_call>get_weather\n<arg_key>note</arg_key>\n<arg_value> {\"a\": 1}\n\"quoted\" \\ "
      "tab\t</arg_value>\n<arg_key>days</arg_key>\n<arg_value> 4 </arg_value>\n"
      "<arg_key>extra</arg_key>\n<arg_value>{'py': True, 'n': None}</arg_value>\n"
      "<arg_key>word</arg_key>\n<arg_value> hello </arg_value>\n</tool_call>",
      tools);
  ASSERT_EQ(p.calls.size(), 1u);
  const json& a = p.calls[0].second;
  EXPECT_EQ(a["note"], " {\"a\": 1}\n\"quoted\" \\ tab\t");  // as written, not trimmed
  EXPECT_EQ(a["days"], 4);
  EXPECT_EQ(a["extra"], json::parse(R"({"py": true, "n": null})"));
  EXPECT_EQ(a["word"], "hello");
  EXPECT_EQ(
      p.raw_arguments[0],
      R"({"note": " {\"a\": 1}\n\"quoted\" \\ tab\t", "days": 4, "extra": {"py": true, "n": null}, "word": "hello"})");
}

TEST(Glm45ToolParser, NoArgumentsMalformedAndStreaming) {
  Parsed p = parse_every_way("glm45", "<tool_call>get_time\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], "{}");
  for (const std::string& s :
       {std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call></tool_call>"), std::string("no calls <tool_cal")}) {
    p = parse_every_way("glm45", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
  // Cut off inside a string value: the call closes with the text so far.
  p = parse_every_way("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
                      with_tools(kGlmTools));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "Par"})");
  // A string value streams as it arrives (vLLM's incremental string streaming).
  auto parser = server::make_tool_parser("glm45", with_tools(kGlmTools));
  ToolDelta d = parser->feed("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa");
  ASSERT_EQ(d.deltas.size(), 2u);
  EXPECT_EQ(d.deltas[1].arguments, R"({"city": "Pa)");
  d = parser->feed("ris</arg_value>\n</tool_call>");
  ASSERT_FALSE(d.deltas.empty());
  EXPECT_EQ(d.deltas[0].arguments, R"(ris"})");
}

// ------------------------------------------------------------------------------- kimi_k2
// Outputs from vLLM's tests/tool_parsers/test_kimi_k2_tool_parser.py.

const std::string kSectionBegin = "<|tool_calls_section_begin|>",
                  kSectionEnd = "<|tool_calls_section_end|>", kToolBegin = "<|tool_call_begin|>",
                  kToolEnd = "<|tool_call_end|>", kArgBegin = "<|tool_call_argument_begin|>";
std::string kimi_tool(const std::string& id, const std::string& args) {
  return kToolBegin + id + " " + kArgBegin + args + kToolEnd;
}

TEST(KimiK2ToolParser, CallsKeepTheModelsIdsAndArguments) {
  Parsed p = parse_every_way(
      "kimi_k2",
      "Multiple tasks. " + kSectionBegin +
          kimi_tool("functions.get_weather:0", "{\"city\": \"New York\"}") +
          kimi_tool("functions.process_html:1", "{\"html\": \"<div>content</div>\"}") +
          kimi_tool("functions.process_data:2", "{\n  \"name\": \"test\",\n  \"value\": 123\n}") +
          kimi_tool("get_news:3", "{}") + kSectionEnd);
  EXPECT_EQ(p.content, "Multiple tasks. ");
  ASSERT_EQ(p.calls.size(), 4u);
  EXPECT_EQ(p.ids[0], "functions.get_weather:0");
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[1].second["html"], "<div>content</div>");
  EXPECT_EQ(p.raw_arguments[2], "{\n  \"name\": \"test\",\n  \"value\": 123\n}");  // as written
  EXPECT_EQ(p.ids[3], "get_news:3");
  EXPECT_EQ(p.calls[3].first, "get_news");
}

TEST(KimiK2ToolParser, BadJsonIsStillACallABadIdIsContent) {
  // vLLM: "Tool calls with invalid JSON are still returned (arguments as-is)".
  Parsed p = parse_every_way(
      "kimi_k2", "Help. " + kSectionBegin + kimi_tool("functions.bad:0", "{\"city\": \"Beijing\"") +
                     kimi_tool("functions.good:1", "{\"city\": \"Shanghai\"}") + kSectionEnd);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.raw_arguments[0], "{\"city\": \"Beijing\"");
  EXPECT_TRUE(p.calls[0].second.is_null());
  // An id without ":<index>" is no call (vLLM skips it); its text stays content here.
  const std::string bad = kimi_tool("functions.invalid.0", "{\"city\": \"Beijing\"}");
  p = parse_every_way("kimi_k2", "Help. " + kSectionBegin + bad +
                                     kimi_tool("functions.valid:1", "{\"city\": \"Shanghai\"}") +
                                     kSectionEnd);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "valid");
  EXPECT_EQ(p.content, "Help. " + bad);
  // Cut off in the arguments: the call closes with what arrived.
  p = parse_every_way("kimi_k2",
                      kSectionBegin + kToolBegin + "functions.f:0 " + kArgBegin + "{\"a\": ");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], "{\"a\":");
  p = parse_every_way("kimi_k2", "plain text <|tool_calls_sec");
  EXPECT_EQ(p.content, "plain text <|tool_calls_sec");
}

// --------------------------------------------------------------------------- deepseek_v3
// The format of vLLM's DeepSeekV3ToolParser docstring (DeepSeek-V3-0324 and R1).

TEST(DeepSeekV3ToolParser, FencedCalls) {
  const Parsed p = parse_every_way(
      "deepseek_v3",
      "Checking both.\n" + kCallsBegin + kCallBegin + "function" + kSep +
          "get_current_weather\n```json\n{\"location\": \"Beijing\"}\n```" + kCallEnd + "\n" +
          kCallBegin + "function" + kSep +
          "get_current_weather\n```json\n{\"location\": \"上海\", \"n\": [1, 2]}\n```" + kCallEnd +
          kCallsEnd);
  EXPECT_EQ(p.content, "Checking both.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "get_current_weather");
  EXPECT_EQ(p.raw_arguments[0], "{\"location\": \"Beijing\"}");
  EXPECT_EQ(p.calls[1].second["location"], "上海");
}

TEST(DeepSeekV3ToolParser, MalformedStaysContent) {
  // V3.1's format (no type, no fence) is no V3 call.
  const std::string v31 = kCallBegin + "get_weather" + kSep + "{\"city\": \"Rome\"}" + kCallEnd;
  Parsed p = parse_every_way("deepseek_v3", kCallsBegin + v31 + kCallsEnd);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, v31);
  // Pretty-printed arguments are fine: only "\n```" ends them.
  p = parse_every_way("deepseek_v3", kCallsBegin + kCallBegin + "function" + kSep +
                                         "f\n```json\n{\n  \"a\": 1\n}\n```" + kCallEnd +
                                         kCallsEnd);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, json({{"a", 1}}));
}

// ------------------------------------------------------------------------------- mistral
// Mistral Nemo's template writes [TOOL_CALLS][{"name", "arguments", "id"}] (tests/fixtures/
// chat_templates/mistral-nemo.jinja); v11+ tokenizers write [TOOL_CALLS]NAME{...} and v13
// NAME[ARGS]{...} (vLLM's MistralToolParser).

TEST(MistralToolParser, JsonArrayOfOlderTokenizers) {
  const Parsed p = parse_every_way(
      "mistral",
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}, \"id\": \"abcDEF123\"}, {\"name\": \"search_docs\", \"arguments\": "
      "{\"query\": \"東京\"}}]");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "Paris", "unit": "celsius"})");
  EXPECT_EQ(p.raw_arguments[1], R"({"query": "東京"})");
  const std::string bad = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": 3}]";
  const Parsed q = parse_every_way("mistral", "Sure. " + bad);
  EXPECT_TRUE(q.calls.empty());
  EXPECT_EQ(q.content, "Sure. " + bad);
}

TEST(MistralToolParser, NameThenArgumentsOfNewerTokenizers) {
  Parsed p = parse_every_way(
      "mistral", "Let me check. [TOOL_CALLS]get_weather{\"city\": \"Paris\"}[TOOL_CALLS]"
                 "add{\"a\": 3.5, \"b\": {\"c\": \"}\"}}");
  EXPECT_EQ(p.content, "Let me check. ");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.raw_arguments[0], "{\"city\": \"Paris\"}");
  EXPECT_EQ(p.raw_arguments[1], "{\"a\": 3.5, \"b\": {\"c\": \"}\"}}");
  p = parse_every_way("mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}\n\nDone.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.content, "Done.");
  for (const std::string& s :
       {std::string("[TOOL_CALLS]not a name {\"a\": 1}"), std::string("plain [TOOL_CAL")}) {
    p = parse_every_way("mistral", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
}

// ------------------------------------------------------------------------------ pythonic
// Outputs from vLLM's tests/tool_parsers/test_pythonic_tool_parser.py.

TEST(PythonicToolParser, ListsOfCallsWithLiteralArguments) {
  Parsed p =
      parse_every_way("pythonic", "[get_weather(city='San Francisco', metric='celsius'), "
                                  "register_user(name='John Doe', age=37, address={'city': 'San "
                                  "Francisco', 'state': 'CA'}, role=None, passed_test=True, "
                                  "aliases=['John', 'Johnny'])]");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.raw_arguments[0], R"({"city": "San Francisco", "metric": "celsius"})");
  EXPECT_EQ(
      p.raw_arguments[1],
      R"({"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, "role": null, "passed_test": true, "aliases": ["John", "Johnny"]})");
  p = parse_every_way(
      "pythonic",
      "[f(s=\"double \\\"q\\\" \\u00e9\\n\", t=\'\'\'tri\'ple\'\'\', x=-1.5e3, e={}, l=[])]");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, json::parse(R"({"s": "double \"q\" é\n", "t": "tri'ple",
      "x": -1500.0, "e": {}, "l": []})"));
  p = parse_every_way("pythonic", "[get_time()]");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], "{}");
}

TEST(PythonicToolParser, AnythingElseIsContent) {
  for (const std::string& s :
       {std::string("The answer is [1, 2]."), std::string("[1, 2]"), std::string("[]"),
        std::string("[get_weather(city)]"), std::string("[get_weather(city=city_name)]"),
        std::string("[f(x=1, x=2)]"), std::string(" [f(x=1)]"), std::string("[f(x=print(1))]"),
        std::string("[a.b(x=1)]")}) {
    const Parsed p = parse_every_way("pythonic", s);
    EXPECT_TRUE(p.calls.empty()) << s;
    EXPECT_EQ(p.content, s);
  }
  // A list cut off after a whole call: the call was streamed when its ")" arrived, and stands.
  const Parsed p = parse_every_way("pythonic", "[f(x=1), g(y=");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "f");
  EXPECT_EQ(p.content, ", g(y=");  // the unfinished rest, as written
}

// ----------------------------------------------------------------------- hostile output

TEST(ToolParsers, DeeplyNestedOrHugeArgumentsNeitherCrashNorHang) {
  const std::string deep(100000, '[');
  const std::string deep_closed = std::string(2000, '[') + std::string(2000, ']');
  const std::vector<std::pair<std::string, std::string>> outputs = {
      {"hermes",
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep_closed + "}}</tool_call>"},
      {"hermes",
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 18446744073709551615}}</tool_call>"},
      {"llama3_json", "{\"name\": \"f\", \"parameters\": {\"a\": " + deep_closed + "}}"},
      {"openai", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" + deep_closed},
      {"openai", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" + deep},
      {"qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n" + deep_closed +
                          "\n</parameter>\n</function>\n</tool_call>"},
      {"glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>" + deep_closed +
                    "</arg_value>\n</tool_call>"},
      {"glm45",
       "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>" + deep + "</arg_value>\n</tool_call>"},
      {"mistral", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": " + deep_closed + "}}]"},
      {"mistral", "[TOOL_CALLS]f" + std::string(100000, '{')},
      {"pythonic", "[f(a=" + deep_closed + ")]"},
      {"pythonic", "[f(a=" + deep},
      {"deepseek_v31", kCallsBegin + kCallBegin + "f" + kSep + deep_closed + kCallEnd + kCallsEnd},
      // Long unclosed calls and runs of whitespace, scanned once however they arrive.
      {"hermes",
       "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"" + std::string(400000, 'x')},
      {"deepseek_v31", kCallsBegin + kCallBegin + "f" + kSep + std::string(400000, 'x')},
      {"kimi_k2", kSectionBegin + kToolBegin + std::string(400000, 'x')},
      {"kimi_k2", kSectionBegin + std::string(400000, ' ')},
      {"qwen3_coder", "<tool_call>" + std::string(400000, '\n')},
      {"qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n" + std::string(400000, 'x')},
      {"deepseek_v3", kCallsBegin + kCallBegin + std::string(400000, 'x')},
  };
  for (const auto& [parser, text] : outputs) {
    SCOPED_TRACE(parser + ": " + text.substr(0, 80));
    const auto tools = with_tools(R"([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}])");
    const Parsed w = parse_whole(parser, text, tools);
    for (const size_t cut : {size_t{1}, text.size() / 2, text.size() - 1})
      expect_same(parse_pieces(parser, {text.substr(0, cut), text.substr(cut)}, tools), w,
                  "split at " + std::to_string(cut), false);
    // Streamed in token-sized pieces, long hostile output takes time linear in its length.
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += 4) pieces.push_back(text.substr(i, 4));
    const auto t0 = std::chrono::steady_clock::now();
    expect_same(parse_pieces(parser, pieces, tools), w, "in 4-byte pieces", false);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    // Whatever they became, calls' arguments are text a client can take (JSON when they parse).
    for (const auto& a : w.raw_arguments) EXPECT_FALSE(a.empty() && parser != "openai");
  }
}

}  // namespace
}  // namespace atom::test
