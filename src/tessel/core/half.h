// Scalar conversions between float and the two 16-bit float formats, bit-exact with JAX/numpy:
// bfloat16 (8-bit exponent, truncated float) and IEEE float16, both rounding to nearest even.
// They work on bit patterns (uint16_t) so no compiler float16 support is needed.
//
//   tessel::f32_to_bf16(1.0f) == 0x3F80;  tessel::bf16_to_f32(0x3F80) == 1.0f
//   tessel::f32_to_f16(65520.0f) == 0x7C00  // rounds up to +inf, as numpy does
#pragma once

#include <bit>
#include <cstdint>

namespace tessel {

inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

inline uint16_t f32_to_bf16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  // A NaN must stay a NaN: rounding could carry its payload into the exponent (infinity).
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float f16_to_f32(uint16_t bits) {
  uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  uint32_t exp = (bits >> 10) & 0x1Fu;
  uint32_t man = bits & 0x3FFu;
  uint32_t x;
  if (exp == 0x1F) {
    x = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    x = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    x = sign;
  } else {  // subnormal: man * 2^-24, renormalized for float
    uint32_t top = 31u - static_cast<uint32_t>(std::countl_zero(man));
    x = sign | ((top + 103u) << 23) | ((man << (23u - top)) & 0x7FFFFFu);
  }
  return std::bit_cast<float>(x);
}

inline uint16_t f32_to_f16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // infinity, or NaN kept quiet with its top payload bits
    return sign | (abs > 0x7F800000u ? 0x7E00u | ((abs >> 13) & 0x3FFu) : 0x7C00u);
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  uint32_t q, rem, half;
  if (abs < 0x38800000u) {  // below 2^-14: a float16 subnormal, in units of 2^-24
    if (abs < 0x33000000u) return sign;  // below 2^-25 (2^-25 itself ties to even zero)
    uint32_t shift = 126u - (abs >> 23);
    uint32_t man = (abs & 0x7FFFFFu) | 0x800000u;
    q = man >> shift;
    rem = man & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {  // normal: rebias the exponent, keep 10 mantissa bits; a carry bumps the exponent
    uint32_t r = abs - 0x38000000u;
    q = r >> 13;
    rem = r & 0x1FFFu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

}  // namespace tessel
