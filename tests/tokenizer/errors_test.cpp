// Bad tokenizer.json input: every unsupported component or malformed field is an atom::Error that
// names the file and the component, never a silent difference.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace atom::tokenizer {
namespace {

const char* kModel = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

std::string make(const std::string& field, const std::string& value,
                 const std::string& model = kModel) {
  std::string j = R"({"version": "1.0", "added_tokens": [], "model": )" + model;
  if (!field.empty()) j += ", \"" + field + "\": " + value;
  return j + "}";
}

// The error message from loading text, or "" when it loads.
std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json_text(text, "snippet.json");
  } catch (const atom::Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& text, std::initializer_list<const char*> parts) {
  const std::string msg = load_error(text);
  ASSERT_FALSE(msg.empty()) << "expected an error for " << text;
  EXPECT_NE(msg.find("snippet.json"), std::string::npos) << msg;
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(TokenizerErrors, ValidSnippetLoads) { EXPECT_EQ(load_error(make("", "")), ""); }

TEST(TokenizerErrors, UnsupportedModelType) {
  expect_error(make("", "", R"({"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a"})"),
               {"WordPiece", "model"});
  expect_error(make("", "", R"({"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 0})"),
               {"Unigram"});
  expect_error(make("", "", R"({"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"})"),
               {"WordLevel"});
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  expect_error(make("normalizer", R"({"type": "Precompiled", "precompiled_charsmap": "AAAA"})"),
               {"normalizer", "Precompiled"});
  expect_error(make("pre_tokenizer", R"({"type": "UnicodeScripts"})"),
               {"pre_tokenizer", "UnicodeScripts"});
  expect_error(
      make(
          "decoder",
          R"({"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": true})"),
      {"decoder", "CTC"});
  expect_error(make("post_processor", R"({"type": "Mystery"})"), {"post_processor", "Mystery"});
  // Nested components name their position.
  expect_error(
      make("pre_tokenizer",
           R"({"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "Nope"}]})"),
      {"pre_tokenizer.pretokenizers[1]", "Nope"});
  expect_error(make("normalizer",
                    R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Nope"}]})"),
               {"normalizer.normalizers[1]", "Nope"});
}

TEST(TokenizerErrors, BadFields) {
  expect_error(
      make(
          "pre_tokenizer",
          R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false})"),
      {"pre_tokenizer", "regex", "(unclosed"});
  expect_error(
      make(
          "pre_tokenizer",
          R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false})"),
      {"Sideways"});
  expect_error(make("pre_tokenizer",
                    R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"})"),
               {"prepend_scheme", "sometimes"});
  expect_error(make("", "", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})"),
               {"merges[0]", "\"b\""});
  expect_error(make("", "", R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]})"),
               {"merged token", "ab"});
  expect_error(
      make("", "", R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b c"]})"),
      {"merges[0]"});
  expect_error(make("", "", R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1})"),
               {"dropout"});
  expect_error(make("", "", R"({"type": "BPE", "merges": []})"), {"vocab"});
  // A token id past kMaxTokenId would size the dense id table (a fuzzer's 444444444: 3.5 GB).
  expect_error(make("", "", R"({"type": "BPE", "vocab": {"a": 444444444}, "merges": []})"),
               {"vocab[\"a\"]", "444444444", "16777215"});
  EXPECT_EQ(load_error(make("", "", R"({"type": "BPE", "vocab": {"a": 16777215}, "merges": []})")),
            "");
  expect_error(
      make(
          "post_processor",
          R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}], "special_tokens": {}})"),
      {"<s>"});
  expect_error(make("decoder", R"({"type": "Strip", "content": "ab", "start": 1, "stop": 0})"),
               {"decoder", "content"});
}

TEST(TokenizerErrors, MalformedJson) {
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0,}, "merges": []}})",
               {"invalid JSON", "line 1"});
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})", {"invalid JSON"});
  expect_error("{\"model\": \n{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a]}}",
               {"line 2"});
  expect_error(R"({"added_tokens": [})", {"invalid JSON"});
  expect_error(R"({"version": "1.0"})", {"model"});
  expect_error("", {"invalid JSON"});
}

TEST(TokenizerErrors, MissingFiles) {
  try {
    Tokenizer::from_dir("/nonexistent/model");
    FAIL() << "expected an error";
  } catch (const atom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atom::tokenizer

namespace atom::tokenizer {
namespace {

// `levels` Sequences of `kind`, each holding the next: {"type": "Sequence", "<list>": [ ... ]}.
std::string nested(const std::string& list, int levels, const std::string& leaf) {
  std::string open = R"({"type": "Sequence", ")" + list + R"(": [)";
  std::string s;
  s.reserve((open.size() + 2) * levels + leaf.size());
  for (int i = 0; i < levels; ++i) s += open;
  s += leaf;
  for (int i = 0; i < levels; ++i) s += "]}";
  return s;
}

// 100,000 nested Sequences once grew the component paths quadratically (9 GB) and then
// overflowed the stack; now the nesting is bounded before any component is built.
TEST(TokenizerErrors, DeeplyNestedComponentsAreRefused) {
  for (const auto& [field, list, leaf] :
       {std::tuple{"normalizer", "normalizers", R"({"type": "Lowercase"})"},
        std::tuple{"pre_tokenizer", "pretokenizers", R"({"type": "Whitespace"})"},
        std::tuple{"decoder", "decoders", R"({"type": "Fuse"})"},
        std::tuple{"post_processor", "processors", R"({"type": "ByteLevel"})"}}) {
    expect_error(make(field, nested(list, 100000, leaf)), {field, "deeper than 64 levels"});
    // A few levels, as real files have, load.
    EXPECT_EQ(load_error(make(field, nested(list, 3, leaf))), "") << field;
  }
  // Nesting inside the model object is bounded the same way.
  expect_error(make("", "",
                    R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "x": )" +
                        std::string(100000, '[') + std::string(100000, ']') + "}"),
               {"model.x", "deeper than 64 levels"});
}

}  // namespace
}  // namespace atom::tokenizer
