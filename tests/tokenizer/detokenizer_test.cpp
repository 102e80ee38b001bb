// The streaming detokenizer on real tokenizers: arbitrary id sequences (including broken UTF-8 and
// special tokens), prompt context, and held-back partial characters.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {
namespace {

using test::ids_str;
using test::json_ids;
using test::show;

std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                   std::vector<std::string>* pieces = nullptr) {
  IncrementalDetokenizer d(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string p = d.add(id);
    EXPECT_TRUE(utf8_is_valid(p)) << "invalid UTF-8 piece " << show(p) << " in " << ids_str(ids);
    if (pieces) pieces->push_back(p);
    all += p;
  }
  const std::string tail = d.finish();
  if (pieces) pieces->push_back(tail);
  return all + tail;
}

class DetokenizerTest : public ::testing::TestWithParam<std::string> {};

// Random id sequences (byte tokens out of order, special tokens, unknown ids), decoded by HF:
// streaming gives the same text.
TEST_P(DetokenizerTest, RandomIdSequencesStreamLikeDecode) {
  const auto ref = test::load_reference(GetParam());
  ASSERT_FALSE(ref.is_null());
  const auto tok = Tokenizer::from_dir(test::model_dir(GetParam()));
  int failures = 0;
  for (const auto& c : ref["random_decode"]) {
    const auto ids = json_ids(c["ids"]);
    for (bool skip : {false, true}) {
      const std::string expected = c[skip ? "text_skip" : "text"].get<std::string>();
      const std::string got = stream(tok, ids, skip);
      if (got == expected) continue;
      if (++failures <= 5) {
        ADD_FAILURE() << GetParam() << " skip=" << skip << " ids=" << ids_str(ids)
                      << "\n  decode   " << show(expected) << "\n  streamed " << show(got);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, DetokenizerTest,
                         ::testing::Values("qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2"),
                         [](const auto& info) { return info.param; });

TEST(Detokenizer, HoldsBackPartialCharacters) {
  const auto tok = Tokenizer::from_dir(test::model_dir("qwen3"));
  // A rare CJK character and an emoji are several byte-level tokens each.
  const std::string text = "a𪚥b😀";
  const auto ids = tok.encode(text, false);
  ASSERT_GT(ids.size(), 4u);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream(tok, ids, false, &pieces), text);
  int empty = 0;
  for (const auto& p : pieces) empty += p.empty();
  EXPECT_GT(empty, 0) << "partial characters must be held back";
}

TEST(Detokenizer, IncompleteEndBecomesReplacementChar) {
  const auto tok = Tokenizer::from_dir(test::model_dir("llama2"));
  const std::vector<int32_t> ids = {tok.token_to_id("▁a"), tok.token_to_id("<0xE2>"),
                                    tok.token_to_id("<0x82>")};
  IncrementalDetokenizer d(tok, false);
  std::string all;
  for (int32_t id : ids) all += d.add(id);
  EXPECT_EQ(all, "a");
  const std::string tail = d.finish();
  EXPECT_EQ(all + tail, tok.decode(ids, false));
  EXPECT_NE(tail.find(kReplacementChar), std::string::npos);
}

TEST(Detokenizer, ByteFallbackRunIsHeldUntilClosed) {
  const auto tok = Tokenizer::from_dir(test::model_dir("llama2"));
  const auto ids = tok.encode("x 𪚥 y", false);  // not in the vocabulary: four <0xNN> tokens
  std::vector<std::string> pieces;
  EXPECT_EQ(stream(tok, ids, false, &pieces), tok.decode(ids, false));
  bool whole = false;
  for (const auto& p : pieces) whole = whole || p.find("𪚥") != std::string::npos;
  EXPECT_TRUE(whole);
  // A valid run followed by an invalid byte: HF's decode turns the whole run into U+FFFDs, so the
  // valid prefix must not have been emitted on its own.
  const std::vector<int32_t> bad = {tok.token_to_id("<0xE2>"), tok.token_to_id("<0x82>"),
                                    tok.token_to_id("<0xAC>"), tok.token_to_id("<0xFF>"),
                                    tok.token_to_id("▁a")};
  EXPECT_EQ(stream(tok, bad, false), tok.decode(bad, false));
}

TEST(Detokenizer, PromptContextGivesLeadingSpace) {
  const auto tok = Tokenizer::from_dir(test::model_dir("llama2"));
  const auto prompt = tok.encode("Hello", true);
  const auto gen = tok.encode("world peace", false);  // starts with "▁world"
  IncrementalDetokenizer d(tok, true, prompt);
  std::string all;
  for (int32_t id : gen) all += d.add(id);
  all += d.finish();
  // After a prompt the first "▁" is a real space; on its own decode() strips it.
  EXPECT_EQ(all, " world peace");
  EXPECT_EQ(tok.decode(gen, true), "world peace");
}

TEST(Detokenizer, SkipsSpecialTokensInTheMiddle) {
  const auto tok = Tokenizer::from_dir(test::model_dir("qwen3"));
  const auto ids = tok.encode("Hi<|im_end|>\n<|im_start|>there", false);
  EXPECT_EQ(stream(tok, ids, true), "Hi\nthere");
  EXPECT_EQ(stream(tok, ids, false), "Hi<|im_end|>\n<|im_start|>there");
}

}  // namespace
}  // namespace atom::tokenizer

namespace atom::tokenizer {
namespace {

// Quarter-megabyte inputs (far past the corpus' 10k-character cases) encode without regex stack
// errors, and byte-level tokenizers give the input back exactly.
TEST(TokenizerLimits, HugeInputsRoundTrip) {
  for (const char* model : {"qwen3", "gptoss"}) {
    const auto tok = Tokenizer::from_dir(test::model_dir(model));
    for (const std::string& text :
         {std::string(1 << 18, ' '), std::string(1 << 18, 'a'), std::string(1 << 18, '7'),
          std::string(1 << 17, '\n') + std::string(1 << 17, '\t')}) {
      const auto ids = tok.encode(text, false);
      EXPECT_FALSE(ids.empty());
      EXPECT_TRUE(tok.decode(ids, false) == text) << model;
    }
  }
}

// Many threads share one Tokenizer (word cache, regex match state per thread).
TEST(TokenizerLimits, ConcurrentEncodeAgreesWithReference) {
  const auto ref = test::load_reference("qwen3");
  ASSERT_FALSE(ref.is_null());
  const auto tok = Tokenizer::from_dir(test::model_dir("qwen3"));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < ref["cases"].size(); i += 2) {
        const auto& c = ref["cases"][i];
        if (c.contains("hex")) continue;
        if (tok.encode(c["text"].get<std::string>(), false) != json_ids(c["ids"])) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace atom::tokenizer
