// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011): a value is a pure function of
// a key and a counter, so every device can generate any element of a parameter on its own, in any
// order, and get the same bits on any mesh. A parameter's key comes from (seed, path).
//
//   tessel::PhiloxKey key = tessel::parameter_key(/*seed=*/0, "decoder/layers/3/mlp/wi/kernel");
//   double u = tessel::uniform01(key, /*element=*/12345);     // in [0, 1)
//   double z = tessel::standard_normal(key, 12345);
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessel {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Ten rounds of Philox4x32 (the Random123 reference algorithm and constants).
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// The key of one parameter: the path's 64-bit FNV-1a hash encrypted under the seed.
PhiloxKey parameter_key(uint64_t seed, std::string_view path);

// The four words for element `index`, draw `draw` (draws > 0 serve rejection sampling).
inline PhiloxCounter element_bits(const PhiloxKey& key, uint64_t index, uint32_t draw = 0) {
  return philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), draw, 0}, key);
}

// In [0, 1), 53 random bits.
double uniform01(const PhiloxKey& key, uint64_t index, uint32_t draw = 0);
// Box-Muller over two 53-bit uniforms.
double standard_normal(const PhiloxKey& key, uint64_t index, uint32_t draw = 0);
// Standard normal conditioned on [lower, upper] (rejection; each draw is its own counter).
double truncated_standard_normal(const PhiloxKey& key, uint64_t index, double lower, double upper);

}  // namespace tessel
