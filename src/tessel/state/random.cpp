#include "tessel/state/random.h"

#include "tessel/state/detail/ars.h"

#include <bit>

namespace tessel {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox round multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Philox key schedule (golden ratio, sqrt 3)

// Multiplication in GF(2^8) modulo AES's polynomial x^8 + x^4 + x^3 + x + 1.
constexpr uint8_t gf_mul(uint8_t a, uint8_t b) {
  uint8_t p = 0;
  for (int i = 0; i < 8; ++i) {
    if (b & 1) p ^= a;
    const bool carry = a & 0x80;
    a = static_cast<uint8_t>(a << 1);
    if (carry) a ^= 0x1b;
    b >>= 1;
  }
  return p;
}

constexpr uint8_t rotl8(uint8_t x, int s) { return static_cast<uint8_t>((x << s) | (x >> (8 - s))); }

// AES's S-box from its definition: the multiplicative inverse (through powers of the generator
// 3: x = 3^k has inverse 3^(255 - k)), then the affine map.
constexpr std::array<uint8_t, 256> make_sbox() {
  std::array<uint8_t, 256> power{}, log{};
  uint8_t x = 1;
  for (int k = 0; k < 255; ++k) {
    power[static_cast<size_t>(k)] = x;
    log[x] = static_cast<uint8_t>(k);
    x = gf_mul(x, 3);
  }
  std::array<uint8_t, 256> box{};
  for (size_t v = 0; v < 256; ++v) {
    const uint8_t inv = v == 0 ? 0 : power[(255 - log[v]) % 255];
    box[v] = static_cast<uint8_t>(inv ^ rotl8(inv, 1) ^ rotl8(inv, 2) ^ rotl8(inv, 3) ^ rotl8(inv, 4) ^ 0x63);
  }
  return box;
}
constexpr std::array<uint8_t, 256> kSbox = make_sbox();
static_assert(kSbox[0] == 0x63 && kSbox[1] == 0x7c && kSbox[0x53] == 0xed);  // FIPS-197's examples

constexpr std::array<uint32_t, 256> make_mix() {
  std::array<uint32_t, 256> mix{};
  for (size_t x = 0; x < 256; ++x) {
    const uint8_t s = kSbox[x];
    mix[x] = uint32_t{gf_mul(s, 2)} | uint32_t{s} << 8 | uint32_t{s} << 16 | uint32_t{gf_mul(s, 3)} << 24;
  }
  return mix;
}
constexpr std::array<uint32_t, 256> kMix = make_mix();

}  // namespace

Counter128 philox4x32_10(Counter128 c, PhiloxKey k) {
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

Counter128 aes_round(Counter128 state, Counter128 round_key, bool last) {
  // Word c holds column c of the state, row r in byte r. Output column c takes row r from input
  // column c + r (ShiftRows); kMix[x] is the column that row 0's S-box output x contributes after
  // MixColumns (2 s, s, s, 3 s), and rows 1 to 3 contribute it rotated by 8 r bits.
  auto byte = [&](size_t column, int row) { return (state[column % 4] >> (8 * row)) & 0xffu; };
  Counter128 out{};
  for (size_t c = 0; c < 4; ++c) {
    uint32_t v = 0;
    for (int r = 0; r < 4; ++r) {
      const uint32_t x = byte(c + static_cast<size_t>(r), r);
      v ^= last ? uint32_t{kSbox[x]} << (8 * r) : std::rotl(kMix[x], 8 * r);
    }
    out[c] = v ^ round_key[c];
  }
  return out;
}

Counter128 ars4x32_7(Counter128 c, ArsKey k) { return detail::ars4x32_7(c, detail::ars_round_keys(k)); }

ArsKey parameter_key(uint64_t seed, std::string_view path) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bit
  for (char ch : path) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ull;
  }
  return philox4x32_10({static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), 0x7e55e1u, 0},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

}  // namespace tessel
