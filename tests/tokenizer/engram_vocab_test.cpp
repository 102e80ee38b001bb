// Engram's compressed vocabulary (tokenizer/engram_vocab.h) for DeepSeek-V3's tokenizer against
// tools/engram_vocab_reference.py (Python's Unicode tables on tokenizer.json, no atom code): the
// compressed size, a checksum of the whole lookup and 400-odd chosen ids.
#include "tokenizer/engram_vocab.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"

namespace atom::tokenizer {
namespace {

// The reference's checksum: Σ over ids of h = h · 1000003 + (i + 1)(lookup[i] + 1), mod 2^61 - 1.
uint64_t checksum(const std::vector<int64_t>& lookup) {
  const unsigned __int128 m = (uint64_t{1} << 61) - 1;
  unsigned __int128 h = 0;
  for (size_t i = 0; i < lookup.size(); ++i)
    h = (h * 1000003 +
         static_cast<unsigned __int128>(i + 1) * static_cast<unsigned __int128>(lookup[i] + 1)) %
        m;
  return static_cast<uint64_t>(h);
}

TEST(EngramVocab, DeepSeekV3MatchesThePythonReference) {
  const Tokenizer tok = Tokenizer::from_dir(test::model_dir("deepseek_v3"));
  std::ifstream f(std::string(ATOM_SOURCE_DIR) +
                  "/tests/fixtures/references/engram_vocab_deepseek_v3.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json ref = nlohmann::json::parse(f);
  const CompressedVocab v = engram_compressed_vocab(tok);
  ASSERT_EQ(static_cast<int64_t>(v.lookup.size()), ref["vocab_size"].get<int64_t>());
  int bad = 0;
  for (const auto& [id, want] : ref["sample"].items()) {
    const int64_t got = v.lookup.at(static_cast<size_t>(std::stoll(id)));
    if (got != want.get<int64_t>() && ++bad <= 10)
      ADD_FAILURE() << "token " << id << " ("
                    << test::show(
                           tok.decode(std::vector<int32_t>{static_cast<int32_t>(std::stoll(id))}))
                    << "): compressed id " << got << ", the reference " << want;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(v.size, ref["compressed_size"].get<int64_t>());
  EXPECT_EQ(checksum(v.lookup), ref["checksum"].get<uint64_t>());
  // Normalisation merges: an upper-case and an accented spelling share their plain form's id.
  const auto id_of = [&](const std::string& t) {
    const std::vector<int32_t> ids = tok.encode(t, false);
    EXPECT_EQ(ids.size(), 1u) << t;
    return v(ids.at(0));
  };
  EXPECT_EQ(id_of(" The"), id_of(" the"));
  EXPECT_NE(id_of(" the"), id_of(" a"));
  EXPECT_EQ(v(-1), -1);  // padding passes through
}

}  // namespace
}  // namespace atom::tokenizer
