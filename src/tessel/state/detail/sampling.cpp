// Compiled with -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off (src/CMakeLists.txt): the loops
// below vectorize, and the same element computes to the same bits in vector and scalar code.
#include "tessel/state/detail/sampling.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <iterator>

// tests/state/sampling_baseline.cpp builds this file with TESSEL_SAMPLING_BASELINE_ONLY: no clones.
#ifdef TESSEL_SAMPLING_BASELINE_ONLY
#define TESSEL_NO_VECTOR_CLONES
#endif
#include "tessel/detail/vector_clones.h"

#if defined(__x86_64__) && !defined(TESSEL_SAMPLING_BASELINE_ONLY)
// g++ 12 warns inside its own AVX-512 headers (_mm512_undefined_*'s self-initialization, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define TESSEL_SAMPLING_AVX512 1
#endif

namespace tessel::detail {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
constexpr size_t kBlocks = 64;  // Philox blocks per batch: 256 elements, registers-and-L1 sized

// The hot loops get AVX2 and AVX-512 versions chosen at load time (TESSEL_VECTOR_CLONES); they
// compute the same bits as the baseline version since only exactly rounded operations are used
// (tests/state/sampling_baseline.cpp builds a baseline-only copy to check that).

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

// Giles' single-precision erfinv polynomials, highest power first: the central region (w < 5, in
// w - 2.5) and the tail (in sqrt(w) - 3). The AVX-512 kernel below evaluates the same ones.
constexpr float kCentral[] = {2.81022636e-08f, 3.43273939e-07f, -3.5233877e-06f, -4.39150654e-06f, 0.00021858087f,
                              -0.00125372503f, -0.00417768164f, 0.246640727f, 1.50140941f};
constexpr float kTail[] = {-0.000200214257f, 0.000100950558f, 0.00134934322f, -0.00367342844f, 0.00573950773f,
                           -0.0076224613f, 0.00943887047f, 1.00167406f, 2.83297682f};

inline float erfinv(float x) {
  float w = -log_f32((1.0f - x) * (1.0f + x));
  // Central region (w < 5) and tail, both computed so the select vectorizes.
  float a = w - 2.5f;
  float p = kCentral[0];
  for (size_t i = 1; i < std::size(kCentral); ++i) p = kCentral[i] + p * a;
  float t = std::sqrt(w) - 3.0f;
  float q = kTail[0];
  for (size_t i = 1; i < std::size(kTail); ++i) q = kTail[i] + q * t;
  return (w < 5.0f ? p : q) * x;
}

#ifdef TESSEL_SAMPLING_AVX512
// Hand-written AVX-512 versions of the two kernels, taken when the CPU has AVX-512F. g++ widens
// each Philox lane to 64 bits and evaluates both erfinv polynomials for every element; these
// multiply even and odd lanes with vpmuludq and skip the tail polynomial for 16 lanes that all
// lie in the central region (all but 0.3% of normal samples). They do the same exactly rounded
// operations in the same order as the portable code, so they give the same bits.
#define TESSEL_AVX512 __attribute__((target("avx512f")))

std::atomic<bool> prefer_avx2{false};  // sampling_prefer_avx2

// The CPU has AVX-512F and no test asked for the AVX2 kernels.
bool use_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes && !prefer_avx2.load(std::memory_order_relaxed);
}

TESSEL_AVX512 inline __m512i splat(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
TESSEL_AVX512 inline __m512 splat(float v) { return _mm512_set1_ps(v); }

// Philox4x32-10 of eight blocks, one per 64-bit lane: each counter word in the lane's low half.
// vpmuludq reads only the low halves, so the high halves may hold anything between rounds.
struct Philox8 {
  __m512i c0, c1, c2, c3;
};

TESSEL_AVX512 inline Philox8 philox8_start(uint64_t first_block) {
  const __m512i blocks = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first_block)),
                                          _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
  return {blocks, _mm512_srli_epi64(blocks, 32), _mm512_setzero_si512(), _mm512_setzero_si512()};
}

TESSEL_AVX512 inline void philox8_round(Philox8& x, __m512i k0, __m512i k1) {
  const __m512i m0 = _mm512_set1_epi64(kM0), m1 = _mm512_set1_epi64(kM1);
  const __m512i p0 = _mm512_mul_epu32(x.c0, m0), p1 = _mm512_mul_epu32(x.c2, m1);
  x.c0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), x.c1, k0, 0x96);  // three-way xor
  x.c2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), x.c3, k1, 0x96);
  x.c1 = p1;
  x.c3 = p0;
}

// The eight blocks' 32 words in element order (word w of block j at 4 j + w).
TESSEL_AVX512 inline void philox8_store(const Philox8& x, uint32_t* words) {
  constexpr __mmask16 kHigh = 0xAAAA;
  const __m512i w01 = _mm512_mask_blend_epi32(kHigh, x.c0, _mm512_slli_epi64(x.c1, 32));
  const __m512i w23 = _mm512_mask_blend_epi32(kHigh, x.c2, _mm512_slli_epi64(x.c3, 32));
  const __m512i even = _mm512_unpacklo_epi64(w01, w23);  // 128-bit lane L: block 2 L
  const __m512i odd = _mm512_unpackhi_epi64(w01, w23);   // block 2 L + 1
  _mm512_storeu_si512(words, _mm512_permutex2var_epi64(even, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), odd));
  _mm512_storeu_si512(words + 16, _mm512_permutex2var_epi64(even, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), odd));
}

// Philox4x32-10 of the 32 blocks from `first_block`, written in element order: 128 words. Four
// groups of eight blocks side by side: each round is a chain of multiply, shift and xor, and four
// chains keep the multiplier busy where two left it waiting.
TESSEL_AVX512 void philox32(const PhiloxKey& key, uint64_t first_block, uint32_t* words) {
  Philox8 x[4];
  for (int g = 0; g < 4; ++g) x[g] = philox8_start(first_block + 8 * static_cast<uint64_t>(g));
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const __m512i kk0 = _mm512_set1_epi32(static_cast<int>(k0)), kk1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (auto& g : x) philox8_round(g, kk0, kk1);
    k0 += kW0;
    k1 += kW1;
  }
  for (int g = 0; g < 4; ++g) philox8_store(x[g], words + 32 * g);
}

TESSEL_AVX512 inline __m512 unit16(__m512i w) {
  return _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(w, 9), splat(0x3f800000u))), splat(1.0f));
}

// The transform below runs on N vectors side by side, each step for all N before the next: one
// vector's log and erfinv polynomials are a chain of ~30 dependent operations, which the core's
// scheduler cannot overlap with the next vector's by itself (the chain fills it). Eight in lock
// step (128 elements) made the whole init 1.4x faster than one at a time (four: 1.2x, sixteen: no
// more than eight). Every lane sees the same operations, so the bits do not change.
template <int N>
TESSEL_AVX512 inline void log16(__m512 (&v)[N]) {
  __m512 m[N], s[N], s2[N], p[N];
  __m512i e[N];
  for (int k = 0; k < N; ++k) {
    const __m512i b = _mm512_castps_si512(v[k]);
    e[k] = _mm512_sub_epi32(_mm512_srli_epi32(b, 23), splat(127u));
    m[k] = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(b, splat(0x7fffffu)), splat(0x3f800000u)));
    const __mmask16 big = _mm512_cmp_ps_mask(m[k], splat(1.41421356f), _CMP_GT_OQ);
    m[k] = _mm512_mask_mul_ps(m[k], big, m[k], splat(0.5f));
    e[k] = _mm512_mask_add_epi32(e[k], big, e[k], splat(1u));
  }
  for (int k = 0; k < N; ++k) s[k] = _mm512_div_ps(_mm512_sub_ps(m[k], splat(1.0f)), _mm512_add_ps(m[k], splat(1.0f)));
  for (int k = 0; k < N; ++k) s2[k] = _mm512_mul_ps(s[k], s[k]);
  for (int k = 0; k < N; ++k) p[k] = _mm512_mul_ps(s2[k], splat(0.22222222f));
  for (const float c : {0.28571429f, 0.4f, 0.66666667f})
    for (int k = 0; k < N; ++k) p[k] = _mm512_mul_ps(s2[k], _mm512_add_ps(splat(c), p[k]));
  for (int k = 0; k < N; ++k) {
    v[k] = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(e[k]), splat(0.69314718f)),
                         _mm512_add_ps(_mm512_mul_ps(splat(2.0f), s[k]), _mm512_mul_ps(s[k], p[k])));
  }
}

// x <- erfinv(x), lane by lane.
template <int N>
TESSEL_AVX512 inline void erfinv16(__m512 (&x)[N]) {
  __m512 w[N], a[N], p[N];
  for (int k = 0; k < N; ++k) w[k] = _mm512_mul_ps(_mm512_sub_ps(splat(1.0f), x[k]), _mm512_add_ps(splat(1.0f), x[k]));
  log16(w);
  for (int k = 0; k < N; ++k) {
    w[k] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(w[k]), splat(0x80000000u)));
    a[k] = _mm512_sub_ps(w[k], splat(2.5f));
    p[k] = splat(kCentral[0]);
  }
  for (size_t i = 1; i < std::size(kCentral); ++i)
    for (int k = 0; k < N; ++k) p[k] = _mm512_add_ps(splat(kCentral[i]), _mm512_mul_ps(p[k], a[k]));
  for (int k = 0; k < N; ++k) {
    const __mmask16 central = _mm512_cmp_ps_mask(w[k], splat(5.0f), _CMP_LT_OQ);
    if (central != 0xFFFF) {
      const __m512 t = _mm512_sub_ps(_mm512_sqrt_ps(w[k]), splat(3.0f));
      __m512 q = splat(kTail[0]);
      for (size_t i = 1; i < std::size(kTail); ++i) q = _mm512_add_ps(splat(kTail[i]), _mm512_mul_ps(q, t));
      p[k] = _mm512_mask_blend_ps(central, q, p[k]);
    }
    x[k] = _mm512_mul_ps(p[k], x[k]);
  }
}

// transform() on N x 16 elements; `keep` marks the elements of the last vector.
template <int N>
TESSEL_AVX512 inline void transform16(const SampleSpec& spec, const uint32_t* words, __mmask16 keep, float* o) {
  const __m512 lo = splat(spec.lo);
  __m512 x[N];
  for (int k = 0; k < N; ++k) {
    const __m512i w = k == N - 1 ? _mm512_maskz_loadu_epi32(keep, words + 16 * k) : _mm512_loadu_si512(words + 16 * k);
    x[k] = _mm512_add_ps(lo, _mm512_mul_ps(unit16(w), splat(spec.hi - spec.lo)));
  }
  if (spec.kind == SampleSpec::Kind::kUniform) {
    for (int k = 0; k < N; ++k) x[k] = _mm512_mul_ps(x[k], splat(spec.scale));
  } else {
    for (int k = 0; k < N; ++k) x[k] = _mm512_max_ps(x[k], lo);
    erfinv16(x);
    for (int k = 0; k < N; ++k) {
      const __m512 z = _mm512_mul_ps(splat(1.41421356f), x[k]);
      x[k] = _mm512_mul_ps(_mm512_min_ps(splat(spec.clamp_hi), _mm512_max_ps(splat(spec.clamp_lo), z)), splat(spec.scale));
    }
  }
  for (int k = 0; k < N - 1; ++k) _mm512_storeu_ps(o + 16 * k, x[k]);
  _mm512_mask_storeu_ps(o + 16 * (N - 1), keep, x[N - 1]);
}

// The words of elements [first, first + n) in runs of up to 128, one philox32 call each.
struct WordRun {
  const uint32_t* words;
  size_t count;
  size_t offset;  // of the run's first word, from `first`
};

// Fill writes the 128 words of the 32 blocks from a block counter (philox32 or philox32_avx2).
template <void (*Fill)(const PhiloxKey&, uint64_t, uint32_t*)>
class PhiloxRuns {
 public:
  PhiloxRuns(const PhiloxKey& key, uint64_t first, size_t n) : key_(key), first_(first), n_(n) {}
  bool done() const { return done_ == n_; }
  WordRun next() {
    const uint64_t at = first_ + done_;
    const auto skip = static_cast<size_t>(at % 4);
    Fill(key_, at / 4, words_);
    const WordRun run{words_ + skip, std::min(128 - skip, n_ - done_), done_};
    done_ += run.count;
    return run;
  }

 private:
  const PhiloxKey& key_;
  uint64_t first_;
  size_t n_;
  size_t done_ = 0;
  alignas(64) uint32_t words_[128];
};

TESSEL_AVX512 void sample_f32_avx512(const PhiloxKey& key, uint64_t first, size_t n, const SampleSpec& spec,
                                     float* out) {
  for (PhiloxRuns<philox32> runs(key, first, n); !runs.done();) {
    const WordRun run = runs.next();
    if (run.count == 128) {
      transform16<8>(spec, run.words, 0xFFFF, out + run.offset);
      continue;
    }
    for (size_t j = 0; j < run.count; j += 16) {
      const size_t m = std::min<size_t>(16, run.count - j);
      transform16<1>(spec, run.words + j, static_cast<__mmask16>((1u << m) - 1), out + run.offset + j);
    }
  }
}

// The same two kernels for CPUs with AVX2 and without AVX-512 (the AMD EPYC Zen 3 VM): eight
// lanes, compare results as masks. Without them an init ran at 5% of memset's bandwidth there.
// The same exactly rounded operations in the same order (no fused multiply-add: the file is built
// with -ffp-contract=off), so the same bits.
#define TESSEL_AVX2 __attribute__((target("avx2")))

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

TESSEL_AVX2 inline __m256i splat8(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
TESSEL_AVX2 inline __m256 splat8(float v) { return _mm256_set1_ps(v); }

// Philox4x32-10 of four blocks, one per 64-bit lane, as Philox8.
struct Philox4 {
  __m256i c0, c1, c2, c3;
};

TESSEL_AVX2 inline Philox4 philox4_start(uint64_t first_block) {
  const __m256i blocks = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first_block)),
                                          _mm256_set_epi64x(3, 2, 1, 0));
  return {blocks, _mm256_srli_epi64(blocks, 32), _mm256_setzero_si256(), _mm256_setzero_si256()};
}

TESSEL_AVX2 inline void philox4_round(Philox4& x, __m256i k0, __m256i k1) {
  const __m256i m0 = _mm256_set1_epi64x(kM0), m1 = _mm256_set1_epi64x(kM1);
  const __m256i p0 = _mm256_mul_epu32(x.c0, m0), p1 = _mm256_mul_epu32(x.c2, m1);
  x.c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), x.c1), k0);
  x.c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), x.c3), k1);
  x.c1 = p1;
  x.c3 = p0;
}

// The four blocks' 16 words in element order.
TESSEL_AVX2 inline void philox4_store(const Philox4& x, uint32_t* words) {
  const __m256i w01 = _mm256_blend_epi32(x.c0, _mm256_slli_epi64(x.c1, 32), 0xAA);
  const __m256i w23 = _mm256_blend_epi32(x.c2, _mm256_slli_epi64(x.c3, 32), 0xAA);
  const __m256i even = _mm256_unpacklo_epi64(w01, w23);  // 128-bit lane L: block 2 L
  const __m256i odd = _mm256_unpackhi_epi64(w01, w23);   // block 2 L + 1
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words), _mm256_permute2x128_si256(even, odd, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 8), _mm256_permute2x128_si256(even, odd, 0x31));
}

// philox32 in two passes of four groups of four blocks (four chains, 16 registers).
TESSEL_AVX2 void philox32_avx2(const PhiloxKey& key, uint64_t first_block, uint32_t* words) {
  for (int half = 0; half < 2; ++half) {
    Philox4 x[4];
    for (int g = 0; g < 4; ++g) x[g] = philox4_start(first_block + 16 * static_cast<uint64_t>(half) + 4 * static_cast<uint64_t>(g));
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      const __m256i kk0 = splat8(k0), kk1 = splat8(k1);
      for (auto& g : x) philox4_round(g, kk0, kk1);
      k0 += kW0;
      k1 += kW1;
    }
    for (int g = 0; g < 4; ++g) philox4_store(x[g], words + 64 * half + 16 * g);
  }
}

TESSEL_AVX2 inline __m256 unit8(__m256i w) {
  return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_srli_epi32(w, 9), splat8(0x3f800000u))), splat8(1.0f));
}

template <int N>
TESSEL_AVX2 inline void log8(__m256 (&v)[N]) {
  __m256 m[N], s[N], s2[N], p[N];
  __m256i e[N];
  for (int k = 0; k < N; ++k) {
    const __m256i b = _mm256_castps_si256(v[k]);
    e[k] = _mm256_sub_epi32(_mm256_srli_epi32(b, 23), splat8(127u));
    m[k] = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(b, splat8(0x7fffffu)), splat8(0x3f800000u)));
    const __m256 big = _mm256_cmp_ps(m[k], splat8(1.41421356f), _CMP_GT_OQ);
    m[k] = _mm256_blendv_ps(m[k], _mm256_mul_ps(m[k], splat8(0.5f)), big);
    e[k] = _mm256_sub_epi32(e[k], _mm256_castps_si256(big));  // big lanes are -1: e + 1
  }
  for (int k = 0; k < N; ++k) s[k] = _mm256_div_ps(_mm256_sub_ps(m[k], splat8(1.0f)), _mm256_add_ps(m[k], splat8(1.0f)));
  for (int k = 0; k < N; ++k) s2[k] = _mm256_mul_ps(s[k], s[k]);
  for (int k = 0; k < N; ++k) p[k] = _mm256_mul_ps(s2[k], splat8(0.22222222f));
  for (const float c : {0.28571429f, 0.4f, 0.66666667f})
    for (int k = 0; k < N; ++k) p[k] = _mm256_mul_ps(s2[k], _mm256_add_ps(splat8(c), p[k]));
  for (int k = 0; k < N; ++k) {
    v[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(e[k]), splat8(0.69314718f)),
                         _mm256_add_ps(_mm256_mul_ps(splat8(2.0f), s[k]), _mm256_mul_ps(s[k], p[k])));
  }
}

template <int N>
TESSEL_AVX2 inline void erfinv8(__m256 (&x)[N]) {
  __m256 w[N], a[N], p[N];
  for (int k = 0; k < N; ++k) w[k] = _mm256_mul_ps(_mm256_sub_ps(splat8(1.0f), x[k]), _mm256_add_ps(splat8(1.0f), x[k]));
  log8(w);
  for (int k = 0; k < N; ++k) {
    w[k] = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(w[k]), splat8(0x80000000u)));
    a[k] = _mm256_sub_ps(w[k], splat8(2.5f));
    p[k] = splat8(kCentral[0]);
  }
  for (size_t i = 1; i < std::size(kCentral); ++i)
    for (int k = 0; k < N; ++k) p[k] = _mm256_add_ps(splat8(kCentral[i]), _mm256_mul_ps(p[k], a[k]));
  for (int k = 0; k < N; ++k) {
    const __m256 central = _mm256_cmp_ps(w[k], splat8(5.0f), _CMP_LT_OQ);
    if (_mm256_movemask_ps(central) != 0xFF) {
      const __m256 t = _mm256_sub_ps(_mm256_sqrt_ps(w[k]), splat8(3.0f));
      __m256 q = splat8(kTail[0]);
      for (size_t i = 1; i < std::size(kTail); ++i) q = _mm256_add_ps(splat8(kTail[i]), _mm256_mul_ps(q, t));
      p[k] = _mm256_blendv_ps(q, p[k], central);
    }
    x[k] = _mm256_mul_ps(p[k], x[k]);
  }
}

// transform() on N x 8 elements; `count` (1 to 8) of the last vector's are kept.
template <int N>
TESSEL_AVX2 inline void transform8(const SampleSpec& spec, const uint32_t* words, int count, float* o) {
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 lo = splat8(spec.lo);
  __m256 x[N];
  for (int k = 0; k < N; ++k) {
    const int* at = reinterpret_cast<const int*>(words + 8 * k);
    const __m256i w = k == N - 1 ? _mm256_maskload_epi32(at, keep) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    x[k] = _mm256_add_ps(lo, _mm256_mul_ps(unit8(w), splat8(spec.hi - spec.lo)));
  }
  if (spec.kind == SampleSpec::Kind::kUniform) {
    for (int k = 0; k < N; ++k) x[k] = _mm256_mul_ps(x[k], splat8(spec.scale));
  } else {
    for (int k = 0; k < N; ++k) x[k] = _mm256_max_ps(x[k], lo);
    erfinv8(x);
    for (int k = 0; k < N; ++k) {
      const __m256 z = _mm256_mul_ps(splat8(1.41421356f), x[k]);
      x[k] = _mm256_mul_ps(_mm256_min_ps(splat8(spec.clamp_hi), _mm256_max_ps(splat8(spec.clamp_lo), z)), splat8(spec.scale));
    }
  }
  for (int k = 0; k < N - 1; ++k) _mm256_storeu_ps(o + 8 * k, x[k]);
  _mm256_maskstore_ps(o + 8 * (N - 1), keep, x[N - 1]);
}

TESSEL_AVX2 void sample_f32_avx2(const PhiloxKey& key, uint64_t first, size_t n, const SampleSpec& spec, float* out) {
  for (PhiloxRuns<philox32_avx2> runs(key, first, n); !runs.done();) {
    const WordRun run = runs.next();
    if (run.count == 128) {
      for (size_t j = 0; j < 128; j += 64) transform8<8>(spec, run.words + j, 8, out + run.offset + j);
      continue;
    }
    for (size_t j = 0; j < run.count; j += 8) {
      const int m = static_cast<int>(std::min<size_t>(8, run.count - j));
      transform8<1>(spec, run.words + j, m, out + run.offset + j);
    }
  }
}
#endif  // TESSEL_SAMPLING_AVX512

}  // namespace

float erfinv_f32(float x) { return erfinv(x); }

void sampling_prefer_avx2([[maybe_unused]] bool yes) {
#ifdef TESSEL_SAMPLING_AVX512
  prefer_avx2 = yes;
#endif
}

void random_words(const PhiloxKey& key, uint64_t first, size_t n, uint32_t* out) {
#ifdef TESSEL_SAMPLING_AVX512
  auto copy = [&](auto&& runs) {
    while (!runs.done()) {
      const WordRun run = runs.next();
      std::copy_n(run.words, run.count, out + run.offset);
    }
  };
  if (use_avx512()) return copy(PhiloxRuns<philox32>(key, first, n));
  if (has_avx2()) return copy(PhiloxRuns<philox32_avx2>(key, first, n));
#endif
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
#ifdef TESSEL_SAMPLING_AVX512
  if (use_avx512()) return sample_f32_avx512(key, first, n, spec, out);
  if (has_avx2()) return sample_f32_avx2(key, first, n, spec, out);
#endif
  constexpr size_t kBatch = 4 * kBlocks;
  alignas(64) uint32_t words[kBatch];
  for (size_t done = 0; done < n; done += kBatch) {
    const size_t m = std::min(kBatch, n - done);
    random_words(key, first + done, m, words);
    transform(spec, words, m, out + done);
  }
}

}  // namespace tessel::detail
