#include "tessel/core/half.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace tessel {
namespace {

bool is_nan16(uint16_t h, int exp_bits) {
  uint16_t exp_mask = exp_bits == 5 ? 0x7C00 : 0x7F80;
  uint16_t man_mask = exp_bits == 5 ? 0x03FF : 0x007F;
  return (h & exp_mask) == exp_mask && (h & man_mask) != 0;
}

// Independent reference: the nearest of all finite 16-bit values (ties to the even pattern),
// with values beyond max + half an ulp going to infinity, found by search over the sorted table.
struct Nearest {
  std::vector<std::pair<double, uint16_t>> table;  // non-negative finite values, ascending
  double overflow;  // values >= this round to infinity
  uint16_t inf;

  template <class ToF32>
  Nearest(int exp_bits, ToF32 to_f32) {
    uint16_t inf_bits = exp_bits == 5 ? 0x7C00 : 0x7F80;
    for (uint32_t h = 0; h < inf_bits; ++h) table.emplace_back(to_f32(static_cast<uint16_t>(h)), h);
    double max = table.back().first, below = table[table.size() - 2].first;
    overflow = max + (max - below) / 2;
    inf = inf_bits;
  }
  uint16_t operator()(float f) const {
    double a = std::fabs(static_cast<double>(f));
    uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (a >= overflow) return sign | inf;
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, uint16_t{0}));
    if (it == table.begin()) return sign | it->second;
    if (it == table.end()) return sign | table.back().second;
    auto lo = std::prev(it);
    double dlo = a - lo->first, dhi = it->first - a;
    if (dlo < dhi) return sign | lo->second;
    if (dhi < dlo) return sign | it->second;
    return sign | ((lo->second & 1) ? it->second : lo->second);
  }
};

float f32_from_bf16_reference(uint16_t h) {  // by definition: the top half of a float
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// f16 value by its definition (sign, exponent, mantissa) in double arithmetic.
float f32_from_f16_reference(uint16_t h) {
  int exp = (h >> 10) & 0x1F;
  int man = h & 0x3FF;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  if (exp == 0x1F) v = man ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  return static_cast<float>((h & 0x8000) ? -v : v);
}

std::vector<float> probe_floats() {
  std::vector<float> out = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f,
                            5.960464477539063e-08f, 2.980232238769531e-08f, 2.9802326e-08f,
                            6.103515625e-05f, 6.1035156e-05f, 3.0e38f, 3.4028235e38f,
                            std::numeric_limits<float>::denorm_min(), 1.00390625f, 1.01171875f};
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(any(rng));
    if (!std::isnan(f)) out.push_back(f);
  }
  // Exact halfway points between neighbouring f16 and bf16 values exercise ties to even.
  for (uint32_t h = 0; h < 0x7BFF; h += 7)
    out.push_back(static_cast<float>((f32_from_f16_reference(h) + f32_from_f16_reference(h + 1)) / 2.0));
  for (uint32_t h = 0; h < 0x7F7F; h += 5) out.push_back(std::bit_cast<float>((h << 16) | 0x8000u));
  return out;
}

TEST(Half, F16ToF32MatchesTheDefinitionForEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    float got = f16_to_f32(static_cast<uint16_t>(h)), want = f32_from_f16_reference(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "pattern " << h;
    }
  }
}

TEST(Half, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    auto bits = static_cast<uint16_t>(h);
    uint16_t back = f32_to_f16(f16_to_f32(bits));
    if (is_nan16(bits, 5)) EXPECT_TRUE(is_nan16(back, 5)) << h;
    else EXPECT_EQ(back, bits) << h;
  }
}

TEST(Half, F32ToF16RoundsToNearestEven) {
  Nearest nearest(5, f32_from_f16_reference);
  for (float f : probe_floats()) EXPECT_EQ(f32_to_f16(f), nearest(f)) << std::hexfloat << f;
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // numpy: inf
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_TRUE(is_nan16(f32_to_f16(NAN), 5));
}

#if defined(__FLT16_MANT_DIG__) && defined(__GNUC__) && !defined(__clang__)
TEST(Half, F32ToF16AgreesWithTheCompilersFloat16) {
  for (float f : probe_floats())
    EXPECT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << std::hexfloat << f;
}
#endif

TEST(Half, Bf16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    auto bits = static_cast<uint16_t>(h);
    EXPECT_EQ(std::bit_cast<uint32_t>(bf16_to_f32(bits)), std::bit_cast<uint32_t>(f32_from_bf16_reference(bits)));
    uint16_t back = f32_to_bf16(bf16_to_f32(bits));
    if (is_nan16(bits, 8)) EXPECT_TRUE(is_nan16(back, 8)) << h;
    else EXPECT_EQ(back, bits) << h;
  }
}

TEST(Half, F32ToBf16RoundsToNearestEven) {
  Nearest nearest(8, f32_from_bf16_reference);
  for (float f : probe_floats()) EXPECT_EQ(f32_to_bf16(f), nearest(f)) << std::hexfloat << f;
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_TRUE(is_nan16(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), 8));  // payload in low bits
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// float8: the formats' landmarks (the exhaustive check against ml_dtypes is in
// tests/python/test_float8_vs_ml_dtypes.py).
TEST(Float8, LandmarksAndRounding) {
  EXPECT_EQ(f8e4m3fn_to_f32(0x7E), 448.0f);               // the largest finite
  EXPECT_EQ(f8e4m3fn_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(f8e4m3fn_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_TRUE(std::isnan(f8e4m3fn_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3fn_to_f32(0xFF)));
  EXPECT_EQ(f32_to_f8e4m3fn(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3fn(464.0f), 0x7E);  // a tie, to the even mantissa
  EXPECT_EQ(f32_to_f8e4m3fn(465.0f), 0x7F);  // past it: NaN (no infinities)
  EXPECT_EQ(f32_to_f8e4m3fn(-INFINITY), 0xFF);
  EXPECT_EQ(f32_to_f8e4m3fn(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e4m3fn(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(f32_to_f8e4m3fn(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(f8e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7C);  // a tie between the largest and the next binade: up
  EXPECT_EQ(f32_to_f8e5m2(1.0f), 0x3C);
  for (int b = 0; b < 256; ++b) {  // every finite pattern encodes back to itself
    const float f = f8e4m3fn_to_f32(static_cast<uint8_t>(b));
    if (!std::isnan(f)) EXPECT_EQ(f32_to_f8e4m3fn(f), b) << b;
    const float g = f8e5m2_to_f32(static_cast<uint8_t>(b));
    if (!std::isnan(g)) EXPECT_EQ(f32_to_f8e5m2(g), b) << b;
  }
}

}  // namespace
}  // namespace tessel
