// Python literals as ast.literal_eval reads them (the expected values are Python's: what
// `json.dumps(ast.literal_eval(text))` prints), and keyword calls as the pythonic tool format
// writes them.
#include "server/py_literal.h"

#include <gtest/gtest.h>

#include "server/tool_parser_util.h"

namespace atom::test {
namespace {

std::string dumps(const std::string& text) {
  const auto v = server::py_literal_eval(text);
  return v ? server::parse_util::py_json_dumps(*v, false) : "<refused>";
}

TEST(PyLiteral, ValuesAsPythonReadsThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1", "1"},
      {" -7 ", "-7"},
      {"+3", "3"},
      {"1_000", "1000"},
      {"0x1F", "31"},
      {"0o17", "15"},
      {"0b101", "5"},
      {"0", "0"},
      {"1.5", "1.5"},
      {".5", "0.5"},
      {"5.", "5.0"},
      {"1e3", "1000.0"},
      {"-2.5E-3", "-0.0025"},
      {"True", "true"},
      {"None", "null"},
      {"'single'", "\"single\""},
      {"\"double\"", "\"double\""},
      {"'a' \"b\"", "\"ab\""},
      {"'''tri\nple'''", "\"tri\\nple\""},
      {"'\\n\\t\\\\\\'\\x41\\u00e9\\U0001F600\\101'", "\"\\n\\t\\\\'Aé😀A\""},
      {"r'\\n\\''", "\"\\\\n\\\\'\""},
      {"u'x'", "\"x\""},
      {"'\\q'", "\"\\\\q\""},
      {"[1, 'two', [3.0], {}]", "[1, \"two\", [3.0], {}]"},
      {"(1, 2)", "[1, 2]"},
      {"(1,)", "[1]"},
      {"()", "[]"},
      {"(5)", "5"},
      {"[1, 2,]", "[1, 2]"},
      {"{'a': 1, 2: 'b', True: None, None: False}",
       "{\"a\": 1, \"2\": \"b\", \"true\": null, \"null\": false}"},
      {"{'k': 1, 'k': 2}", "{\"k\": 2}"},
      {"[\n  1,  # one\n  2\n]", "[1, 2]"},
      {"'日本'", "\"日本\""},
  };
  for (const auto& [text, expected] : cases) EXPECT_EQ(dumps(text), expected) << text;
}

TEST(PyLiteral, WhatLiteralEvalRefusesIsRefused) {
  for (const char* s : {"",       "x",        "1 + 2",
                        "1j",     "{1, 2}",   "b'bytes'",
                        "f'{x}'", "print(1)", "'unterminated",
                        "'a\nb'", "[1, 2",    "007",
                        "1__0",   "1_",       "--1",
                        "-'a'",   "{[1]: 2}", "True False",
                        "0x",     "1abc",     "nan"})
    EXPECT_FALSE(server::py_literal_eval(s).has_value()) << s;
  // Python reads these, atom refuses them: integers beyond 64 bits, infinity (json.dumps would
  // write Infinity, which is no JSON), \N{NAME} (needs Unicode's name table), lone surrogates
  // (no UTF-8), float keys.
  for (const char* s : {"99999999999999999999", "1e999", "'\\N{BULLET}'", "'\\ud800'", "{1.5: 2}"})
    EXPECT_FALSE(server::py_literal_eval(s).has_value()) << s;
  // Deep nesting is refused, not recursed into.
  EXPECT_FALSE(server::py_literal_eval(std::string(10000, '[')).has_value());
  EXPECT_FALSE(
      server::py_literal_eval(std::string(5000, '[') + std::string(5000, ']')).has_value());
}

TEST(PyLiteral, KeywordCalls) {
  auto c = server::py_parse_call("get_weather(city='Paris', days=2, opts={'u': [1]})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->name, "get_weather");
  EXPECT_EQ(server::parse_util::py_json_dumps(c->arguments, false),
            R"({"city": "Paris", "days": 2, "opts": {"u": [1]}})");
  c = server::py_parse_call(" f ( ) ");
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->arguments.empty());
  for (const char* s : {"f(1)", "f(x)", "f(x=y)", "f(x=1, x=2)", "a.b(x=1)", "f(x==1)", "f(x=1",
                        "f(x=1) g", "(x=1)", "f(True=1)"})
    EXPECT_FALSE(server::py_parse_call(s).has_value()) << s;
}

TEST(PyLiteral, ScanningToTheClosingBracket) {
  EXPECT_EQ(server::py_scan_bracket("(a=')', b=\"(\")rest"), 14u);
  EXPECT_EQ(server::py_scan_bracket("(a='''x)''')"), 12u);
  EXPECT_EQ(server::py_scan_bracket("(a=[1, (2)])"), 12u);
  EXPECT_EQ(server::py_scan_bracket("(a='it\\'s')"), 11u);
  EXPECT_EQ(server::py_scan_bracket("(a='"), std::string::npos);
  EXPECT_EQ(server::py_scan_bracket("(a=''"), std::string::npos);
  EXPECT_EQ(server::py_scan_bracket("(a=[1)"), server::kPyScanError);
  EXPECT_EQ(server::py_scan_bracket("x(a)"), server::kPyScanError);
}

}  // namespace
}  // namespace atom::test
