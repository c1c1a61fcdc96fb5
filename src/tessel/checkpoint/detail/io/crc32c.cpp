#include "tessel/checkpoint/detail/io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tessel::detail {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// The CRC register is linear in (register, data) with no constant term, so for a raw register c
// (before the final inversion), crc(c, A || B) = zeros(crc(c, A), |B|) ^ crc(0, B), where zeros
// appends |B| zero bytes. That lets independent streams over A, B, C run side by side.
using Table = std::array<uint32_t, 256>;

Table make_table() {
  Table t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

const Table& byte_table() {
  static const Table table = make_table();
  return table;
}

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  const Table& table = byte_table();
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

// Appending `bytes` zero bytes to a raw register, as four byte-indexed tables (the map is linear:
// the result for a register is the XOR of the results for its four bytes).
struct ZerosOperator {
  std::array<Table, 4> by_byte{};

  explicit ZerosOperator(size_t bytes) {
    const Table& table = byte_table();
    std::array<uint32_t, 32> column{};  // the image of each single-bit register
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t c = uint32_t{1} << bit;
      for (size_t i = 0; i < bytes; ++i) c = table[c & 0xFF] ^ (c >> 8);
      column[bit] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t out = 0;
        for (int j = 0; j < 8; ++j)
          if (v & (1u << j)) out ^= column[8 * k + j];
        by_byte[k][v] = out;
      }
    }
  }

  uint32_t operator()(uint32_t c) const {
    return by_byte[0][c & 0xFF] ^ by_byte[1][(c >> 8) & 0xFF] ^ by_byte[2][(c >> 16) & 0xFF] ^ by_byte[3][c >> 24];
  }
};

#if defined(__x86_64__)
// One crc32 instruction has a latency of three cycles and a throughput of one: three streams
// over adjacent stretches keep it busy (about 3x a single stream's rate), then are joined.
constexpr size_t kStretch = 8192;

__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t c) {
  static const ZerosOperator shift(kStretch);
  uint64_t c0 = c;
  while (n >= 3 * kStretch) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStretch; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kStretch + i, 8);
      std::memcpy(&v2, p + 2 * kStretch + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c0 = shift(shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
    p += 3 * kStretch;
    n -= 3 * kStretch;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c0 = _mm_crc32_u64(c0, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c0);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c_bytewise(std::span<const std::byte> data, uint32_t crc) {
  return ~crc_table(reinterpret_cast<const unsigned char*>(data.data()), data.size(), ~crc);
}

uint32_t crc32c(std::span<const std::byte> data, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return ~crc_sse42(p, data.size(), c);
#endif
  return ~crc_table(p, data.size(), c);
}

}  // namespace tessel::detail
