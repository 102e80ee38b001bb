// The grammar engine against independent references: std::regex for regular expressions,
// JSON Schema semantics written out by hand (valid and invalid documents per schema), and a
// brute-force per-token check for the trie masks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <regex>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/reasoning_gate.h"

namespace atom::grammar {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& gbnf) {
  return std::make_shared<const Grammar>(Grammar::from_gbnf(gbnf));
}

// Whether the whole string is a sentence of the grammar.
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  Matcher m(g);
  return m.accept_bytes(s) && m.accepting();
}

TEST(Gbnf, SentencesAndNonSentences) {
  auto g = compile(R"(
root ::= greeting ( ", " name )* "!"   # a comment
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]{1,5}
)");
  for (const char* s : {"hi!", "hello, Ann!", "hi, Bo, Carlos!"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"", "hi", "hey!", "hi, ann!", "hi, Abcdefg!", "hello,Ann!", "hi!!"})
    EXPECT_FALSE(matches(g, s)) << s;
  // Prefixes are live, non-prefixes are refused at the first wrong byte.
  Matcher m(g);
  EXPECT_TRUE(m.accept_bytes("hello, A"));
  EXPECT_FALSE(m.accepting());
  EXPECT_FALSE(m.accept_bytes("A"));  // a second capital
  EXPECT_TRUE(m.accept_bytes("nn!"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.must_end());
}

TEST(Gbnf, ClassesEscapesAndUtf8) {
  auto g = compile(R"(root ::= [^"\\\n]* "\"" [\u00e9-\u00ea] "\x41" . )");
  EXPECT_TRUE(matches(g, "ab\"\xC3\xA9"
                         "AZ"));
  EXPECT_TRUE(matches(g, "\"\xC3\xAA"
                         "A\xE2\x82\xAC"));  // . takes a 3-byte character
  EXPECT_FALSE(matches(g, "a\nb\"\xC3\xA9"
                          "AZ"));
  EXPECT_FALSE(matches(g, "\"\xC3\xA8"
                          "AZ"));  // è is outside [é-ê]
  // A character is checked while its bytes arrive: the lead byte of è's range passes (é starts
  // with 0xC3 too), the continuation byte decides.
  Matcher m(g);
  EXPECT_TRUE(m.accept_bytes("\"\xC3"));
  EXPECT_FALSE(m.accept_byte(0xA8));
  EXPECT_TRUE(m.accept_byte(0xA9));
  // Not UTF-8: an overlong form, a surrogate, a code point past U+10FFFF, a stray continuation.
  auto any = compile("root ::= .*\n");
  for (const char* bad :
       {"\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80"})
    EXPECT_FALSE(matches(any, bad)) << "bytes of length " << std::strlen(bad);
  EXPECT_TRUE(matches(any, "\xF4\x8F\xBF\xBF\xED\x9F\xBF"));  // U+10FFFF, U+D7FF
  // A lead byte no class can continue is refused at once: [é-ê] has no 4-byte characters.
  Matcher m2(g);
  EXPECT_TRUE(m2.accept_bytes("\""));
  EXPECT_FALSE(m2.accept_byte(0xF0));
}

TEST(Gbnf, RepetitionBounds) {
  auto g = compile("root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,}\n");
  EXPECT_TRUE(matches(g, "aabbbc"));
  EXPECT_TRUE(matches(g, "aaaabbbccc"));
  EXPECT_FALSE(matches(g, "abbbc"));
  EXPECT_FALSE(matches(g, "aaaaabbbc"));
  EXPECT_FALSE(matches(g, "aabbc"));
  EXPECT_FALSE(matches(g, "aabbb"));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  auto err = [](const std::string& gbnf, const GrammarLimits& lim = {}) {
    try {
      Grammar::from_gbnf(gbnf, lim);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n")
                .find("rule 'expr' is left-recursive"),
            std::string::npos);
  EXPECT_NE(err("root ::= a? root \"x\"\na ::= \"y\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(err("root ::= missing\n").find("rule 'missing' is used but not defined"),
            std::string::npos);
  EXPECT_NE(err("start ::= \"a\"\n").find("no rule 'root'"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\n").find("closing '\"'"), std::string::npos);
  EXPECT_NE(err("root ::= [z-a]\n").find("range"), std::string::npos);
  EXPECT_NE(err("root ::= \"a\"{99999}\n").find("repeat limit"), std::string::npos);
  // Deep nesting is refused by the nesting bound, not by the stack.
  EXPECT_NE(err("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')') + "\n")
                .find("nesting limit"),
            std::string::npos);
  GrammarLimits small;
  small.max_items = 50;
  EXPECT_NE(err("root ::= \"a\"{40} \"b\"{40}\n", small).find("size limit"), std::string::npos);
  small = {};
  small.max_text_bytes = 10;
  EXPECT_NE(err("root ::= \"abcdefgh\"\n", small).find("grammar size limit"), std::string::npos);
}

TEST(Gbnf, AmbiguityIsBounded) {
  // (a | a)* doubles the stacks per character without dedup; dedup keeps one.
  auto g = compile("root ::= ( \"a\" | \"a\" )*\n");
  EXPECT_TRUE(matches(g, std::string(200, 'a')));
  GrammarLimits lim;
  lim.max_stacks = 8;
  // x{0,20} x{0,20}: after k x's there are up to k+1 ways to split them.
  auto amb = std::make_shared<const Grammar>(
      Grammar::from_gbnf("root ::= x x x\nx ::= \"a\"{0,20}\n", lim));
  Matcher m(amb);
  EXPECT_THROW(m.accept_bytes(std::string(10, 'a')), Error);
}

// Regexes against std::regex (ECMAScript) on random strings over the regex's alphabet.
TEST(Regex, AgreesWithStdRegex) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(\d{3}-\d{4})", "0123456789-a"},
      {R"([a-c]+(x|yz)?\.?)", "abcxyz.q"},
      {R"((?:ab|a)*b)", "ab"},
      {R"([^abc]{2,3}d*)", "abcde"},
      {R"(\w+@\w+\.(com|org))", "ab@.comrgx_1"},
      {R"(a.c)", "abc\n"},
      {R"(^(yes|no|maybe)$)", "yesnomaybe"},
      {R"(\s?[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?)", " +-0123.9"},
  };
  std::mt19937 rng(7);
  for (const auto& [re, alphabet] : cases) {
    auto g = compile(regex_to_gbnf(re));
    const std::regex ref(re, std::regex::ECMAScript);
    int positives = 0;
    for (int t = 0; t < 3000; ++t) {
      std::string s;
      const int len = static_cast<int>(rng() % 10);
      for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
      const bool want = std::regex_match(s, ref);
      positives += want;
      EXPECT_EQ(matches(g, s), want) << re << " on '" << s << "'";
    }
    // Known members and near misses, so no case is only negatives.
    for (const char* s : {"012-3456", "abcx.", "abab", "xyd", "a_1@b.com", "ab@c.org", "a@b.net",
                          "abc", "yes", "maybe", " -0.5", "+12", "012"}) {
      const bool want = std::regex_match(std::string(s), ref);
      positives += want;
      EXPECT_EQ(matches(g, s), want) << re << " on '" << s << "'";
    }
    EXPECT_GT(positives, 0) << re;
  }
}

TEST(Regex, UnsupportedFeaturesAreRefusedByName) {
  for (const char* re : {R"((a)\1)", "(?=a)b", "(?<n>a)", "a\\b"})
    EXPECT_THROW(regex_to_gbnf(re), Error) << re;
}

TEST(Choice, ExactlyOneOfTheStrings) {
  auto g = compile(choice_to_gbnf({"red", "green", "re\"d"}));
  EXPECT_TRUE(matches(g, "red"));
  EXPECT_TRUE(matches(g, "re\"d"));
  EXPECT_FALSE(matches(g, "gree"));
  EXPECT_FALSE(matches(g, "redgreen"));
}

struct SchemaCase {
  const char* schema;
  std::vector<const char*> valid, invalid;
};

// Documents valid and invalid by JSON Schema's rules, for the keywords the converter enforces.
TEST(JsonSchema, ValidAndInvalidDocuments) {
  const std::vector<SchemaCase> cases = {
      {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
           "required": ["name", "age"]})",
       {R"({"name":"Ann","age":30})", R"({"name": "A\"b", "age": -4})"},
       {R"({"age":30,"name":"Ann"})", R"({"name":"Ann"})", R"({"name":"Ann","age":3.5})",
        R"({"name":"Ann","age":30,"x":1})", R"({"name":Ann,"age":30})"}},
      {R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}})",
       {"{}", R"({"a":true})", R"({"b":null})", R"({"a":false,"b":null})"},
       {R"({"b":null,"a":true})", R"({"a":1})", R"({,"b":null})"}},
      {R"({"type": "array", "items": {"enum": ["x", 1, null]}, "minItems": 1, "maxItems": 3})",
       {R"(["x"])", R"([1, null, "x"])"},
       {"[]", R"(["x",1,null,1])", R"(["y"])"}},
      {R"({"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 2}]})",
       {"1.5e3", "-0", R"("ab")", R"("")"},
       {R"("abc")", "01", "true"}},
      {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
             "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
           "$ref": "#/$defs/node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":null}})"},
       {R"({"v":1})", R"({"v":1,"next":{"v":2}})"}},
      {R"({"type": "string", "pattern": "^[a-z]{2}-\\d+$"})",
       {R"("ab-12")"},
       {R"("ab-")", R"("abc-1")"}},
      {R"({"type": "string", "format": "date"})",
       {R"("2026-12-01")"},
       {R"("2026-13-01")", R"("26-12-01")"}},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {"{}", R"({"a":1,"b":2})"},
       {R"({"a":"x"})"}},
      {R"({"type": ["integer", "null"]})", {"7", "null"}, {"7.5", "\"7\""}},
      {R"({"const": {"k": [1, 2]}})", {R"({"k":[1,2]})"}, {R"({"k":[1,2,3]})"}},
      {R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
       {"[1, \"a\"]", "[1]", "[]"},
       {"[1, \"a\", 2]", "[\"a\"]"}},
  };
  for (const auto& c : cases) {
    auto g = compile(json_schema_to_gbnf(c.schema));
    for (const char* v : c.valid) EXPECT_TRUE(matches(g, v)) << c.schema << "\n  valid: " << v;
    for (const char* v : c.invalid) EXPECT_FALSE(matches(g, v)) << c.schema << "\n  invalid: " << v;
  }
}

TEST(JsonSchema, ErrorsNameTheKeyword) {
  auto err = [](const std::string& s) {
    try {
      json_schema_to_gbnf(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"not": {"type": "string"}})").find("'not'"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("#/$defs/missing"), std::string::npos);
  EXPECT_NE(err(R"({"type": "strang"})").find("unknown type 'strang'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "required": ["a"]})").find("'a'"), std::string::npos);
  EXPECT_NE(err("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "maxItems": 1, "minItems": 2})").find("maxItems"),
            std::string::npos);
}

TEST(JsonObject, AnyObject) {
  auto g = compile(json_object_gbnf());
  EXPECT_TRUE(matches(g, R"({"a": [1, {"b": null}], "c": "\u00e9"})"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
}

// The trie's mask against a per-token check, over a vocabulary with multi-byte tokens, tokens
// ending inside a UTF-8 character, and tokens without text.
TEST(TokenTrie, MaskEqualsPerTokenCheck) {
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"", "\":", "\",", "true", "tr", "null", "12", "\xC3", "\xC3\xA9", "\xA9\"", "  ", "}"})
    vocab.push_back(std::string(t));
  vocab.push_back(std::nullopt);  // a special token
  TokenTrie trie(vocab);
  auto g = compile(json_schema_to_gbnf(
      R"({"type":"object","properties":{"k":{"type":"string"},"b":{"type":"boolean"}},"required":["k","b"]})"));
  const std::vector<std::string> prefixes = {"",
                                             "{",
                                             "{\"k\"",
                                             "{\"k\":",
                                             "{\"k\": \"",
                                             "{\"k\": \"\xC3",
                                             "{\"k\": \"x\", \"b\": t",
                                             "{\"k\":\"\",\"b\":false"};
  for (const auto& p : prefixes) {
    Matcher m(g);
    ASSERT_TRUE(m.accept_bytes(p)) << p;
    std::vector<uint64_t> mask((vocab.size() + 63) / 64, 0);
    trie.fill_allowed(m, mask);
    int allowed = 0;
    for (size_t id = 0; id < vocab.size(); ++id) {
      bool want = false;
      if (vocab[id] && !vocab[id]->empty()) {
        Matcher c = m;
        want = c.accept_bytes(*vocab[id]);
      }
      const bool got = (mask[id / 64] >> (id % 64)) & 1;
      allowed += got;
      EXPECT_EQ(got, want) << "prefix '" << p << "' token " << id;
    }
    EXPECT_GT(allowed, 0) << p;
  }
}

// The constraint's mask (per-stack suffixes, cached, with the uncertain tokens checked against the
// whole stack) against a per-token check of the whole state, over states reached by random walks
// through nested JSON (strings, escapes, numbers, literals, multi-byte characters) and a JSON
// Schema, with a vocabulary whose tokens cross the grammar's rule boundaries ("}, ", "\":[" ...)
// and end inside UTF-8 characters. The same constraint serves every state, so the suffix cache is
// reused across contexts: a suffix mask that wrongly depended on the stack below would show.
TEST(GrammarConstraint, SuffixMasksEqualPerTokenCheck) {
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"",
                        "\":",
                        "\",",
                        "\": ",
                        "\"}",
                        "\"]",
                        "\":[",
                        "}, ",
                        "}]",
                        "]}",
                        "],",
                        "[{",
                        "{}",
                        "[]",
                        "true",
                        "tr",
                        "null",
                        "false}",
                        "12",
                        "1.5",
                        "-3e",
                        "e+",
                        "\\n",
                        "\\u00",
                        "\\\"",
                        "ab\"",
                        "\xC3",
                        "\xC3\xA9",
                        "\xA9\"",
                        "\xE2\x82",
                        "\xE2\x82\xAC\"",
                        "  ",
                        "\n  ",
                        "}",
                        "\"a\": 1",
                        ", \"",
                        "hello",
                        " world",
                        "\"hello\"",
                        "\"b\":{\"",
                        "0}",
                        "00",
                        ".5]"})
    vocab.push_back(std::string(t));
  vocab.push_back(std::nullopt);
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const std::vector<std::string> grammars = {
      json_object_gbnf(),
      json_schema_to_gbnf(
          R"({"type":"object","properties":{"k":{"type":"string"},"n":{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},"s":{"type":"string"}}}},"b":{"type":"boolean"}},"required":["k","b"]})")};
  std::mt19937 rng(11);
  int states = 0, uncertain_states = 0;
  for (const auto& text : grammars) {
    auto g = compile(text);
    GrammarConstraint c(g, trie);
    for (int walk = 0; walk < 12; ++walk) {
      Matcher m(g);
      for (int step = 0; step < 60; ++step) {
        std::vector<uint64_t> mask((vocab.size() + 63) / 64, 0);
        c.fill(m, mask);
        std::vector<int32_t> allowed;
        for (size_t id = 0; id < vocab.size(); ++id) {
          bool want = false;
          if (vocab[id] && !vocab[id]->empty()) {
            Matcher t = m;
            want = t.accept_bytes(*vocab[id]);
          }
          const bool got = (mask[id / 64] >> (id % 64)) & 1;
          ASSERT_EQ(got, want) << "walk " << walk << " step " << step << " token " << id << " '"
                               << vocab[id].value_or("") << "'";
          if (want) allowed.push_back(static_cast<int32_t>(id));
        }
        ++states;
        for (const auto& st : m.stacks())
          uncertain_states += st.size() > GrammarConstraint::kSuffixDepth;
        if (allowed.empty()) break;
        // Prefer the multi-byte tokens now and then, so walks go deep and cross rules.
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_bytes(*vocab[static_cast<size_t>(pick)]));
      }
    }
  }
  EXPECT_GT(states, 500);
  EXPECT_GT(uncertain_states, 200);  // stacks deeper than the suffix were exercised
}

// The same at a vocabulary large enough for the suffix walk to fan out over threads (40,000
// random tokens over JSON's alphabet): the threads' masks and uncertain lists merged must be the
// per-token check's.
TEST(GrammarConstraint, ParallelSuffixWalkEqualsPerTokenCheck) {
  const std::string alphabet = "{}[]\",: abcxyz019.-e\\tnul\xC3\xA9";
  std::mt19937 rng(5);
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  while (vocab.size() < 40000) {
    std::string t;
    const int len = 2 + static_cast<int>(rng() % 6);
    for (int i = 0; i < len; ++i) t.push_back(alphabet[rng() % alphabet.size()]);
    vocab.push_back(t);
  }
  auto trie = std::make_shared<const TokenTrie>(vocab);
  auto g = compile(json_object_gbnf());
  GrammarConstraint c(g, trie);
  int checked = 0;
  for (const char* p : {"", "{\"", "{\"ab", "{\"a\": ", "{\"a\": [1, {\"b\": \"x", "{\"a\": [[tr",
                        "{\"a\": -0.5e", "{\"a\": {}, \"b\": [\"\xC3\xA9\", 1"}) {
    Matcher m(g);
    ASSERT_TRUE(m.accept_bytes(p)) << p;
    std::vector<uint64_t> mask((vocab.size() + 63) / 64, 0);
    c.fill(m, mask);
    int allowed = 0;
    for (size_t id = 0; id < vocab.size(); ++id) {
      Matcher t = m;
      const bool want = t.accept_bytes(*vocab[id]);
      const bool got = (mask[id / 64] >> (id % 64)) & 1;
      ASSERT_EQ(got, want) << "prefix '" << p << "' token " << id << " '" << *vocab[id] << "'";
      allowed += want;
    }
    EXPECT_GT(allowed, 0) << p;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

// The constraint as the engine uses it: EOS only once complete, tokens advance the state.
TEST(GrammarConstraint, EosOnlyWhenComplete) {
  std::vector<std::optional<std::string>> vocab = {std::string("a"), std::string("b"),
                                                   std::string("ab"), std::nullopt};
  auto trie = std::make_shared<const TokenTrie>(vocab);
  GrammarConstraint c(compile("root ::= \"a\" \"b\"?\n"), trie);
  auto s = c.start();
  const int32_t eos[] = {3};
  std::vector<uint64_t> mask(1, 0);
  s->fill_allowed(mask, eos);
  EXPECT_EQ(mask[0], 0b0101u);  // "a" and "ab"; not "b", not EOS yet
  ASSERT_TRUE(s->accept(0));
  EXPECT_FALSE(s->must_end());
  mask[0] = 0;
  s->fill_allowed(mask, eos);
  EXPECT_EQ(mask[0], 0b1010u);  // "b" or EOS
  EXPECT_FALSE(s->accept(2));
  ASSERT_TRUE(s->accept(1));
  EXPECT_TRUE(s->must_end());
}

// vLLM's structural tag: free text, and after a trigger one of the structures it begins.
TEST(StructuralTag, FreeTextAndTaggedCalls) {
  auto g = compile(structural_tag_to_gbnf(R"({"type": "structural_tag", "triggers": ["<function="],
    "structures": [{"begin": "<function=get_weather>", "end": "</function>",
                    "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                   {"begin": "<function=noop>", "end": "</function>"}]})"));
  for (const char* ok :
       {"", "Hello world", "a < b and <functio", "<<function=noop>{}</function>",
        "Let me look. <function=get_weather>{\"city\": \"Paris\"}</function> Done.",
        "<function=noop>[1, 2]</function><function=get_weather>{\"city\":\"\"}</function>"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad :
       {"<function=foo>{}</function>", "<function=get_weather>{\"town\": 1}</function>",
        "<function=get_weather>{\"city\": \"P\"}", "<function=noop>{}</functio x",
        "<function=get_weather>{\"city\": \"P\"} </function>"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// Against a direct reading of the rule on random text: at each trigger occurrence the text must
// go on as the structure (begin, the one JSON value the schema allows, end).
TEST(StructuralTag, AgreesWithADirectCheckOnRandomText) {
  auto g = compile(structural_tag_to_gbnf(R"({"triggers": ["aab"],
    "structures": [{"begin": "aab:", "schema": {"const": 1}, "end": ";"}]})"));
  auto reference = [](const std::string& s) {
    const std::string whole = "aab:1;";
    size_t i = 0;
    for (;;) {
      const size_t at = s.find("aab", i);
      if (at == std::string::npos) return true;
      if (s.compare(at, whole.size(), whole) != 0) return false;
      i = at + whole.size();
    }
  };
  const std::vector<std::string> pieces = {"a", "b", "aa", "ab",     ":",
                                           "1", ";", "x",  "aab:1;", "aab:"};
  std::mt19937 rng(7);
  int accepted = 0;
  for (int n = 0; n < 3000; ++n) {
    std::string s;
    const int len = static_cast<int>(rng() % 8);
    for (int k = 0; k < len; ++k) s += pieces[rng() % pieces.size()];
    const bool want = reference(s);
    accepted += want;
    EXPECT_EQ(matches(g, s), want) << s;
  }
  EXPECT_GT(accepted, 300);  // both answers are well represented
  EXPECT_LT(accepted, 2700);
}

TEST(StructuralTag, ErrorsNameTheField) {
  auto err = [](const std::string& spec) {
    try {
      structural_tag_to_gbnf(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"triggers": ["<f"]})").find("'structures'"), std::string::npos);
  EXPECT_NE(err(R"({"structures": [{"begin": "<f>", "end": "</f>"}], "triggers": []})")
                .find("'triggers'"),
            std::string::npos);
  EXPECT_NE(err(R"({"structures": [{"begin": "<g>", "end": "</g>"}], "triggers": ["<f"]})")
                .find("structures[0].begin"),
            std::string::npos);
  EXPECT_NE(err(R"({"structures": [{"begin": "<f>"}], "triggers": ["<f"]})").find("'end'"),
            std::string::npos);
  EXPECT_NE(err(R"({"format": {"type": "triggered_tags"}})").find("'format'"), std::string::npos);
}

// Reasoning models: the block between the tags is free, the grammar applies after it.
// Vocabulary: "a", "b", "ab", EOS, <think> (4), </think> (5), "z" (6).
struct GateFixture {
  std::vector<std::optional<std::string>> vocab = {
      std::string("a"), std::string("b"), std::string("ab"), std::nullopt,
      std::nullopt,     std::nullopt,     std::string("z")};
  std::shared_ptr<const LogitsConstraint> inner = std::make_shared<const GrammarConstraint>(
      compile("root ::= \"a\" \"b\"\n"), std::make_shared<const TokenTrie>(vocab));
  const int32_t eos[1] = {3};
  uint64_t mask(LogitsConstraintState& s) {
    std::vector<uint64_t> m(1, 0);
    s.fill_allowed(m, eos);
    return m[0];
  }
};

TEST(ReasoningGate, PromptOpenedBlockIsFreeUntilItsEndTag) {
  GateFixture f;
  auto s = ReasoningGate(f.inner, 4, 5, /*starts_in_reasoning=*/true).start();
  EXPECT_EQ(f.mask(*s), ~uint64_t{0});  // anything inside the block
  ASSERT_TRUE(s->accept(6));
  ASSERT_TRUE(s->accept(1));
  EXPECT_FALSE(s->must_end());
  ASSERT_TRUE(s->accept(5));       // </think>: the grammar starts
  EXPECT_EQ(f.mask(*s), 0b0101u);  // "a", "ab"
  EXPECT_FALSE(s->accept(6));
  ASSERT_TRUE(s->accept(0));
  ASSERT_TRUE(s->accept(1));
  EXPECT_TRUE(s->must_end());
}

TEST(ReasoningGate, FirstTokenOpensTheBlockOrStartsTheAnswer) {
  GateFixture f;
  ReasoningGate gate(f.inner, 4, 5, /*starts_in_reasoning=*/false);
  auto thinking = gate.start();
  EXPECT_EQ(f.mask(*thinking), 0b10101u);  // the grammar's first tokens and <think>
  ASSERT_TRUE(thinking->accept(4));
  EXPECT_EQ(f.mask(*thinking), ~uint64_t{0});
  ASSERT_TRUE(thinking->accept(4));  // <think> again, inside the block: free text
  ASSERT_TRUE(thinking->accept(5));
  EXPECT_EQ(f.mask(*thinking), 0b0101u);
  auto direct = gate.start();
  ASSERT_TRUE(direct->accept(0));       // "a": the answer began
  EXPECT_EQ(f.mask(*direct), 0b0010u);  // only "b" now; <think> is no longer allowed
  EXPECT_FALSE(direct->accept(4));
  // Without a start token only a prompt-opened block gates.
  auto plain = ReasoningGate(f.inner, -1, 5, false).start();
  EXPECT_EQ(f.mask(*plain), 0b0101u);
}

}  // namespace
}  // namespace atom::grammar
