#include "tessel/state/initializer.h"

#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tessel/core/half.h"
#include "tessel/state/detail/sampling.h"
#include "tessel/state/random.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Counter128{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Counter128{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Counter128{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, KeysDependOnSeedAndPath) {
  EXPECT_EQ(parameter_key(0, "a/b"), parameter_key(0, "a/b"));
  EXPECT_NE(parameter_key(0, "a/b"), parameter_key(1, "a/b"));
  EXPECT_NE(parameter_key(0, "a/b"), parameter_key(0, "a/c"));
  EXPECT_NE(parameter_key(uint64_t{1} << 32, "a/b"), parameter_key(0, "a/b"));
}

// Random123's known-answer vectors for ars4x32 with 7 rounds (tests/old_kat_vectors there).
TEST(Ars, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(ars4x32_7({1, 0, 0, 0}, {1, 0, 0, 0}), (Counter128{0x3523162b, 0xdc14d20c, 0x79184077, 0x72184193}));
  EXPECT_EQ(ars4x32_7({0x100, 0, 0, 0}, {1, 0, 0, 0}), (Counter128{0x6fb6e62d, 0x68b661a4, 0x6f1280f3, 0x22cdb932}));
  EXPECT_EQ(ars4x32_7({0, 1, 0, 0}, {1, 0, 0, 0}), (Counter128{0xf928af71, 0x52594c2a, 0xe41e8545, 0xf10cae23}));
  EXPECT_EQ(ars4x32_7({0, 0, 0x10000, 0}, {0x100, 0, 0, 0}), (Counter128{0x1a0f53d9, 0xbc1548db, 0x245e6e04, 0xd5bdca89}));
  EXPECT_EQ(ars4x32_7({0, 0, 0, 1}, {0x100, 0, 0, 0}), (Counter128{0xcadb6f7f, 0x90f2ff0f, 0xfd7e194d, 0x0f20d0e1}));
  EXPECT_EQ(ars4x32_7({0x1000000, 0, 0, 0}, {0, 1, 0, 0}), (Counter128{0xe4e7782f, 0x675942c8, 0x917bcde1, 0xc3739f28}));
  EXPECT_EQ(ars4x32_7({0, 0x100, 0, 0}, {0, 1, 0, 0}), (Counter128{0x8e63d1dc, 0xddc2763e, 0xeac3cd9d, 0x8b624caf}));
}

// FIPS-197 appendix B: the state after round 1's SubBytes, ShiftRows, MixColumns and the round key.
TEST(Ars, AesRoundIsFips197s) {
  auto le = [](uint32_t big_endian) { return __builtin_bswap32(big_endian); };  // FIPS-197 prints bytes in order
  const Counter128 state{le(0x193de3be), le(0xa0f4e22b), le(0x9ac68d2a), le(0xe9f84808)};
  const Counter128 key{le(0xa0fafe17), le(0x88542cb1), le(0x23a33939), le(0x2a6c7605)};
  EXPECT_EQ(aes_round(state, key, false), (Counter128{le(0xa49c7ff2), le(0x689f352b), le(0x6b5bea43), le(0x026a5049)}));
}

const std::vector<std::pair<detail::SamplingKernels, const char*>> kKernels = {
    {detail::SamplingKernels::kBest, "best"}, {detail::SamplingKernels::kAesNi, "AES-NI"},
    {detail::SamplingKernels::kPortable, "portable"}};

TEST(Ars, BatchedWordsAreTheScalarBlocksWordByWord) {
  const ArsKey key = parameter_key(9, "k");
  // Block numbers that carry into their high word inside one vector of blocks, and lengths that end
  // inside a vector.
  for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{255}, uint64_t{1} << 34,
                         (uint64_t{0xFFFFFFFF} - 5) * 4 + 3}) {
    for (const auto& [kernels, name] : kKernels) {
      std::vector<uint32_t> words(2500 + first % 7);  // several runs of the kernels
      detail::sampling_use(kernels);
      detail::random_words(key, first, words.size(), words.data());
      detail::sampling_use(detail::SamplingKernels::kBest);
      for (size_t j = 0; j < words.size(); ++j) {
        uint64_t i = first + j;
        Counter128 block = ars4x32_7({static_cast<uint32_t>(i / 4), static_cast<uint32_t>(i / 4 >> 32), 0, 0}, key);
        ASSERT_EQ(words[j], block[i % 4]) << "element " << i << ", " << name << " kernels";
      }
    }
  }
}

}  // namespace
namespace testing {  // tests/state/sampling_baseline.cpp
void baseline_sample_f32(const ArsKey& key, uint64_t first, size_t n, const detail::SampleSpec& spec, float* out);
}
namespace {

TEST(Sampling, EveryInstructionSetGivesTheSameBits) {
  const ArsKey key = parameter_key(4, "isa");
  using K = detail::SampleSpec::Kind;
  const auto erf_f32 = [](double sigmas) { return static_cast<float>(std::erf(sigmas / std::sqrt(2.0))); };
  std::vector<detail::SampleSpec> specs = {
      {K::kUniform, 0, 1, 1},
      {K::kUniform, -1, 1, 0.3f},
      {K::kErfinv, std::nextafter(-1.0f, 0.0f), 1, 1},
      {K::kErfinv, static_cast<float>(std::erf(-2 / std::sqrt(2.0))), static_cast<float>(std::erf(2 / std::sqrt(2.0))),
       0.7f, std::nextafter(-2.0f, 0.0f), std::nextafter(2.0f, 0.0f)},
      {K::kErfinv, std::nextafter(-1.0f, 0.0f), 1, 1, -0.5f, 0.25f},  // clamps most samples
      // Truncations whose |u| stays at most 0.99 (the kernels skip erfinv's tail test) or not.
      {K::kErfinv, erf_f32(-2.5), erf_f32(2.5), 1},
      {K::kErfinv, erf_f32(-1), erf_f32(3), 1},
      // Half normals: max(u, lo) turns +0 into -0 for lo = -0 (the kernels keep it for a zero lo).
      {K::kErfinv, -0.0f, erf_f32(2), 1},
      {K::kErfinv, 0.0f, 1, 1}};
  for (const auto& spec : specs)
    for (uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 33, (uint64_t{0xFFFFFFFF} - 9) * 4 + 1}) {
      const size_t n = 100003 + first % 13;
      std::vector<float> base(n);
      testing::baseline_sample_f32(key, first, n, spec, base.data());
      for (const auto& [kernels, name] : kKernels) {
        std::vector<float> fast(n);
        detail::sampling_use(kernels);
        detail::sample_f32(key, first, n, spec, fast.data());
        detail::sampling_use(detail::SamplingKernels::kBest);
        for (size_t j = 0; j < n; ++j)
          ASSERT_EQ(std::bit_cast<uint32_t>(fast[j]), std::bit_cast<uint32_t>(base[j]))
              << "element " << first + j << ", " << name << " kernels";
      }
    }
}

TEST(Sampling, ErfinvInvertsErf) {
  for (double y = -2.5; y <= 2.5; y += 1e-3) {
    float x = static_cast<float>(std::erf(y));
    EXPECT_NEAR(detail::erfinv_f32(x), y, 2e-4 * std::max(1.0, std::fabs(y) * 10)) << y;
  }
  EXPECT_EQ(detail::erfinv_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(detail::erfinv_f32(std::nextafter(1.0f, 0.0f))));
  EXPECT_TRUE(std::isfinite(detail::erfinv_f32(std::nextafter(-1.0f, 0.0f))));
}

std::vector<float> fill_f32(const Initializer& init, uint64_t seed, const std::string& path,
                            const Shape& shape, const Box& box, const Fans& fans = {}) {
  std::vector<float> out(static_cast<size_t>(box.volume()));
  init.fill(seed, path, shape, DType::kF32, fans,
            box, std::as_writable_bytes(std::span<float>(out)));
  return out;
}

std::vector<Initializer> all_kinds() {
  return {Initializer::zeros(), Initializer::ones(), Initializer::constant(0.25),
          Initializer::normal(0.5), Initializer::truncated_normal(0.5), Initializer::uniform(3.0),
          Initializer::lecun_normal(), Initializer::he_uniform(), Initializer::glorot_uniform(),
          Initializer::variance_scaling(0.7, FanMode::kFanOut, Distribution::kNormal)};
}

TEST(Initializer, AnyBlockEqualsTheSameElementsOfTheWhole) {
  std::mt19937 rng(5);
  const Shape shape{13, 7, 5};
  for (const Initializer& init : all_kinds()) {
    std::vector<float> whole = fill_f32(init, 42, "p/w", shape, Box::full(shape));
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int64_t> lo(3), hi(3);
      for (size_t d = 0; d < 3; ++d) {
        int64_t a = std::uniform_int_distribution<int64_t>(0, shape[d])(rng);
        int64_t b = std::uniform_int_distribution<int64_t>(0, shape[d])(rng);
        lo[d] = std::min(a, b);
        hi[d] = std::max(a, b);
      }
      Box box(lo, hi);
      std::vector<float> part = fill_f32(init, 42, "p/w", shape, box);
      size_t k = 0;
      for (int64_t i = lo[0]; i < hi[0]; ++i)
        for (int64_t j = lo[1]; j < hi[1]; ++j)
          for (int64_t l = lo[2]; l < hi[2]; ++l)
            ASSERT_EQ(std::bit_cast<uint32_t>(part[k++]),
                      std::bit_cast<uint32_t>(whole[static_cast<size_t>((i * 7 + j) * 5 + l)]))
                << init.to_string() << " " << box.to_string();
    }
  }
}

TEST(Initializer, SeedsAndPathsGiveDifferentValues) {
  const Shape shape{64};
  auto a = fill_f32(Initializer::normal(1), 0, "w", shape, Box::full(shape));
  EXPECT_EQ(a, fill_f32(Initializer::normal(1), 0, "w", shape, Box::full(shape)));
  EXPECT_NE(a, fill_f32(Initializer::normal(1), 1, "w", shape, Box::full(shape)));
  EXPECT_NE(a, fill_f32(Initializer::normal(1), 0, "v", shape, Box::full(shape)));
}

struct Moments {
  double mean, variance, min, max;
};

Moments moments(const std::vector<float>& v) {
  double s = 0, s2 = 0, lo = INFINITY, hi = -INFINITY;
  for (float x : v) {
    s += x;
    lo = std::min<double>(lo, x);
    hi = std::max<double>(hi, x);
  }
  double mean = s / static_cast<double>(v.size());
  for (float x : v) s2 += (x - mean) * (x - mean);
  return {mean, s2 / static_cast<double>(v.size() - 1), lo, hi};
}

// Sample mean within 5 standard errors; sample variance within 4% (about 10 of its standard
// errors for these sizes, so the test is stable yet catches a wrong scale).
void expect_moments(const Initializer& init, const Shape& shape, const Fans& fans, double mean,
                    double variance) {
  auto v = fill_f32(init, 7, "stats/w", shape, Box::full(shape), fans);
  Moments m = moments(v);
  double n = static_cast<double>(v.size());
  EXPECT_NEAR(m.mean, mean, 5 * std::sqrt(variance / n)) << init.to_string();
  EXPECT_NEAR(m.variance, variance, 0.04 * variance) << init.to_string();
}

TEST(Initializer, SampleMomentsMatchTheDefinitions) {
  const Shape shape{256, 512};  // fan_in 256, fan_out 512
  const Fans fans;
  expect_moments(Initializer::normal(0.5), shape, fans, 0, 0.25);
  expect_moments(Initializer::truncated_normal(0.5), shape, fans, 0, 0.25 * .87962566103423978 * .87962566103423978);
  expect_moments(Initializer::uniform(3.0), shape, fans, 1.5, 9.0 / 12);
  expect_moments(Initializer::lecun_normal(), shape, fans, 0, 1.0 / 256);
  expect_moments(Initializer::lecun_uniform(), shape, fans, 0, 1.0 / 256);
  expect_moments(Initializer::he_normal(), shape, fans, 0, 2.0 / 256);
  expect_moments(Initializer::he_uniform(), shape, fans, 0, 2.0 / 256);
  expect_moments(Initializer::glorot_normal(), shape, fans, 0, 1.0 / 384);
  expect_moments(Initializer::glorot_uniform(), shape, fans, 0, 1.0 / 384);
  expect_moments(Initializer::variance_scaling(3, FanMode::kFanOut, Distribution::kNormal), shape, fans, 0, 3.0 / 512);
  // Declared fans: a stacked [layers, in, out] kernel does not count the layers.
  expect_moments(Initializer::lecun_normal(), Shape{8, 128, 64}, Fans{{1}, {2}, {0}}, 0, 1.0 / 128);
}

// The tails and fourth moment of a normal and of a normal truncated to [-2, 2], against the
// distributions' own values (binomial and sample-mean tolerances of about 5 standard errors).
TEST(Initializer, TailsAndFourthMomentsAreTheNormals) {
  const Shape shape{int64_t{1} << 20};
  const double n = static_cast<double>(shape[0]);
  auto v = fill_f32(Initializer::normal(1), 11, "tails/n", shape, Box::full(shape));
  double beyond[5] = {}, m4 = 0;
  for (float x : v) {
    for (int k = 1; k <= 4; ++k) beyond[k] += std::fabs(x) > k;
    m4 += std::pow(static_cast<double>(x), 4);
  }
  for (int k = 1; k <= 4; ++k) {
    const double p = std::erfc(k / std::sqrt(2.0));
    EXPECT_NEAR(beyond[k] / n, p, 5 * std::sqrt(p * (1 - p) / n) + 1e-6) << "P(|z| > " << k << ")";
  }
  EXPECT_NEAR(m4 / n, 3.0, 5 * std::sqrt(96.0 / n));  // E z^4 = 3, Var z^4 = 105 - 9

  // Truncated to [-2, 2]: moments by Simpson's rule on the density.
  auto moment = [](int k) {
    const int steps = 20000;
    double sum = 0, mass = 0;
    for (int i = 0; i <= steps; ++i) {
      const double z = -2 + 4.0 * i / steps, w = (i == 0 || i == steps) ? 1 : (i % 2 ? 4 : 2);
      const double density = std::exp(-z * z / 2);
      sum += w * std::pow(z, k) * density;
      mass += w * density;
    }
    return sum / mass;
  };
  auto t = fill_f32(Initializer::truncated_normal(1), 11, "tails/t", shape, Box::full(shape));
  double t2 = 0, t4 = 0;
  for (float x : t) {
    t2 += static_cast<double>(x) * x;
    t4 += std::pow(static_cast<double>(x), 4);
  }
  EXPECT_NEAR(t2 / n, moment(2), 5 * std::sqrt((moment(4) - moment(2) * moment(2)) / n));
  EXPECT_NEAR(t4 / n, moment(4), 5 * std::sqrt((moment(8) - moment(4) * moment(4)) / n));
}

TEST(Initializer, BoundsHold) {
  const Shape shape{100000};
  Moments t = moments(fill_f32(Initializer::truncated_normal(0.5), 1, "t", shape, Box::full(shape)));
  EXPECT_GE(t.min, -1.0);
  EXPECT_LE(t.max, 1.0);
  Moments u = moments(fill_f32(Initializer::uniform(3.0), 1, "u", shape, Box::full(shape)));
  EXPECT_GE(u.min, 0.0);
  EXPECT_LT(u.max, 3.0);
  Moments g = moments(fill_f32(Initializer::glorot_uniform(), 1, "g", Shape{100, 200}, Box::full(Shape{100, 200})));
  double limit = std::sqrt(3.0 / 150);
  EXPECT_GE(g.min, -limit);
  EXPECT_LE(g.max, limit);
  Moments h = moments(fill_f32(Initializer::he_normal(), 1, "h", Shape{100, 200}, Box::full(Shape{100, 200})));
  EXPECT_LE(h.max, 2 * std::sqrt(2.0 / 100) / .87962566103423978 + 1e-6);
}

// A zero stddev gives zeros: the clamp just inside [lower, upper] * stddev would be an empty range.
TEST(Initializer, ZeroStddevGivesZeros) {
  const Shape shape{1000};
  for (const Initializer& init : {Initializer::truncated_normal(0), Initializer::normal(0)})
    for (float x : fill_f32(init, 3, "z", shape, Box::full(shape))) ASSERT_EQ(x, 0.0f) << init.to_string();
}

TEST(Initializer, Bf16IsTheRoundedF32AndConstantsFillAnyDtype) {
  const Shape shape{33};
  auto f = fill_f32(Initializer::normal(1), 3, "w", shape, Box::full(shape));
  std::vector<uint16_t> b(33);
  Initializer::normal(1).fill(3, "w", shape, DType::kBF16, {}, Box::full(shape), std::as_writable_bytes(std::span<uint16_t>(b)));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], f32_to_bf16(f[i]));
  std::vector<int32_t> ints(4);
  Initializer::constant(7).fill(0, "c", Shape{4}, DType::kI32, {}, Box::full(Shape{4}), std::as_writable_bytes(std::span<int32_t>(ints)));
  EXPECT_EQ(ints, (std::vector<int32_t>{7, 7, 7, 7}));
  std::vector<uint8_t> flags(3);
  Initializer::ones().fill(0, "c", Shape{3}, DType::kBool, {}, Box::full(Shape{3}), std::as_writable_bytes(std::span<uint8_t>(flags)));
  EXPECT_EQ(flags, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(Initializer, FansFollowJax) {
  EXPECT_EQ(compute_fans(Shape{3, 3, 16, 32}, {}), (std::pair<double, double>{144, 288}));  // conv HWIO
  EXPECT_EQ(compute_fans(Shape{64, 128}, {}), (std::pair<double, double>{64, 128}));
  EXPECT_EQ(compute_fans(Shape{8, 64, 4, 16}, Fans{{1}, {2, 3}, {0}}), (std::pair<double, double>{64, 64}));
  EXPECT_EQ(compute_fans(Shape{10}, {}), (std::pair<double, double>{10, 10}));
}

TEST(Initializer, BadUsesNameTheProblem) {
  std::vector<std::byte> out(16);
  EXPECT_THAT([&] { Initializer::normal().fill(0, "w", Shape{4}, DType::kI32, {}, Box::full(Shape{4}), out); },
              ThrowsMessage<ValueError>(HasSubstr("w: normal(stddev=0.01) initializer needs a float dtype, not int32")));
  EXPECT_THAT([&] { Initializer::normal().fill(0, "w", Shape{4}, DType::kF32, {}, Box({2}, {6}), out); },
              ThrowsMessage<ValueError>(HasSubstr("w: box [2:6] does not lie in shape [4]")));
  EXPECT_THAT([&] { Initializer::normal().fill(0, "w", Shape{8}, DType::kF32, {}, Box::full(Shape{8}), out); },
              ThrowsMessage<ValueError>(HasSubstr("16 bytes given for box [0:8] of float32, need 32")));
  EXPECT_THAT([] { Initializer::by_name("xavier_magic"); },
              ThrowsMessage<ValueError>(HasSubstr("unknown initializer 'xavier_magic' (known: zeros")));
  EXPECT_THAT([] { compute_fans(Shape{4, 4}, Fans{{0}, {2}, {}}); },
              ThrowsMessage<ValueError>(HasSubstr("fan-out axis 2 is out of range for shape [4, 4]")));
  EXPECT_THAT([] { compute_fans(Shape{4, 4}, Fans{{0}, {0}, {}}); },
              ThrowsMessage<ValueError>(HasSubstr("axis 0 of shape [4, 4] is declared twice")));
  EXPECT_THAT([] { Initializer::truncated_normal(1, 2, -2); }, ThrowsMessage<ValueError>(HasSubstr("need lower < upper")));
  EXPECT_THAT([] { Initializer::variance_scaling(0, FanMode::kFanIn, Distribution::kNormal); },
              ThrowsMessage<ValueError>(HasSubstr("scale must be > 0")));
  EXPECT_EQ(Initializer::by_name("kaiming_normal").to_string(), "variance_scaling(scale=2, mode=fan_in, distribution=truncated_normal)");
}

}  // namespace
}  // namespace tessel
