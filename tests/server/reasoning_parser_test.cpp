// vLLM's --reasoning-parser families: where each one's reasoning ends and its answer begins, on
// outputs written the way the models write them (after the generation prompt of their chat
// templates in tests/fixtures/chat_templates/), whole and split at every position.
#include <gtest/gtest.h>

#include "server/reasoning.h"

namespace atom::test {
namespace {

using json = nlohmann::ordered_json;
using server::ReasoningDelta;

ReasoningDelta run(server::ReasoningParser& p, const std::vector<std::string>& pieces) {
  ReasoningDelta all;
  for (const auto& s : pieces) {
    const ReasoningDelta d = p.feed(s);
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  const ReasoningDelta d = p.finish();
  all.reasoning += d.reasoning;
  all.content += d.content;
  return all;
}

// The split of `output` by parser `name` set up for `prompt` and `kwargs`, checked the same for
// every two-way split and byte by byte. nullptr parsers (nothing to split) give all content.
ReasoningDelta split(const std::string& name, const std::string& output,
                     const std::string& prompt = "", const json& kwargs = json::object()) {
  auto make = [&] { return server::make_reasoning_parser(name, prompt, kwargs); };
  auto whole = make();
  if (!whole) return {"", output};
  const ReasoningDelta w = run(*whole, {output});
  for (size_t i = 0; i <= output.size(); ++i) {
    auto p = make();
    const ReasoningDelta d = run(*p, {output.substr(0, i), output.substr(i)});
    EXPECT_EQ(d.reasoning, w.reasoning) << name << " split at " << i;
    EXPECT_EQ(d.content, w.content) << name << " split at " << i;
  }
  std::vector<std::string> bytes;
  for (char c : output) bytes.emplace_back(1, c);
  auto p = make();
  const ReasoningDelta d = run(*p, bytes);
  EXPECT_EQ(d.reasoning, w.reasoning) << name << " byte by byte";
  EXPECT_EQ(d.content, w.content) << name << " byte by byte";
  return w;
}

TEST(ReasoningParsers, NamesAreVllms) {
  for (const char* n : {"deepseek_r1", "deepseek_v3", "glm45", "kimi_k2", "openai_gptoss", "qwen3"})
    EXPECT_TRUE(server::reasoning_parser_known(n)) << n;
  EXPECT_FALSE(server::reasoning_parser_known("qwen"));
  EXPECT_TRUE(server::reasoning_parser_known("none"));  // atom's: no split by the template
  EXPECT_THROW(server::make_reasoning_parser("nope", "", json::object()), std::invalid_argument);
  // gpt-oss's channels are split by the harmony parser (make_tool_parser("openai")).
  EXPECT_EQ(server::make_reasoning_parser("openai_gptoss", "", json::object()), nullptr);
}

TEST(ReasoningParsers, Qwen3AndGlm45ReasonOnlyInsideThink) {
  for (const char* name : {"qwen3", "glm45"}) {
    ReasoningDelta d = split(name, "<think>\nPlan.\n</think>\n\nAnswer.");
    EXPECT_EQ(d.reasoning, "\nPlan.\n");
    EXPECT_EQ(d.content, "Answer.");
    d = split(name, "No thinking here.");
    EXPECT_EQ(d.reasoning, "");
    EXPECT_EQ(d.content, "No thinking here.");
  }
  // GLM-4.6 writes "\n<think>" after its generation prompt "<|assistant|>".
  ReasoningDelta d = split("glm45", "\n<think>Look it up.</think>\nIt is 4.",
                           "[gMASK]<sop><|user|>\nq<|assistant|>");
  EXPECT_EQ(d.reasoning, "Look it up.");
  EXPECT_EQ(d.content, "It is 4.");
  // A prompt that opened the block (Qwen3's thinking templates end it with "<think>\n").
  d = split("qwen3", "still thinking</think>\n\nDone.", "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(d.reasoning, "still thinking");
  EXPECT_EQ(d.content, "Done.");
}

// Where the prompt closed the block, or the request turned thinking off, the answer is the
// content from its first token (a grammar applies from there: chat_flow.cpp).
TEST(ReasoningParsers, ABlockClosedByThePromptEndsReasoningThere) {
  const json none = json::object();
  auto ended = [](const char* name, const std::string& prompt, const json& kwargs) {
    auto p = server::make_reasoning_parser(name, prompt, kwargs);
    return p && p->format().ended_in_prompt;
  };
  for (const char* name : {"qwen3", "glm45"}) {
    // Qwen3's template with enable_thinking false; GLM-4.5's writes "<think></think>".
    EXPECT_TRUE(ended(name, "<|im_start|>assistant\n<think>\n\n</think>\n\n", none)) << name;
    EXPECT_TRUE(ended(name, "<|assistant|>\n<think></think>", none)) << name;
    EXPECT_TRUE(ended(name, "<|im_start|>assistant\n", json{{"enable_thinking", false}})) << name;
    EXPECT_FALSE(ended(name, "<|im_start|>assistant\n", none)) << name;
    EXPECT_FALSE(ended(name, "<|im_start|>assistant\n", json{{"enable_thinking", true}})) << name;
    // An earlier turn's closed block does not end this answer's reasoning.
    EXPECT_FALSE(ended(name, "<think>a</think>b<|im_end|>\n<|im_start|>assistant\n", none)) << name;
    // A prompt that opens the block is inside it.
    EXPECT_FALSE(ended(name, "<|im_start|>assistant\n<think>\n", none)) << name;
  }
}

TEST(ReasoningParsers, DeepSeekR1IsReasoningUntilTheEndTag) {
  // R1 writes its answer after "</think>"; the opening tag may be the prompt's or its own.
  ReasoningDelta d = split("deepseek_r1", "Okay, the user wants 3*4.\n</think>\n\n12");
  EXPECT_EQ(d.reasoning, "Okay, the user wants 3*4.\n");
  EXPECT_EQ(d.content, "12");
  d = split("deepseek_r1", "<think>\nhmm\n</think>answer");
  EXPECT_EQ(d.reasoning, "\nhmm\n");
  EXPECT_EQ(d.content, "answer");
  d = split("deepseek_r1", "cut off while thinking");
  EXPECT_EQ(d.reasoning, "cut off while thinking");
  EXPECT_EQ(d.content, "");
}

TEST(ReasoningParsers, DeepSeekV3ThinksOnlyWhenAsked) {
  // DeepSeek-V3.1's template ends the prompt with "<think>" when `thinking` is on, "</think>"
  // otherwise (tests/fixtures/chat_templates/deepseek-v3.1.jinja).
  ReasoningDelta d = split("deepseek_v3", "Let me see.</think>Paris.", "<｜Assistant｜><think>",
                           json{{"thinking", true}});
  EXPECT_EQ(d.reasoning, "Let me see.");
  EXPECT_EQ(d.content, "Paris.");
  d = split("deepseek_v3", "Paris.</think>", "<｜Assistant｜></think>", json::object());
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Paris.</think>");
  d = split("deepseek_v3", "x</think>y", "", json{{"enable_thinking", true}});
  EXPECT_EQ(d.reasoning, "x");
}

TEST(ReasoningParsers, KimiK2EndsThinkingAtItsToolSection) {
  const std::string section = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
  ReasoningDelta d = split("kimi_k2", "<think>Need f.</think>Calling it." + section);
  EXPECT_EQ(d.reasoning, "Need f.");
  EXPECT_EQ(d.content, "Calling it." + section);
  // Straight from thinking to the calls: the section stays for the tool parser.
  d = split("kimi_k2", "Need f." + section);
  EXPECT_EQ(d.reasoning, "Need f.");
  EXPECT_EQ(d.content, section);
  d = split("kimi_k2", "Plain answer.", "", json{{"thinking", false}});
  EXPECT_EQ(d.content, "Plain answer.");
  EXPECT_EQ(d.reasoning, "");
}

}  // namespace
}  // namespace atom::test
