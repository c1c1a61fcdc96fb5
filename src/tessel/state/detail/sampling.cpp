// Compiled with -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off (src/CMakeLists.txt): a
// multiply and an add are fused only where written as std::fma, and std::fma rounds once whether
// it is an instruction or libm's software, so the AVX2 + FMA kernels and the portable code give
// the same bits.
#include "tessel/state/detail/sampling.h"

#include "tessel/state/detail/ars.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <iterator>
#include <numbers>

#if defined(__x86_64__) && !defined(TESSEL_SAMPLING_BASELINE_ONLY)
#include <cpuid.h>
#include <immintrin.h>
#define TESSEL_SAMPLING_X86 1
#endif

namespace tessel::detail {
namespace {

// Words per generator call: up to 256 ARS blocks. Each of the transform's passes over a run starts
// and drains a pipeline of dependent operations; runs of 1024 words (4 KiB, the transform's two
// buffers 8 KiB more: all in L1) make that cost small against the run's work.
constexpr size_t kRunWords = 1024;

// Words come in groups of 16 blocks (64 words), the VAES kernel's unit.
constexpr size_t kGroupWords = 64;
static_assert(kRunWords % kGroupWords == 0);

// The words of the `m` / 4 blocks from `first_block` (m a multiple of kGroupWords, at most
// kRunWords), in element order.
using WordsFn = void (*)(const ArsRoundKeys&, uint64_t, size_t, uint32_t*);

void ars_words_portable(const ArsRoundKeys& rk, uint64_t first_block, size_t m, uint32_t* words) {
  for (size_t j = 0; j < m / 4; ++j) {
    const uint64_t b = first_block + j;
    const Counter128 out = ars4x32_7({static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0, 0}, rk);
    std::copy(out.begin(), out.end(), words + 4 * j);
  }
}

// [0, 1) from the top 23 bits, as JAX does.
inline float unit(uint32_t w) { return std::bit_cast<float>((w >> 9) | 0x3f800000u) - 1.0f; }

// -log(x) for normal positive floats: exponent plus 2 atanh((m - 1) / (m + 1)) with m in
// [sqrt(1/2), sqrt(2)), both negated; the series' first omitted term is below 1e-9 relative.
constexpr float kLn2 = 0.69314718f;
constexpr int32_t kSqrtHalfBits = 0x3f3504f3;  // sqrt(1/2)
constexpr float kAtanh[] = {0.22222222f, 0.28571429f, 0.4f, 0.66666667f};  // 2 / (2 k + 1), k = 4 .. 1

inline float neg_log_f32(float x) {
  const auto b = std::bit_cast<int32_t>(x);
  const int32_t e = (b - kSqrtHalfBits) >> 23;  // floor(log2(x / sqrt(1/2)))
  const float m = std::bit_cast<float>(b - (e << 23));
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = kAtanh[0];
  for (size_t i = 1; i < std::size(kAtanh); ++i) p = std::fma(p, s2, kAtanh[i]);
  p *= s2;
  const float log_m = std::fma(s, p, s + s);
  return std::fma(-static_cast<float>(e), kLn2, -log_m);
}

// Giles' single-precision erfinv polynomials, highest power first: the central region (w < 5, in
// w - 2.5) and the tail (in sqrt(w) - 3), with w = -log(1 - x^2).
constexpr double kCentral[] = {2.81022636e-08f, 3.43273939e-07f, -3.5233877e-06f, -4.39150654e-06f, 0.00021858087f,
                               -0.00125372503f, -0.00417768164f, 0.246640727f, 1.50140941f};
constexpr double kTail[] = {-0.000200214257f, 0.000100950558f, 0.00134934322f, -0.00367342844f, 0.00573950773f,
                            -0.0076224613f, 0.00943887047f, 1.00167406f, 2.83297682f};
constexpr size_t kTerms = std::size(kCentral);

// The two polynomials times a factor (sqrt 2 times the scale for a normal: one multiply gives the
// sample), each coefficient rounded to f32 once.
struct ErfinvPoly {
  float central[kTerms], tail[kTerms];
  explicit ErfinvPoly(double factor) {
    for (size_t i = 0; i < kTerms; ++i) {
      central[i] = static_cast<float>(kCentral[i] * factor);
      tail[i] = static_cast<float>(kTail[i] * factor);
    }
  }
};

inline float erfinv(float x, const ErfinvPoly& c) {
  const float w = neg_log_f32(std::fma(-x, x, 1.0f));
  if (w < 5.0f) {
    const float a = w - 2.5f;
    float p = c.central[0];
    for (size_t i = 1; i < kTerms; ++i) p = std::fma(p, a, c.central[i]);
    return p * x;
  }
  const float t = std::sqrt(w) - 3.0f;
  float q = c.tail[0];
  for (size_t i = 1; i < kTerms; ++i) q = std::fma(q, t, c.tail[i]);
  return q * x;
}

// What the kernels take from a SampleSpec.
struct Sampler {
  SampleSpec::Kind kind;
  float lo, width, scale, clamp_lo, clamp_hi;
  bool clamp;
  // Whether max(u, lo) can change u = fma(f, width, lo): for a finite nonzero lo and a finite
  // width >= 0 it cannot (lo + f width >= lo exactly, and rounding is monotone); for lo = -0 it
  // can (it turns +0 into -0).
  bool lift;
  // Whether erfinv's tail polynomial (w = -log(1 - u^2) >= 5, |u| > 0.9966) can be taken: not
  // where every u has |u| <= 0.99 (then w < 4), as for a normal truncated at 2 sigma.
  bool tail;
  ErfinvPoly poly;
  explicit Sampler(const SampleSpec& s)
      : kind(s.kind), lo(s.lo), width(s.hi - s.lo), scale(s.scale), clamp_lo(s.clamp_lo), clamp_hi(s.clamp_hi),
        clamp(s.clamp_lo > -3.4e38f || s.clamp_hi < 3.4e38f),
        lift(!(std::isfinite(lo) && lo != 0 && std::isfinite(width) && width >= 0)),
        tail(lift || !(std::max(std::fabs(lo), std::fabs(std::fma(1.0f - 0x1p-23f, width, lo))) <= 0.99f)),
        poly(std::numbers::sqrt2 * s.scale) {}
};

void transform_portable(const Sampler& sp, const uint32_t* words, size_t m, float* o) {
  const float lo = sp.lo, width = sp.width;
  if (sp.kind == SampleSpec::Kind::kUniform) {
    for (size_t j = 0; j < m; ++j) o[j] = std::fma(unit(words[j]), width, lo) * sp.scale;
    return;
  }
  for (size_t j = 0; j < m; ++j) {
    float u = std::fma(unit(words[j]), width, lo);
    u = u > lo ? u : lo;  // as maxps: the second operand unless the first is greater
    float z = erfinv(u, sp.poly);
    if (sp.clamp) {
      z = sp.clamp_lo > z ? sp.clamp_lo : z;
      z = sp.clamp_hi < z ? sp.clamp_hi : z;
    }
    o[j] = z;
  }
}

#ifdef TESSEL_SAMPLING_X86
// x86 kernels, chosen at run time. ARS-7 with the AES instructions: 256-bit VAES (two blocks per
// instruction) where the CPU has it, else 128-bit AES-NI. The transform with AVX2 and FMA.
#define TESSEL_AESNI __attribute__((target("aes,sse4.1")))
#define TESSEL_VAES __attribute__((target("avx2,aes,vaes")))
#define TESSEL_AVX2 __attribute__((target("avx2,fma")))

bool cpu_has_aesni_avx2() {
  static const bool yes =
      __builtin_cpu_supports("aes") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// CPUID leaf 7, ECX bit 9 (clang's __builtin_cpu_supports has no "vaes").
bool cpu_has_vaes() {
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return cpu_has_aesni_avx2() && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 9)) != 0;
  }();
  return yes;
}

// Eight blocks at a time: aesenc has a latency of about four cycles and two issue per cycle, so
// eight independent chains keep both AES units busy.
TESSEL_AESNI void ars_words_aesni(const ArsRoundKeys& rk, uint64_t first_block, size_t m, uint32_t* words) {
  __m128i k[8];
  for (int r = 0; r < 8; ++r) k[r] = _mm_set_epi64x(static_cast<long long>(rk.hi[r]), static_cast<long long>(rk.lo[r]));
  for (size_t group = 0; group < m / 32; ++group) {
    __m128i v[8];
    for (size_t j = 0; j < 8; ++j)
      v[j] = _mm_xor_si128(_mm_set_epi64x(0, static_cast<long long>(first_block + 8 * group + j)), k[0]);
    for (int r = 1; r < 7; ++r)
      for (auto& x : v) x = _mm_aesenc_si128(x, k[r]);
    for (size_t j = 0; j < 8; ++j)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(words + 32 * group + 4 * j), _mm_aesenclast_si128(v[j], k[7]));
  }
}

TESSEL_VAES void ars_words_vaes(const ArsRoundKeys& rk, uint64_t first_block, size_t m, uint32_t* words) {
  __m256i k[8];
  for (int r = 0; r < 8; ++r) {
    const auto lo = static_cast<long long>(rk.lo[r]), hi = static_cast<long long>(rk.hi[r]);
    k[r] = _mm256_set_epi64x(hi, lo, hi, lo);
  }
  // Counters b and b + 1 in the low and high 128 bits: 64-bit adds step them.
  const auto b = static_cast<long long>(first_block);
  const __m256i two = _mm256_set_epi64x(0, 2, 0, 2);
  __m256i counter = _mm256_set_epi64x(0, b + 1, 0, b);
  for (size_t group = 0; group < m / kGroupWords; ++group) {
    __m256i v[8];
    for (auto& x : v) {
      x = _mm256_xor_si256(counter, k[0]);
      counter = _mm256_add_epi64(counter, two);
    }
    for (int r = 1; r < 7; ++r)
      for (auto& x : v) x = _mm256_aesenc_epi128(x, k[r]);
    for (size_t j = 0; j < 8; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 64 * group + 8 * j), _mm256_aesenclast_epi128(v[j], k[7]));
  }
}

TESSEL_AVX2 inline __m256i splat8(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
TESSEL_AVX2 inline __m256 splat8(float v) { return _mm256_set1_ps(v); }

TESSEL_AVX2 inline __m256 unit8(__m256i w) {
  return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_srli_epi32(w, 9), splat8(0x3f800000u))), splat8(1.0f));
}

// fma(f, width, lo) with f in [0, 1) from the vector of words at `p`.
TESSEL_AVX2 inline __m256 uniform8(const __m256i* p, __m256 width, __m256 lo) {
  return _mm256_fmadd_ps(unit8(_mm256_loadu_si256(p)), width, lo);
}

// The transform of a run in four passes over its vectors (uniforms; the logarithm's reduction and
// division; its series; erfinv's polynomial), each a loop whose iterations are independent: the
// core overlaps several vectors' chains of dependent operations, which one vector's ~40 step chain
// alone would leave idle. Shorter chains per pass let it overlap more of them: the logarithm in two
// passes measured ~5% faster than in one, and unrolling each pass twice ~3% more. Every lane sees
// the same operations as the portable code, so the bits do not change. On Zen 3 (llvm-mca's model)
// the passes are bound by the two FMA pipes, where multiplies, fused multiply-adds, min/max,
// compares and AES all issue, so an operation that cannot change a lane is left out where the
// Sampler proves it (Sampler::lift, Sampler::tail).

// The logarithm's first steps: x = 2^e m, m in [sqrt(1/2), sqrt(2)); s = (m - 1) / (m + 1).
TESSEL_AVX2 inline void neg_log8_reduce(__m256 v, __m256& s, __m256& e) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i ei = _mm256_srai_epi32(_mm256_sub_epi32(b, splat8(static_cast<uint32_t>(kSqrtHalfBits))), 23);
  const __m256 m = _mm256_castsi256_ps(_mm256_sub_epi32(b, _mm256_slli_epi32(ei, 23)));
  s = _mm256_div_ps(_mm256_sub_ps(m, splat8(1.0f)), _mm256_add_ps(m, splat8(1.0f)));
  e = _mm256_cvtepi32_ps(ei);
}

// Then -(e ln 2 + 2 atanh(s)).
TESSEL_AVX2 inline __m256 neg_log8_series(__m256 s, __m256 e) {
  const __m256 s2 = _mm256_mul_ps(s, s);
  __m256 p = splat8(kAtanh[0]);
  for (size_t i = 1; i < std::size(kAtanh); ++i) p = _mm256_fmadd_ps(p, s2, splat8(kAtanh[i]));
  const __m256 log_m = _mm256_fmadd_ps(s, _mm256_mul_ps(p, s2), _mm256_add_ps(s, s));
  return _mm256_fnmsub_ps(e, splat8(kLn2), log_m);
}

// The central polynomial's coefficients as vectors, hoisted out of the loop: read through the
// Sampler, each would be broadcast again for every vector (the output may alias it).
struct CentralPoly8 {
  __m256 c[kTerms];
};

template <bool kTail>
TESSEL_AVX2 inline __m256 erfinv_poly8(__m256 w, const CentralPoly8& central, const ErfinvPoly& c) {
  const __m256 a = _mm256_sub_ps(w, splat8(2.5f));
  __m256 p = central.c[0];
  for (size_t i = 1; i < kTerms; ++i) p = _mm256_fmadd_ps(p, a, central.c[i]);
  if constexpr (kTail) {
    const __m256 is_central = _mm256_cmp_ps(w, splat8(5.0f), _CMP_LT_OQ);
    if (_mm256_movemask_ps(is_central) != 0xFF) [[unlikely]] {
      const __m256 t = _mm256_sub_ps(_mm256_sqrt_ps(w), splat8(3.0f));
      __m256 q = splat8(c.tail[0]);
      for (size_t i = 1; i < kTerms; ++i) q = _mm256_fmadd_ps(q, t, splat8(c.tail[i]));
      p = _mm256_blendv_ps(q, p, is_central);
    }
  }
  return p;
}

// The polynomial pass: samples from the logarithms `w` and uniforms `x` of `vectors` vectors, vector
// v into out(v). A template, so neither the clamp's nor the tail's test is in the loop where it is
// not needed.
template <bool kClamp, bool kTail, class Out>
TESSEL_AVX2 inline void erfinv_pass(const Sampler& sp, const float* w, const float* x, size_t vectors, Out out) {
  CentralPoly8 central;
  for (size_t i = 0; i < kTerms; ++i) central.c[i] = splat8(sp.poly.central[i]);
  const __m256 clamp_lo = splat8(sp.clamp_lo), clamp_hi = splat8(sp.clamp_hi);
#pragma GCC unroll 2
  for (size_t v = 0; v < vectors; ++v) {
    const __m256 p = erfinv_poly8<kTail>(_mm256_load_ps(w + 8 * v), central, sp.poly);
    __m256 r = _mm256_mul_ps(p, _mm256_load_ps(x + 8 * v));
    if constexpr (kClamp) r = _mm256_min_ps(clamp_hi, _mm256_max_ps(clamp_lo, r));
    _mm256_storeu_ps(out(v), r);
  }
}

// transform_portable on `m` (up to kRunWords) words.
TESSEL_AVX2 void transform_avx2(const Sampler& sp, const uint32_t* words, size_t m, float* o) {
  alignas(32) float x[kRunWords], w[kRunWords], e[kRunWords];
  // A part vector at the end goes through zero-padded copies: nothing past the m words is read or
  // past the m outputs written.
  const size_t full = m / 8, vectors = (m + 7) / 8;
  alignas(32) uint32_t tail_words[8] = {};
  alignas(32) float tail_out[8];
  std::copy_n(words + 8 * full, m % 8, tail_words);
  const auto in = [&](size_t v) { return reinterpret_cast<const __m256i*>(v < full ? words + 8 * v : tail_words); };
  const auto out = [&](size_t v) { return v < full ? o + 8 * v : tail_out; };
  const __m256 lo = splat8(sp.lo), width = splat8(sp.width);
  if (sp.kind == SampleSpec::Kind::kUniform) {
    const __m256 scale = splat8(sp.scale);
    for (size_t v = 0; v < vectors; ++v) _mm256_storeu_ps(out(v), _mm256_mul_ps(uniform8(in(v), width, lo), scale));
  } else {
    if (sp.lift) {
#pragma GCC unroll 2
      for (size_t v = 0; v < vectors; ++v) _mm256_store_ps(x + 8 * v, _mm256_max_ps(uniform8(in(v), width, lo), lo));
    } else {
#pragma GCC unroll 2
      for (size_t v = 0; v < vectors; ++v) _mm256_store_ps(x + 8 * v, uniform8(in(v), width, lo));
    }
#pragma GCC unroll 2
    for (size_t v = 0; v < vectors; ++v) {
      const __m256 u = _mm256_load_ps(x + 8 * v);
      __m256 sv, ev;
      neg_log8_reduce(_mm256_fnmadd_ps(u, u, splat8(1.0f)), sv, ev);
      _mm256_store_ps(w + 8 * v, sv);
      _mm256_store_ps(e + 8 * v, ev);
    }
#pragma GCC unroll 2
    for (size_t v = 0; v < vectors; ++v)
      _mm256_store_ps(w + 8 * v, neg_log8_series(_mm256_load_ps(w + 8 * v), _mm256_load_ps(e + 8 * v)));
    if (sp.clamp) {
      if (sp.tail) erfinv_pass<true, true>(sp, w, x, vectors, out);
      else erfinv_pass<true, false>(sp, w, x, vectors, out);
    } else {
      if (sp.tail) erfinv_pass<false, true>(sp, w, x, vectors, out);
      else erfinv_pass<false, false>(sp, w, x, vectors, out);
    }
  }
  std::copy_n(tail_out, m % 8, o + 8 * full);
}
#endif  // TESSEL_SAMPLING_X86

std::atomic<SamplingKernels> requested{SamplingKernels::kBest};  // sampling_use

using TransformFn = void (*)(const Sampler&, const uint32_t*, size_t, float*);

struct Kernels {
  WordsFn words = ars_words_portable;
  TransformFn transform = transform_portable;
};

Kernels kernels() {
  [[maybe_unused]] const SamplingKernels want = requested.load(std::memory_order_relaxed);
#ifdef TESSEL_SAMPLING_X86
  if (want == SamplingKernels::kBest && cpu_has_vaes()) return {ars_words_vaes, transform_avx2};
  if (want != SamplingKernels::kPortable && cpu_has_aesni_avx2()) return {ars_words_aesni, transform_avx2};
#endif
  return {};
}

// The words of elements [first, first + n) in runs of up to kRunWords, one generator call each.
struct WordRun {
  const uint32_t* words;
  size_t count;
  size_t offset;  // of the run's first word, from `first`
};

class WordRuns {
 public:
  WordRuns(const ArsKey& key, uint64_t first, size_t n, WordsFn fill)
      : round_keys_(ars_round_keys(key)), first_(first), n_(n), fill_(fill) {}
  bool done() const { return done_ == n_; }
  WordRun next() {
    const uint64_t at = first_ + done_;
    const auto skip = static_cast<size_t>(at % 4);
    const size_t count = std::min(kRunWords - skip, n_ - done_);
    fill_(round_keys_, at / 4, (skip + count + kGroupWords - 1) / kGroupWords * kGroupWords, words_);
    const WordRun run{words_ + skip, count, done_};
    done_ += run.count;
    return run;
  }

 private:
  ArsRoundKeys round_keys_;
  uint64_t first_;
  size_t n_;
  WordsFn fill_;
  size_t done_ = 0;
  alignas(64) uint32_t words_[kRunWords];
};

}  // namespace

float erfinv_f32(float x) {
  static const ErfinvPoly plain(1.0);
  return erfinv(x, plain);
}

void sampling_use(SamplingKernels kernels) { requested = kernels; }

void random_words(const ArsKey& key, uint64_t first, size_t n, uint32_t* out) {
  for (WordRuns runs(key, first, n, kernels().words); !runs.done();) {
    const WordRun run = runs.next();
    std::copy_n(run.words, run.count, out + run.offset);
  }
}

void sample_f32(const ArsKey& key, uint64_t first, size_t n, const SampleSpec& spec, float* out) {
  const Kernels k = kernels();
  const Sampler sampler(spec);
  for (WordRuns runs(key, first, n, k.words); !runs.done();) {
    const WordRun run = runs.next();
    k.transform(sampler, run.words, run.count, out + run.offset);
  }
}

}  // namespace tessel::detail
