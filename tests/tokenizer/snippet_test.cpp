// Each component and option on its own: the small tokenizer.json files of tests/tokenizer/snippets
// run through atom and through the Hugging Face tokenizers library
// (tests/node/tokenizer_reference.js).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace atom::tokenizer {
namespace {

using test::ids_str;
using test::json_ids;
using test::show;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(TokenizerSnippets, MatchReference) {
  const auto ref = test::load_reference("snippets");
  ASSERT_TRUE(ref.is_array());
  ASSERT_GE(ref.size(), 60u);
  int failures = 0, checked = 0;
  for (const auto& snippet : ref) {
    const std::string file = snippet["file"].get<std::string>();
    const auto spec = nlohmann::json::parse(
        read_text(std::string(ATOM_SOURCE_DIR) + "/tests/tokenizer/snippets/" + file));
    if (snippet.contains("load_error")) {
      EXPECT_THROW(Tokenizer::from_json_text(spec["tokenizer"].dump(), file), atom::Error)
          << file << ": HF refuses it (" << snippet["load_error"] << "), atom should too";
      continue;
    }
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = std::make_unique<Tokenizer>(Tokenizer::from_json_text(spec["tokenizer"].dump(), file));
    } catch (const atom::Error& e) {
      ADD_FAILURE() << file << ": atom cannot load it: " << e.what();
      continue;
    }
    for (const auto& c : snippet["cases"]) {
      const std::string text = c["text"].get<std::string>();
      for (bool special : {false, true}) {
        const auto expected = json_ids(c[special ? "ids_special" : "ids"]);
        const auto got = tok->encode(text, special);
        ++checked;
        if (got != expected) {
          ++failures;
          ADD_FAILURE() << file << " add_special_tokens=" << special << " text=" << show(text)
                        << "\n  expected " << ids_str(expected) << "\n  atom     " << ids_str(got);
        }
      }
      const auto ids = json_ids(c["ids_special"]);
      for (bool skip : {false, true}) {
        const std::string expected = c[skip ? "decode_skip" : "decode"].get<std::string>();
        const std::string got = tok->decode(ids, skip);
        ++checked;
        if (got != expected) {
          ++failures;
          ADD_FAILURE() << file << " decode skip_special_tokens=" << skip << " ids=" << ids_str(ids)
                        << "\n  expected " << show(expected) << "\n  atom     " << show(got);
        }
        IncrementalDetokenizer detok(*tok, skip);
        std::string streamed;
        for (int32_t id : ids) {
          const std::string piece = detok.add(id);
          EXPECT_TRUE(utf8_is_valid(piece)) << file << ": invalid UTF-8 piece " << show(piece);
          streamed += piece;
        }
        streamed += detok.finish();
        EXPECT_EQ(streamed, expected) << file << " streamed decode, ids=" << ids_str(ids);
      }
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << checked << " checks differ";
}

}  // namespace
}  // namespace atom::tokenizer
