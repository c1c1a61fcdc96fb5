// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011): a value is a pure function of
// a key and a counter, so every device can generate any element of a parameter on its own, in any
// order, and get the same bits on any mesh. A parameter's key comes from (seed, path).
//
// Element i of a parameter takes word i % 4 of the block philox4x32_10({i / 4, 0}, key); the
// initializers turn that word into a sample (see initializer.h).
//
//   tessel::PhiloxKey key = tessel::parameter_key(/*seed=*/0, "decoder/layers/3/mlp/wi/kernel");
//   tessel::PhiloxCounter block = tessel::philox4x32_10({12345 / 4, 0, 0, 0}, key);
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

}  // namespace tessel
