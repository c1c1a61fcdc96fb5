// Compiled with -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off (src/CMakeLists.txt): the loops
// below vectorize, and the same element computes to the same bits in vector and scalar code.
#include "tessel/state/detail/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace tessel::detail {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
constexpr size_t kBlocks = 64;  // Philox blocks per batch: 256 elements, registers-and-L1 sized

// The hot loops get AVX2 and AVX-512 versions chosen at load time; they compute the same bits as
// the baseline version since only exactly rounded operations are used.
// (tests/state/sampling_baseline.cpp builds a baseline-only copy to check that.)
#ifdef TESSEL_SAMPLING_BASELINE_ONLY
#define TESSEL_VECTOR_CLONES
#else
#define TESSEL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

// Philox4x32-10 over `n` consecutive block counters, structure of arrays so the rounds vectorize.
TESSEL_VECTOR_CLONES void philox_batch(const PhiloxKey& key, uint64_t first_block, size_t n, uint32_t* words) {
  alignas(64) uint32_t c0[kBlocks], c1[kBlocks], c2[kBlocks], c3[kBlocks];
  for (size_t j = 0; j < n; ++j) {
    uint64_t b = first_block + j;
    c0[j] = static_cast<uint32_t>(b);
    c1[j] = static_cast<uint32_t>(b >> 32);
    c2[j] = 0;
    c3[j] = 0;
  }
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    for (size_t j = 0; j < n; ++j) {
      uint64_t p0 = uint64_t{kM0} * c0[j];
      uint64_t p1 = uint64_t{kM1} * c2[j];
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (size_t j = 0; j < n; ++j) {
    words[4 * j] = c0[j];
    words[4 * j + 1] = c1[j];
    words[4 * j + 2] = c2[j];
    words[4 * j + 3] = c3[j];
  }
}

// [0, 1) from the top 23 bits, as JAX does.
inline float unit(uint32_t w) { return std::bit_cast<float>((w >> 9) | 0x3f800000u) - 1.0f; }

// Natural log for normal positive floats: exponent plus 2 atanh((m - 1) / (m + 1)) with m in
// [sqrt(1/2), sqrt(2)); the series' first omitted term is below 1e-9 relative.
inline float log_f32(float x) {
  uint32_t b = std::bit_cast<uint32_t>(x);
  int32_t e = static_cast<int32_t>(b >> 23) - 127;
  float m = std::bit_cast<float>((b & 0x7fffffu) | 0x3f800000u);
  bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  float s = (m - 1.0f) / (m + 1.0f);
  float s2 = s * s;
  float p = s2 * (0.66666667f + s2 * (0.4f + s2 * (0.28571429f + s2 * 0.22222222f)));
  return static_cast<float>(e) * 0.69314718f + (2.0f * s + s * p);
}

inline float erfinv(float x) {
  float w = -log_f32((1.0f - x) * (1.0f + x));
  // Central region (w < 5) and tail, both computed so the select vectorizes.
  float a = w - 2.5f;
  float p = 2.81022636e-08f;
  p = 3.43273939e-07f + p * a;
  p = -3.5233877e-06f + p * a;
  p = -4.39150654e-06f + p * a;
  p = 0.00021858087f + p * a;
  p = -0.00125372503f + p * a;
  p = -0.00417768164f + p * a;
  p = 0.246640727f + p * a;
  p = 1.50140941f + p * a;
  float t = std::sqrt(w) - 3.0f;
  float q = -0.000200214257f;
  q = 0.000100950558f + q * t;
  q = 0.00134934322f + q * t;
  q = -0.00367342844f + q * t;
  q = 0.00573950773f + q * t;
  q = -0.0076224613f + q * t;
  q = 0.00943887047f + q * t;
  q = 1.00167406f + q * t;
  q = 2.83297682f + q * t;
  return (w < 5.0f ? p : q) * x;
}


}  // namespace

float erfinv_f32(float x) { return erfinv(x); }

void random_words(const PhiloxKey& key, uint64_t first, size_t n, uint32_t* out) {
  alignas(64) uint32_t words[4 * kBlocks];
  uint64_t block = first / 4;
  size_t skip = static_cast<size_t>(first % 4);
  size_t done = 0;
  while (done < n) {
    size_t blocks = std::min(kBlocks, (skip + (n - done) + 3) / 4);
    philox_batch(key, block, blocks, words);
    size_t take = std::min(4 * blocks - skip, n - done);
    std::copy_n(words + skip, take, out + done);
    done += take;
    block += blocks;
    skip = 0;
  }
}

namespace {

TESSEL_VECTOR_CLONES void transform(const SampleSpec& spec, const uint32_t* words, size_t m, float* o) {
  const float lo = spec.lo, width = spec.hi - spec.lo, scale = spec.scale;
  if (spec.kind == SampleSpec::Kind::kUniform) {
    for (size_t j = 0; j < m; ++j) o[j] = (lo + unit(words[j]) * width) * scale;
    return;
  }
  const float clo = spec.clamp_lo, chi = spec.clamp_hi;
  for (size_t j = 0; j < m; ++j) {
    float u = std::max(lo, lo + unit(words[j]) * width);
    float z = 1.41421356f * erfinv(u);
    z = std::min(std::max(z, clo), chi);
    o[j] = z * scale;
  }
}

}  // namespace

void sample_f32(const PhiloxKey& key, uint64_t first, size_t n, const SampleSpec& spec, float* out) {
  constexpr size_t kBatch = 4 * kBlocks;
  alignas(64) uint32_t words[kBatch];
  for (size_t done = 0; done < n; done += kBatch) {
    const size_t m = std::min(kBatch, n - done);
    random_words(key, first + done, m, words);
    transform(spec, words, m, out + done);
  }
}

}  // namespace tessel::detail
