// Internal: ARS-7's key schedule, shared by the portable ars4x32_7 (random.cpp) and the AES
// instruction kernels (sampling.cpp). Inline, so that the baseline-only build of the kernels
// (tests/state/sampling_baseline.cpp) carries its own copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/state/random.h"

namespace tessel::detail {

// The eight round keys as 64-bit halves (words 0-1 in lo, 2-3 in hi): the key, then each one
// advanced by the Weyl constants (golden ratio, sqrt 3 - 1).
struct ArsRoundKeys {
  uint64_t lo[8], hi[8];
};

inline ArsRoundKeys ars_round_keys(const ArsKey& key) {
  ArsRoundKeys k{};
  k.lo[0] = key[0] | uint64_t{key[1]} << 32;
  k.hi[0] = key[2] | uint64_t{key[3]} << 32;
  for (int r = 1; r < 8; ++r) {
    k.lo[r] = k.lo[r - 1] + 0x9E3779B97F4A7C15ull;
    k.hi[r] = k.hi[r - 1] + 0xBB67AE8584CAA73Bull;
  }
  return k;
}

// Round key r as four words.
inline Counter128 ars_round_key(const ArsRoundKeys& rk, int r) {
  return {static_cast<uint32_t>(rk.lo[r]), static_cast<uint32_t>(rk.lo[r] >> 32), static_cast<uint32_t>(rk.hi[r]),
          static_cast<uint32_t>(rk.hi[r] >> 32)};
}

// ars4x32_7 under keys already scheduled (a stream of blocks schedules them once).
inline Counter128 ars4x32_7(Counter128 c, const ArsRoundKeys& rk) {
  const Counter128 k0 = ars_round_key(rk, 0);
  for (size_t w = 0; w < 4; ++w) c[w] ^= k0[w];
  for (int r = 1; r <= 7; ++r) c = aes_round(c, ars_round_key(rk, r), r == 7);
  return c;
}

}  // namespace tessel::detail
