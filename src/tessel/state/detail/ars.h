// Internal: ARS-7's key schedule, shared by the portable ars4x32_7 (random.cpp) and the AES
// instruction kernels (sampling.cpp).
#pragma once

#include <cstdint>

#include "tessel/state/random.h"

namespace tessel::detail {

// The eight round keys as 64-bit halves (words 0-1 in lo, 2-3 in hi): the key, then each one
// advanced by the Weyl constants (golden ratio, sqrt 3 - 1).
struct ArsRoundKeys {
  uint64_t lo[8], hi[8];
};

ArsRoundKeys ars_round_keys(const ArsKey& key);

}  // namespace tessel::detail
