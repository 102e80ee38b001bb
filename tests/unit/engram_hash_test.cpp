// Engram's n-gram hashing against numpy (tests/fixtures/references/engram_hash.json, written by
// tools/engram_reference.py): numpy's SeedSequence, PCG64 and Generator.integers bit for bit, the
// multipliers, the primes and offsets, and the table rows, exactly.
#include "layers/engram_hash.h"

#include <gtest/gtest.h>

#include "common/fixtures.h"
#include "common/test_util.h"

namespace atom::test {
namespace {

using json = nlohmann::json;

const json& reference() {
  static const json j =
      json_load_file(source_dir() + "/tests/fixtures/references/engram_hash.json");
  return j;
}

std::vector<int64_t> ints(const json& a) { return a.get<std::vector<int64_t>>(); }

TEST(EngramHash, SeedSequenceMatchesNumpy) {
  for (const json& c : reference()["seed_sequence"]) {
    const auto want = c["state32"].get<std::vector<uint32_t>>();
    EXPECT_EQ(numpy_random::seed_sequence_state(c["entropy"].get<uint64_t>(), want.size()), want)
        << "entropy " << c["entropy"];
  }
}

TEST(EngramHash, Pcg64MatchesNumpy) {
  for (const json& c : reference()["pcg64_raw"]) {
    numpy_random::Pcg64 g(c["seed"].get<uint64_t>());
    for (const json& v : c["raw"]) ASSERT_EQ(g.next64(), v.get<uint64_t>()) << "seed " << c["seed"];
  }
}

TEST(EngramHash, IntegersMatchNumpyOnEveryPath) {
  int n = 0;
  for (const json& c : reference()["integers"]) {
    numpy_random::Pcg64 g(c["seed"].get<uint64_t>());
    const auto want = ints(c["values"]);
    EXPECT_EQ(numpy_random::integers_int64(g, c["low"], c["high"], want.size()), want)
        << "seed " << c["seed"] << ", [" << c["low"] << ", " << c["high"] << ")";
    ++n;
  }
  EXPECT_GE(n, 90);
}

TEST(EngramHash, MultipliersMatchNumpy) {
  for (const json& c : reference()["multipliers"]) {
    EngramConfig cfg;
    cfg.layer_ids = {c["layer_id"].get<int64_t>()};
    cfg.max_ngram_size = c["max_ngram_size"];
    cfg.vocab_sizes.assign(cfg.max_ngram_size - 1, 10);
    cfg.n_heads = 1;
    cfg.compressed_vocab_size = c["compressed_vocab_size"];
    cfg.seed = c["seed"];
    // Primes above 9: 11, 13, 17 for the three orders.
    cfg.num_embeddings = {11 + 13 + 17};
    const EngramHash hash(cfg);
    EXPECT_EQ(hash.multipliers(cfg.layer_ids[0]), ints(c["multipliers"]))
        << "seed " << cfg.seed << " layer " << cfg.layer_ids[0] << " vocab "
        << cfg.compressed_vocab_size;
  }
}

TEST(EngramHash, ConfigsMatchNumpy) {
  int64_t cases = 0, positions = 0;
  for (const json& entry : reference()["configs"]) {
    const EngramConfig cfg = EngramConfig::parse(ConfigFields(entry["config"], "config.json"));
    const EngramHash hash(cfg);
    const auto width = static_cast<size_t>(hash.num_hash_heads());
    for (const json& l : entry["layers"]) {
      const int64_t layer = l["layer_id"];
      EXPECT_EQ(hash.multipliers(layer), ints(l["multipliers"]));
      EXPECT_EQ(hash.head_sizes(layer), ints(l["head_sizes"]));
      EXPECT_EQ(hash.head_offsets(layer), ints(l["head_offsets"]));
      for (const json& c : l["cases"]) {
        const auto ids = ints(c["ids"]);
        const auto want = ints(c["rows"]);
        EXPECT_EQ(hash.rows(ids, layer, l["pad_id"]), want) << "layer " << layer;
        // Hashing a suffix with the earlier ids as history gives the same rows.
        for (size_t begin = 1; begin <= ids.size(); begin += 3) {
          const std::vector<int64_t> tail(want.begin() + static_cast<ptrdiff_t>(begin * width),
                                          want.end());
          EXPECT_EQ(hash.rows(ids, layer, l["pad_id"], begin), tail) << "begin " << begin;
        }
        ++cases;
        positions += static_cast<int64_t>(ids.size());
      }
    }
  }
  EXPECT_GE(cases, 28);
  EXPECT_GE(positions, 28 * 9);
}

json small_config() {
  return json::parse(R"({"engram_layer_ids": [1, 15], "engram_max_ngram_size": 3,
    "engram_vocab_size": 1000, "engram_n_heads": 4, "engram_head_dim": 32,
    "engram_pad_token_id": 2, "engram_compressed_vocab_size": 700,
    "engram_num_embeddings": [8214, 8612]})");
}

TEST(EngramHash, ConfigParsing) {
  ConfigFields none(json::parse(R"({"hidden_size": 8})"), "config.json");
  EXPECT_FALSE(EngramConfig::present(none));
  const EngramConfig c = EngramConfig::parse(ConfigFields(small_config(), "config.json"));
  EXPECT_EQ(c.vocab_sizes, (std::vector<int64_t>{1000, 1000}));
  EXPECT_EQ(c.seed, 0);
  EXPECT_EQ(c.kernel_size, 4);
  EXPECT_EQ(c.num_hash_heads(), 8);

  auto bad = [](const char* key, json value, const char* fragment) {
    json j = small_config();
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
    EXPECT_ERROR_CONTAINS(EngramConfig::parse(ConfigFields(j, "config.json")), "config.json",
                          std::string("'") + key + "'", fragment);
  };
  bad("engram_layer_ids", json::array({3, 3}), "twice");
  bad("engram_layer_ids", json::array(), "at least one");
  bad("engram_num_embeddings", json::array({8214}), "one count per engram layer");
  bad("engram_num_embeddings", nullptr, "missing");
  bad("engram_max_ngram_size", 1, "must be in");
  bad("engram_vocab_size", json::array({1000, 1000, 1000}), "one per n-gram order");
  bad("engram_n_heads", 0, "must be in");
  bad("engram_compressed_vocab_size", "700", "integer");
  bad("engram_seed", -1, "must be in");
  bad("engram_pad_token_id", nullptr, "missing");
}

TEST(EngramHash, RowCountsMustMatchTheCheckpoint) {
  json j = small_config();
  const EngramConfig good = EngramConfig::parse(ConfigFields(j, "config.json"));
  EXPECT_NO_THROW(EngramHash{good});
  j["engram_num_embeddings"] = {8214, 8613};
  const EngramConfig off = EngramConfig::parse(ConfigFields(j, "config.json"));
  EXPECT_ERROR_CONTAINS(EngramHash{off}, "config.json", "'engram_num_embeddings'", "8613",
                        "layer 15", "8612");
  EXPECT_ERROR_CONTAINS(EngramHash(good).rows(std::vector<int64_t>{1, 2}, 3, 0), "layer 3",
                        "not an engram layer");
}

}  // namespace
}  // namespace atom::test
