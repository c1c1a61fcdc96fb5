// Scalar conversions between float and the small float formats, bit-exact with JAX/numpy/ml_dtypes:
// bfloat16 (8-bit exponent, truncated float) and IEEE float16, both rounding to nearest even; and
// the 8-bit float8_e4m3fn (no infinities, NaN 0x7F) and float8_e5m2 (IEEE-like), rounding to
// nearest even, a value past the largest finite one becoming NaN (e4m3fn) or infinity (e5m2),
// as ml_dtypes converts. They work on bit patterns so no compiler support is needed.
//
//   tessel::f32_to_bf16(1.0f) == 0x3F80;  tessel::bf16_to_f32(0x3F80) == 1.0f
//   tessel::f32_to_f16(65520.0f) == 0x7C00  // rounds up to +inf, as numpy does
#pragma once

#include <bit>
#include <cmath>
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

namespace detail {

// An 8-bit float with E exponent bits, M mantissa bits and bias B; `ieee`: the top exponent holds
// infinities and NaNs (e5m2), else only the all-ones pattern is NaN (e4m3fn).
template <int E, int M, int B, bool ieee>
struct Float8 {
  static constexpr int kMaxExp = (1 << E) - 1;
  static float decode(uint8_t bits) {
    const float sign = bits & 0x80u ? -1.0f : 1.0f;
    const int exp = (bits >> M) & kMaxExp;
    const int man = bits & ((1 << M) - 1);
    if (ieee && exp == kMaxExp) return man == 0 ? sign * INFINITY : NAN;
    if (!ieee && exp == kMaxExp && man == (1 << M) - 1) return NAN;
    if (exp == 0) return sign * std::ldexp(static_cast<float>(man), 1 - B - M);
    return sign * std::ldexp(1.0f + static_cast<float>(man) / (1 << M), exp - B);
  }
  static constexpr uint8_t kNaN = ieee ? static_cast<uint8_t>((kMaxExp << M) | (1 << (M - 1))) : 0x7F;
  static double max_finite() {
    return ieee ? std::ldexp(2.0 - std::ldexp(1.0, -M), kMaxExp - 1 - B)
                : std::ldexp(2.0 - std::ldexp(1.0, 1 - M), kMaxExp - B);
  }
  static uint8_t encode(float value) {
    const uint8_t sign = std::signbit(value) ? 0x80u : 0u;
    if (std::isnan(value)) return sign | kNaN;
    const double a = std::fabs(static_cast<double>(value));
    if (std::isinf(a)) return sign | (ieee ? static_cast<uint8_t>(kMaxExp << M) : kNaN);
    if (a == 0) return sign;
    int e2 = 0;
    std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1): the leading bit is 2^(e2 - 1)
    const int lead = std::max(e2 - 1, 1 - B);  // subnormals share the smallest normal's quantum
    const double quantum = std::ldexp(1.0, lead - M);
    const double r = std::nearbyint(a / quantum) * quantum;  // to nearest even (the default mode)
    if (r > max_finite()) return sign | (ieee ? static_cast<uint8_t>(kMaxExp << M) : kNaN);
    if (r < std::ldexp(1.0, 1 - B))  // subnormal (or zero)
      return sign | static_cast<uint8_t>(std::lround(r / std::ldexp(1.0, 1 - B - M)));
    std::frexp(r, &e2);
    const int exp = e2 - 1 + B;
    const auto man = static_cast<int>(std::lround((r / std::ldexp(1.0, e2 - 1) - 1.0) * (1 << M)));
    return sign | static_cast<uint8_t>((exp << M) | man);
  }
};
using F8E4M3FN = Float8<4, 3, 7, false>;
using F8E5M2 = Float8<5, 2, 15, true>;

}  // namespace detail

inline float f8e4m3fn_to_f32(uint8_t bits) { return detail::F8E4M3FN::decode(bits); }
inline uint8_t f32_to_f8e4m3fn(float value) { return detail::F8E4M3FN::encode(value); }
inline float f8e5m2_to_f32(uint8_t bits) { return detail::F8E5M2::decode(bits); }
inline uint8_t f32_to_f8e5m2(float value) { return detail::F8E5M2::encode(value); }

}  // namespace tessel
