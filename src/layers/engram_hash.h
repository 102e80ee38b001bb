// Engram's n-gram hashing (DeepSeek-V4.1; deepseek-ai/Engram's engram_demo_v1.py, ROCm/ATOM's
// atom/model_ops/engram.py): which rows of a layer's n-gram embedding table each position reads.
//
// For an engram layer L with multipliers m[0..N) (N = engram_max_ngram_size) and, per n-gram order
// n = 2..N, engram_n_heads hash heads with table sizes p (distinct primes):
//   shifted[k][t] = ids[t - k], or pad_id where t - k < 0
//   mix_n[t]      = XOR_{k < n} shifted[k][t] * m[k]          (int64, wrapping)
//   row[t][h]     = mix_n[t] mod p_h + offset_h               (mod as numpy's: in [0, p_h))
// with heads ordered by n-gram order then head and offset_h the sum of the earlier heads' sizes.
//   m = default_rng(seed + 10007 L).integers(0, half_bound, size=N, dtype=int64) * 2 + 1,
//   half_bound = max(1, (INT64_MAX / compressed_vocab_size) / 2)
// numpy's Generator (SeedSequence, PCG64, the bounded draw) is reimplemented in numpy_random below,
// bit for bit. The primes are found per (layer, order, head) in that order, each the first prime
// above the previous head's (above engram_vocab_size - 1 for an order's first head) that no earlier
// head of any layer took; each layer's total is checked against engram_num_embeddings.
//
// The ids hashed are compressed ids: the reference first maps every token id through its
// compressed tokenizer (tokens that normalise to the same text share an id; negative ids pass
// through). That mapping, and the compressed id of engram_pad_token_id, are not built here; callers
// pass ids and pad_id already compressed. Tests: tests/unit/engram_hash_test.cpp against
// tools/engram_reference.py (numpy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loader/hf_config.h"

namespace atom {

// numpy.random's default generator, as numpy 1.17+ computes it.
namespace numpy_random {

// SeedSequence(entropy).generate_state(n_words, np.uint32): the pool of 4 words mixed from the
// entropy's 32-bit words (least significant first), then hashed out.
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, size_t n_words);

// PCG64 (128-bit LCG, XSL-RR output) seeded as numpy.random.PCG64(seed) / default_rng(seed).
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed);
  uint64_t next64();
  // The low half of a 64-bit output; the high half is kept and returned by the next call.
  uint32_t next32();

 private:
  __extension__ typedef unsigned __int128 u128;
  u128 state_ = 0;
  u128 inc_ = 0;
  bool has32_ = false;
  uint32_t buffered32_ = 0;
};

// Generator.integers(low, high, size=n, dtype=np.int64) with high exclusive: Lemire's bounded
// draw, on 32-bit outputs when high - low - 1 fits in 32 bits. Requires low < high.
std::vector<int64_t> integers_int64(Pcg64& g, int64_t low, int64_t high, size_t n);

}  // namespace numpy_random

// The engram_* fields of a text config.
struct EngramConfig {
  std::vector<int64_t> layer_ids;       // engram_layer_ids
  std::vector<int64_t> num_embeddings;  // engram_num_embeddings: table rows per layer
  int64_t max_ngram_size = 0;           // engram_max_ngram_size (N); orders 2..N
  std::vector<int64_t> vocab_sizes;     // engram_vocab_size, one per order (one int: all orders)
  int64_t n_heads = 0;                  // engram_n_heads, per order
  int64_t head_dim = 0;                 // engram_head_dim
  int64_t pad_token_id = 0;             // engram_pad_token_id (a token id, not compressed)
  int64_t compressed_vocab_size = 0;    // engram_compressed_vocab_size
  int64_t seed = 0;                     // engram_seed
  int64_t kernel_size = 4;              // engram_kernel_size
  std::string where;                    // the file, for messages

  int64_t num_hash_heads() const { return (max_ngram_size - 1) * n_heads; }

  // False when the config has no engram_layer_ids (no engram); otherwise every field is checked,
  // a bad one an Error naming it.
  static bool present(const ConfigFields& f) { return f.has("engram_layer_ids"); }
  static EngramConfig parse(const ConfigFields& f);
};

// Multipliers, head sizes and offsets of every engram layer, and the hash itself.
class EngramHash {
 public:
  // Derives the multipliers and primes; an Error naming engram_num_embeddings when a layer's
  // primes do not sum to the rows it declares.
  explicit EngramHash(EngramConfig config);

  const EngramConfig& config() const { return config_; }
  int64_t num_hash_heads() const { return config_.num_hash_heads(); }
  // Per layer (an Error for a layer that is not an engram layer): N odd multipliers, and the
  // num_hash_heads() table sizes and first rows.
  const std::vector<int64_t>& multipliers(int64_t layer_id) const;
  const std::vector<int64_t>& head_sizes(int64_t layer_id) const;
  const std::vector<int64_t>& head_offsets(int64_t layer_id) const;

  // Table rows of positions [begin, ids.size()) of one sequence of compressed ids, row-major
  // [ids.size() - begin, num_hash_heads()]; the ids before `begin` are the n-grams' history.
  void rows(std::span<const int64_t> ids, int64_t layer_id, int64_t pad_id, std::span<int64_t> out,
            size_t begin = 0) const;
  std::vector<int64_t> rows(std::span<const int64_t> ids, int64_t layer_id, int64_t pad_id,
                            size_t begin = 0) const;

 private:
  struct Layer {
    std::vector<int64_t> multipliers, head_sizes, head_offsets;
  };
  const Layer& layer(int64_t layer_id) const;

  EngramConfig config_;
  std::vector<Layer> layers_;  // as config_.layer_ids
};

}  // namespace atom
