// atom's tokenizer against the Hugging Face tokenizers library on real tokenizer files (Qwen3,
// Llama 3.1, DeepSeek-V3, gpt-oss, Llama 2) over the corpus of tests/tokenizer/corpus plus
// generated cases. Expected values come from tests/node/tokenizer_reference.js at test time.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {
namespace {

using test::ids_str;
using test::json_ids;
using test::show;

class ReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = test::load_reference(GetParam());
    ASSERT_FALSE(ref_.is_null());
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_dir(test::model_dir(GetParam())));
  }
  // The input atom encodes: the raw bytes for the invalid-UTF-8 cases, else the text.
  static std::string input_of(const nlohmann::json& c) {
    return c.contains("hex") ? test::hex_bytes(c["hex"].get<std::string>())
                             : c["text"].get<std::string>();
  }
  nlohmann::json ref_;
  std::unique_ptr<Tokenizer> tok_;
};

constexpr int kMaxReported = 5;

TEST_P(ReferenceTest, EncodeMatches) {
  int failures = 0, checked = 0;
  for (const auto& c : ref_["cases"]) {
    const std::string text = input_of(c);
    for (bool special : {false, true}) {
      const auto expected = json_ids(c[special ? "ids_special" : "ids"]);
      const auto got = tok_->encode(text, special);
      ++checked;
      if (got != expected && ++failures <= kMaxReported) {
        ADD_FAILURE() << GetParam() << " add_special_tokens=" << special << " text=" << show(text)
                      << "\n  expected " << ids_str(expected) << "\n  atom     " << ids_str(got);
      }
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << checked << " encodings differ";
  EXPECT_GT(checked, 1000);
}

TEST_P(ReferenceTest, DecodeMatches) {
  int failures = 0, checked = 0;
  auto check = [&](const std::vector<int32_t>& ids, bool skip, const std::string& expected) {
    const std::string got = tok_->decode(ids, skip);
    ++checked;
    if (got != expected && ++failures <= kMaxReported) {
      ADD_FAILURE() << GetParam() << " skip_special_tokens=" << skip << " ids=" << ids_str(ids)
                    << "\n  expected " << show(expected) << "\n  atom     " << show(got);
    }
  };
  for (const auto& c : ref_["cases"]) {
    const auto ids = json_ids(c["ids_special"]);
    check(ids, false, c["decode"].get<std::string>());
    check(ids, true, c["decode_skip"].get<std::string>());
  }
  for (const auto& c : ref_["random_decode"]) {
    const auto ids = json_ids(c["ids"]);
    check(ids, false, c["text"].get<std::string>());
    check(ids, true, c["text_skip"].get<std::string>());
  }
  EXPECT_EQ(failures, 0) << failures << " of " << checked << " decodes differ";
}

TEST_P(ReferenceTest, VocabularyMatches) {
  EXPECT_EQ(tok_->vocab_size(), ref_["vocab_size"].get<size_t>());
  int failures = 0;
  for (const auto& row : ref_["id_to_token"]) {
    const auto id = row[0].get<int32_t>();
    const auto got = tok_->id_to_token(id);
    if (row[1].is_null()) {
      if (got && ++failures <= kMaxReported)
        ADD_FAILURE() << "id " << id << ": expected no token, atom has " << show(*got);
      continue;
    }
    const auto expected = row[1].get<std::string>();
    if ((!got || *got != expected) && ++failures <= kMaxReported) {
      ADD_FAILURE() << "id " << id << ": expected " << show(expected) << ", atom "
                    << (got ? show(*got) : "none");
    }
    if (got && tok_->token_to_id(*got) < 0)
      ADD_FAILURE() << "token_to_id(" << show(*got) << ") = -1";
  }
  EXPECT_EQ(failures, 0);
}

// Streaming: the pieces are valid UTF-8 and add up to HF's decode of all ids.
TEST_P(ReferenceTest, IncrementalDetokenizerMatchesDecode) {
  int failures = 0;
  auto run = [&](const std::vector<int32_t>& ids, bool skip, const std::string& expected) {
    IncrementalDetokenizer detok(*tok_, skip);
    std::string all;
    for (int32_t id : ids) {
      const std::string piece = detok.add(id);
      if (!utf8_is_valid(piece)) {
        ADD_FAILURE() << "invalid UTF-8 piece " << show(piece) << " for ids " << ids_str(ids);
        ++failures;
      }
      all += piece;
    }
    all += detok.finish();
    if (all != expected && ++failures <= kMaxReported) {
      ADD_FAILURE() << GetParam() << " skip_special_tokens=" << skip << " ids=" << ids_str(ids)
                    << "\n  decode   " << show(expected) << "\n  streamed " << show(all);
    }
  };
  for (const auto& c : ref_["cases"]) {
    const auto ids = json_ids(c["ids_special"]);
    if (ids.size() > 2000) continue;  // quadratic-free, but keep the test quick
    run(ids, false, c["decode"].get<std::string>());
    run(ids, true, c["decode_skip"].get<std::string>());
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceTest,
                         ::testing::Values("qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atom::tokenizer

namespace atom::tokenizer {
namespace {

class ConfigTest : public ::testing::TestWithParam<std::string> {};

// bos/eos/pad from tokenizer_config.json, with the ids HF gives their text.
TEST_P(ConfigTest, SpecialTokensMatch) {
  const auto ref = test::load_reference(GetParam());
  ASSERT_FALSE(ref.is_null());
  const auto tok = Tokenizer::from_dir(test::model_dir(GetParam()));
  const auto& cfg = ref["config"];
  EXPECT_EQ(tok.bos_token(), cfg["bos_token"]["content"].get<std::string>());
  EXPECT_EQ(tok.bos_id(),
            cfg["bos_token"]["id"].is_null() ? -1 : cfg["bos_token"]["id"].get<int32_t>());
  EXPECT_EQ(tok.eos_token(), cfg["eos_token"]["content"].get<std::string>());
  EXPECT_EQ(tok.eos_id(),
            cfg["eos_token"]["id"].is_null() ? -1 : cfg["eos_token"]["id"].get<int32_t>());
  EXPECT_EQ(tok.pad_token(), cfg["pad_token"]["content"].get<std::string>());
  EXPECT_EQ(tok.pad_id(),
            cfg["pad_token"]["id"].is_null() ? -1 : cfg["pad_token"]["id"].get<int32_t>());
  if (tok.eos_id() >= 0) {
    EXPECT_TRUE(tok.is_special(tok.eos_id()));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ConfigTest,
                         ::testing::Values("qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2"),
                         [](const auto& info) { return info.param; });

// `atom tokenize` / `atom detokenize` print what HF gives for a corpus case.
TEST(TokenizerCli, TokenizeAndDetokenize) {
  const auto ref = test::load_reference("llama2");
  ASSERT_FALSE(ref.is_null());
  const auto& c = ref["cases"][1];  // "Hello, world! How are you today?"
  const std::string text = c["text"].get<std::string>();
  ASSERT_EQ(text.find('\''), std::string::npos);
  auto run = [](const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    while (p && std::fgets(buf, sizeof(buf), p)) out += buf;
    EXPECT_EQ(p ? pclose(p) : -1, 0) << cmd;
    return out;
  };
  auto join = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s;
  };
  const std::string atom_bin = std::string(ATOM_BINARY_DIR) + "/atom";
  const std::string dir = test::model_dir("llama2");
  EXPECT_EQ(run(atom_bin + " tokenize --model " + dir + " '" + text + "'"),
            join(json_ids(c["ids_special"])) + "\n");
  EXPECT_EQ(run(atom_bin + " tokenize --model " + dir + " --no-special '" + text + "'"),
            join(json_ids(c["ids"])) + "\n");
  EXPECT_EQ(run(atom_bin + " detokenize --model " + dir + " " + join(json_ids(c["ids_special"]))),
            c["decode"].get<std::string>() + "\n");
  EXPECT_EQ(run(atom_bin + " detokenize --model " + dir + " --skip-special-tokens " +
                join(json_ids(c["ids_special"]))),
            c["decode_skip"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace atom::tokenizer
