// Internal: the batched sampling kernels behind Initializer::fill. Every element's value is a pure
// function of (key, element index): element i takes word i % 4 of the ARS-7 block i / 4 and is
// transformed in f32 by exactly rounded operations only (IEEE add, multiply, divide, square root
// and fused multiply-add; no library calls, no contraction left to the compiler), so the vector
// and scalar code paths, and any -march, give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/state/random.h"

namespace tessel::detail {

// The 32-bit words of elements [first, first + n).
void random_words(const ArsKey& key, uint64_t first, size_t n, uint32_t* out);

struct SampleSpec {
  enum class Kind { kUniform, kErfinv } kind = Kind::kUniform;
  // kUniform: fma(f, hi - lo, lo) * scale with f uniform in [0, 1) (23 bits).
  // kErfinv: sqrt(2) * scale * erfinv(u) with u = max(lo, fma(f, hi - lo, lo)) (the factor folded
  // into erfinv's polynomials), then clamped to [clamp_lo, clamp_hi]: a normal (lo = -1 + 2^-24,
  // hi = 1) or a normal truncated to [a, b] (lo = erf(a / sqrt 2), hi = erf(b / sqrt 2), the clamp
  // just inside [a, b] * scale).
  float lo = 0, hi = 1, scale = 1;
  float clamp_lo = -3.4e38f, clamp_hi = 3.4e38f;
};

// Writes the f32 samples of elements [first, first + n).
void sample_f32(const ArsKey& key, uint64_t first, size_t n, const SampleSpec& spec, float* out);

// For tests: which kernels to take, where the CPU has them (else the next one down). kBest: AES
// words from 256-bit VAES where there, AVX2 + FMA transform; kAesNi: 128-bit AES-NI words and the
// AVX2 + FMA transform; kPortable: the portable code alone. All must give the same bits.
enum class SamplingKernels { kBest, kAesNi, kPortable };
void sampling_use(SamplingKernels kernels);

// erfinv in f32 (Giles' single-precision polynomials; exposed for its accuracy test).
float erfinv_f32(float x);

}  // namespace tessel::detail
