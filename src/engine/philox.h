// Counter-based random numbers (Philox4x32-10, Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11). A draw is a pure function of (key, counter): the sampler keys it by the
// request's seed and counts by the output position, so what a request samples never depends on
// which other requests share its batch, on chunking, or on preemption. The same function is easy
// to evaluate inside a GPU kernel, so a GPU sampler can reproduce the CPU one's draws exactly.
#pragma once

#include <array>
#include <cstdint>

namespace atom {

using PhiloxBlock = std::array<uint32_t, 4>;

constexpr PhiloxBlock philox4x32_10(PhiloxBlock ctr, uint64_t key64) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  uint32_t k0 = static_cast<uint32_t>(key64), k1 = static_cast<uint32_t>(key64 >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Purposes of a draw, so that independent uses of one (seed, position) never share bits.
enum class RandomStream : uint32_t { kSample = 0 };

// A uniform double in [0, 1) with 53 random bits, for draw (seed, position, stream).
constexpr double philox_uniform(uint64_t seed, uint64_t position,
                                RandomStream stream = RandomStream::kSample) {
  const PhiloxBlock r =
      philox4x32_10({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                     static_cast<uint32_t>(stream), 0u},
                    seed);
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace atom
