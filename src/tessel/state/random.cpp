#include "tessel/state/random.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (golden ratio, sqrt 3)

double to_unit(uint32_t hi, uint32_t lo) {
  uint64_t bits = (uint64_t{hi} << 21) ^ (lo >> 11);  // 53 bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{kM0} * c[0];
    uint64_t p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

PhiloxKey parameter_key(uint64_t seed, std::string_view path) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bit
  for (char ch : path) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ull;
  }
  PhiloxCounter out = philox4x32_10(
      {static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), 0x7e55e1u, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return {out[0], out[1]};
}

double uniform01(const PhiloxKey& key, uint64_t index, uint32_t draw) {
  PhiloxCounter w = element_bits(key, index, draw);
  return to_unit(w[0], w[1]);
}

double standard_normal(const PhiloxKey& key, uint64_t index, uint32_t draw) {
  PhiloxCounter w = element_bits(key, index, draw);
  double u1 = 1.0 - to_unit(w[0], w[1]);  // (0, 1]: log stays finite
  double u2 = to_unit(w[2], w[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double truncated_standard_normal(const PhiloxKey& key, uint64_t index, double lower, double upper) {
  if (!(lower < upper))
    throw ValueError(fmt::format("truncated normal needs lower < upper, got [{}, {}]", lower, upper));
  // Acceptance is at least 95% for the usual [-2, 2]; a narrow window far in a tail falls back
  // to the nearer bound after many draws rather than looping for ever.
  for (uint32_t draw = 0; draw < 1000; ++draw) {
    double z = standard_normal(key, index, draw);
    if (z >= lower && z <= upper) return z;
  }
  return std::fabs(lower) < std::fabs(upper) ? lower : upper;
}

}  // namespace tessel
