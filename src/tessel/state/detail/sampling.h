// Internal: the batched sampling kernels behind Initializer::fill. Every element's value is a pure
// function of (key, element index): element i takes word i % 4 of the Philox block i / 4 and is
// transformed in f32 by IEEE operations only (no library calls, no FMA contraction), so the
// vector and scalar code paths, and any -march, give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/state/random.h"

namespace tessel::detail {

// The 32-bit words of elements [first, first + n).
void random_words(const PhiloxKey& key, uint64_t first, size_t n, uint32_t* out);

struct SampleSpec {
  enum class Kind { kUniform, kErfinv } kind = Kind::kUniform;
  // kUniform: (lo + f * (hi - lo)) * scale with f uniform in [0, 1) (23 bits).
  // kErfinv: sqrt(2) * erfinv(u) * scale with u uniform in [lo, hi), clamped to [clamp_lo, clamp_hi]
  // before scaling: a normal (lo = -1 + 2^-24, hi = 1) or a normal truncated to [a, b] (lo = erf(a / sqrt 2)).
  float lo = 0, hi = 1, scale = 1;
  float clamp_lo = -3.4e38f, clamp_hi = 3.4e38f;
};

// Writes the f32 samples of elements [first, first + n).
void sample_f32(const PhiloxKey& key, uint64_t first, size_t n, const SampleSpec& spec, float* out);
// For tests: take the AVX2 kernels even where AVX-512F is there (they must give the same bits).
void sampling_prefer_avx2(bool yes);

// erfinv in f32 (Giles' single-precision polynomials; exposed for its accuracy test).
float erfinv_f32(float x);

}  // namespace tessel::detail
