#include "tessel/state/random.h"


namespace tessel {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (golden ratio, sqrt 3)

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

}  // namespace tessel
