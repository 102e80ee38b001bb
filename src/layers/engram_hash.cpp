#include "layers/engram_hash.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "core/error.h"

namespace atom {
namespace numpy_random {

namespace {

// SeedSequence's hashing constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> kXShift);
}

uint32_t mix(uint32_t x, uint32_t y) {
  const uint32_t r = kMixMultL * x - kMixMultR * y;
  return r ^ (r >> kXShift);
}

}  // namespace

std::vector<uint32_t> seed_sequence_state(uint64_t entropy, size_t n_words) {
  // An integer's 32-bit words, least significant first; zero is one word.
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(entropy));
    entropy >>= 32;
  } while (entropy != 0);

  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < words.size() ? words[i] : 0, hash_const);
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < words.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      pool[dst] = mix(pool[dst], hashmix(words[src], hash_const));

  std::vector<uint32_t> out(n_words);
  uint32_t out_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize] ^ out_const;
    out_const *= kMultB;
    v *= out_const;
    out[i] = v ^ (v >> kXShift);
  }
  return out;
}

namespace {

__extension__ typedef unsigned __int128 u128;

constexpr u128 kPcgMultiplier =
    (static_cast<u128>(0x2360ed051fc65da4ull) << 64) | 0x4385df649fccf645ull;

}  // namespace

Pcg64::Pcg64(uint64_t seed) {
  // Four 64-bit words of the seed sequence (little-endian pairs of 32-bit words): the initial
  // state from the first two, the stream from the last two, each pair high word first.
  const std::vector<uint32_t> s = seed_sequence_state(seed, 8);
  uint64_t w[4];
  for (int i = 0; i < 4; ++i) w[i] = static_cast<uint64_t>(s[2 * i + 1]) << 32 | s[2 * i];
  const u128 init_state = static_cast<u128>(w[0]) << 64 | w[1];
  const u128 init_seq = static_cast<u128>(w[2]) << 64 | w[3];
  state_ = 0;
  inc_ = init_seq << 1 | 1;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += init_state;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t Pcg64::next64() {
  state_ = state_ * kPcgMultiplier + inc_;
  const uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (folded >> rot) | (folded << ((64 - rot) & 63));
}

uint32_t Pcg64::next32() {
  if (has32_) {
    has32_ = false;
    return buffered32_;
  }
  const uint64_t v = next64();
  has32_ = true;
  buffered32_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v);
}

std::vector<int64_t> integers_int64(Pcg64& g, int64_t low, int64_t high, size_t n) {
  ATOM_CHECK(low < high, "integers: low {} must be below high {}", low, high);
  // The closed range [low, low + rng], in unsigned arithmetic as numpy does.
  const uint64_t off = static_cast<uint64_t>(low);
  const uint64_t rng = static_cast<uint64_t>(high) - off - 1;
  std::vector<int64_t> out(n);
  auto put = [&](size_t i, uint64_t v) { out[i] = static_cast<int64_t>(off + v); };
  if (rng == 0) {
    for (size_t i = 0; i < n; ++i) put(i, 0);
  } else if (rng <= 0xffffffffull) {
    if (rng == 0xffffffffull) {
      for (size_t i = 0; i < n; ++i) put(i, g.next32());
    } else {
      const uint32_t excl = static_cast<uint32_t>(rng) + 1;
      const uint32_t threshold = static_cast<uint32_t>(-excl) % excl;
      for (size_t i = 0; i < n; ++i) {
        uint64_t m = static_cast<uint64_t>(g.next32()) * excl;
        if (static_cast<uint32_t>(m) < excl)
          while (static_cast<uint32_t>(m) < threshold) m = static_cast<uint64_t>(g.next32()) * excl;
        put(i, m >> 32);
      }
    }
  } else if (rng == ~0ull) {
    for (size_t i = 0; i < n; ++i) put(i, g.next64());
  } else {
    const uint64_t excl = rng + 1;
    const uint64_t threshold = (0 - excl) % excl;
    for (size_t i = 0; i < n; ++i) {
      u128 m = static_cast<u128>(g.next64()) * excl;
      if (static_cast<uint64_t>(m) < excl)
        while (static_cast<uint64_t>(m) < threshold) m = static_cast<u128>(g.next64()) * excl;
      put(i, static_cast<uint64_t>(m >> 64));
    }
  }
  return out;
}

}  // namespace numpy_random

namespace {

constexpr int64_t kLayerSeedStride = 10007;

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<numpy_random::u128>(a) * b % m);
}

uint64_t pow_mod(uint64_t b, uint64_t e, uint64_t m) {
  uint64_t r = 1 % m;
  for (b %= m; e; e >>= 1, b = mul_mod(b, b, m))
    if (e & 1) r = mul_mod(r, b, m);
  return r;
}

// Deterministic Miller-Rabin: these bases decide every 64-bit n.
bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) d >>= 1, ++s;
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

}  // namespace

EngramConfig EngramConfig::parse(const ConfigFields& f) {
  EngramConfig c;
  c.where = f.where();
  c.layer_ids = f.get_int_list("engram_layer_ids");
  if (c.layer_ids.empty()) f.bad("engram_layer_ids", "must name at least one layer");
  for (size_t i = 0; i < c.layer_ids.size(); ++i) {
    if (c.layer_ids[i] < 0 || c.layer_ids[i] > INT32_MAX)
      f.bad("engram_layer_ids", fmt::format("must be layer indices, got {}", c.layer_ids[i]));
    if (std::count(c.layer_ids.begin(), c.layer_ids.begin() + i, c.layer_ids[i]))
      f.bad("engram_layer_ids", fmt::format("names layer {} twice", c.layer_ids[i]));
  }
  c.num_embeddings = f.get_int_list("engram_num_embeddings");
  if (c.num_embeddings.size() != c.layer_ids.size())
    f.bad("engram_num_embeddings", fmt::format("must give one count per engram layer ({}), got {}",
                                               c.layer_ids.size(), c.num_embeddings.size()));
  for (int64_t n : c.num_embeddings)
    if (n < 1) f.bad("engram_num_embeddings", fmt::format("must be positive, got {}", n));
  c.max_ngram_size = f.get_int("engram_max_ngram_size", IntRange{2, 64});
  c.vocab_sizes = f.get_int_list("engram_vocab_size");
  if (c.vocab_sizes.size() == 1) c.vocab_sizes.assign(c.max_ngram_size - 1, c.vocab_sizes[0]);
  if (static_cast<int64_t>(c.vocab_sizes.size()) != c.max_ngram_size - 1)
    f.bad("engram_vocab_size",
          fmt::format("must be one size or one per n-gram order 2..{} ({}), got {}",
                      c.max_ngram_size, c.max_ngram_size - 1, c.vocab_sizes.size()));
  for (int64_t v : c.vocab_sizes)
    if (v < 1 || v > (int64_t{1} << 48))
      f.bad("engram_vocab_size", fmt::format("must be in [1, 2^48], got {}", v));
  c.n_heads = f.get_int("engram_n_heads", IntRange{1, 1 << 16});
  c.head_dim = f.get_int("engram_head_dim", IntRange{1, 1 << 20});
  c.pad_token_id = f.get_int("engram_pad_token_id");
  c.compressed_vocab_size =
      f.get_int("engram_compressed_vocab_size", IntRange{1, std::numeric_limits<int64_t>::max()});
  // seed + 10007 * layer_id is numpy's seed: non-negative, and kept within 64 bits.
  c.seed = f.get_int("engram_seed", 0, IntRange{0, int64_t{1} << 62});
  c.kernel_size = f.get_int("engram_kernel_size", 4, IntRange{1, 1 << 16});
  return c;
}

EngramHash::EngramHash(EngramConfig config) : config_(std::move(config)) {
  const EngramConfig& c = config_;
  ATOM_CHECK(c.max_ngram_size >= 2 && c.n_heads >= 1 && c.compressed_vocab_size >= 1 &&
                 static_cast<int64_t>(c.vocab_sizes.size()) == c.max_ngram_size - 1 &&
                 c.num_embeddings.size() == c.layer_ids.size() && c.seed >= 0,
             "{}: engram config is incomplete", c.where);
  const int64_t half_bound =
      std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / c.compressed_vocab_size / 2);
  std::unordered_set<uint64_t> seen;
  for (size_t li = 0; li < c.layer_ids.size(); ++li) {
    const int64_t layer_id = c.layer_ids[li];
    Layer L;
    numpy_random::Pcg64 g(static_cast<uint64_t>(c.seed) + static_cast<uint64_t>(kLayerSeedStride) *
                                                              static_cast<uint64_t>(layer_id));
    L.multipliers =
        numpy_random::integers_int64(g, 0, half_bound, static_cast<size_t>(c.max_ngram_size));
    for (int64_t& m : L.multipliers) m = m * 2 + 1;  // below INT64_MAX: half_bound <= INT64_MAX/2

    int64_t total = 0;
    for (int64_t order = 2; order <= c.max_ngram_size; ++order) {
      uint64_t start = static_cast<uint64_t>(c.vocab_sizes[order - 2] - 1);
      for (int64_t h = 0; h < c.n_heads; ++h) {
        uint64_t p = start + 1;
        while (seen.count(p) || !is_prime(p)) ++p;
        seen.insert(p);
        L.head_offsets.push_back(total);
        L.head_sizes.push_back(static_cast<int64_t>(p));
        if (__builtin_add_overflow(total, static_cast<int64_t>(p), &total))
          fail("{}: engram layer {}'s tables exceed 2^63 rows", c.where, layer_id);
        start = p;
      }
    }
    if (total != c.num_embeddings[li])
      fail(
          "{}: field 'engram_num_embeddings' gives {} rows for engram layer {}, but its {} hash "
          "heads' tables (primes from engram_vocab_size, engram_max_ngram_size and engram_n_heads) "
          "hold {}: the head layout does not match the trained tables",
          c.where, c.num_embeddings[li], layer_id, L.head_sizes.size(), total);
    layers_.push_back(std::move(L));
  }
}

const EngramHash::Layer& EngramHash::layer(int64_t layer_id) const {
  const auto it = std::find(config_.layer_ids.begin(), config_.layer_ids.end(), layer_id);
  if (it == config_.layer_ids.end()) fail("layer {} is not an engram layer", layer_id);
  return layers_[static_cast<size_t>(it - config_.layer_ids.begin())];
}

const std::vector<int64_t>& EngramHash::multipliers(int64_t layer_id) const {
  return layer(layer_id).multipliers;
}
const std::vector<int64_t>& EngramHash::head_sizes(int64_t layer_id) const {
  return layer(layer_id).head_sizes;
}
const std::vector<int64_t>& EngramHash::head_offsets(int64_t layer_id) const {
  return layer(layer_id).head_offsets;
}

void EngramHash::rows(std::span<const int64_t> ids, int64_t layer_id, int64_t pad_id,
                      std::span<int64_t> out, size_t begin) const {
  const Layer& L = layer(layer_id);
  const size_t n = static_cast<size_t>(config_.max_ngram_size);
  const size_t heads = static_cast<size_t>(config_.n_heads);
  const size_t width = static_cast<size_t>(num_hash_heads());
  ATOM_CHECK(begin <= ids.size(), "engram rows: begin {} past the {} ids", begin, ids.size());
  ATOM_CHECK(out.size() == (ids.size() - begin) * width, "engram rows: {} outputs for {} x {}",
             out.size(), ids.size() - begin, width);
  for (size_t t = begin; t < ids.size(); ++t) {
    int64_t* row = out.data() + (t - begin) * width;
    // int64 products and XOR wrap as numpy's do: computed on the unsigned bits.
    uint64_t mix = 0;
    for (size_t k = 0; k < n; ++k) {
      const int64_t id = t >= k ? ids[t - k] : pad_id;
      mix ^= static_cast<uint64_t>(id) * static_cast<uint64_t>(L.multipliers[k]);
      if (k == 0) continue;  // orders start at 2
      const int64_t v = static_cast<int64_t>(mix);
      const size_t base = (k - 1) * heads;
      for (size_t h = 0; h < heads; ++h) {
        const int64_t p = L.head_sizes[base + h];
        int64_t r = v % p;  // numpy's modulo takes the divisor's sign: p > 0, so [0, p)
        if (r < 0) r += p;
        row[base + h] = r + L.head_offsets[base + h];
      }
    }
  }
}

std::vector<int64_t> EngramHash::rows(std::span<const int64_t> ids, int64_t layer_id,
                                      int64_t pad_id, size_t begin) const {
  std::vector<int64_t> out((ids.size() - std::min(begin, ids.size())) *
                           static_cast<size_t>(num_hash_heads()));
  rows(ids, layer_id, pad_id, out, begin);
  return out;
}

}  // namespace atom
