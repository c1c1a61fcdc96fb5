// Counter-based random numbers (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2,
// 3"): a value is a pure function of a key and a counter, so every device can generate any element
// of a parameter on its own, in any order, and get the same bits on any mesh.
//
// A parameter's 128-bit key comes from (seed, path) through Philox4x32-10. Element i of the
// parameter takes word i % 4 of the block ars4x32_7({i / 4, 0}, key) (ARS: AES rounds with a Weyl
// key schedule; AES instructions make it the cheapest of the family on CPUs); the initializers
// turn that word into a sample (see initializer.h).
//
//   tessel::ArsKey key = tessel::parameter_key(/*seed=*/0, "decoder/layers/3/mlp/wi/kernel");
//   tessel::Counter128 block = tessel::ars4x32_7({12345 / 4, 0, 0, 0}, key);
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessel {

using Counter128 = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;
using ArsKey = std::array<uint32_t, 4>;

// Ten rounds of Philox4x32 (the Random123 reference algorithm and constants).
Counter128 philox4x32_10(Counter128 counter, PhiloxKey key);

// ARS-7 (Random123's ars4x32 with its default seven rounds): the counter xor the key, six AES
// encryption rounds and a last one, the key advancing by (golden ratio, sqrt 3 - 1) in its two
// 64-bit halves before each. Portable code here; the sampling kernels use AES instructions.
Counter128 ars4x32_7(Counter128 counter, ArsKey key);

// One AES encryption round (SubBytes, ShiftRows, MixColumns, AddRoundKey: x86's aesenc) on a
// 128-bit state held as four little-endian words; `last` leaves out MixColumns (aesenclast).
Counter128 aes_round(Counter128 state, Counter128 round_key, bool last);

// The key of one parameter: the path's 64-bit FNV-1a hash encrypted under the seed.
ArsKey parameter_key(uint64_t seed, std::string_view path);

}  // namespace tessel
