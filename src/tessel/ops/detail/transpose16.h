// Internal: a 16 x 16 block of floats transposed in AVX-512 registers (packed_gemm packs
// transposed operands with it, small_gemm transposes the attention's keys and values).
#pragma once

#include <immintrin.h>

namespace tessel::ops::detail {

// transpose16 in 4 steps of b = 8, 4, 2, 1: rows i and i + b (i without bit b) swap their lanes
// with bit b set in row i for those with it clear in row i + b. The lanes one two-register
// permute picks for the new row i (keep) and row i + b (swap).
struct TransposeStep {
  alignas(64) int keep[16];
  alignas(64) int swap[16];
};
constexpr TransposeStep transpose_step(int b) {
  TransposeStep s{};
  for (int j = 0; j < 16; ++j) {
    s.keep[j] = (j & b) ? 16 + j - b : j;
    s.swap[j] = (j & b) ? 16 + j : j + b;
  }
  return s;
}
inline constexpr TransposeStep kTransposeSteps[4] = {transpose_step(8), transpose_step(4), transpose_step(2), transpose_step(1)};

// r[i] (16 floats each) becomes column i of the 16 x 16 block they held.
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  for (int step = 0; step < 4; ++step) {
    const int b = 8 >> step;
    const __m512i keep = _mm512_load_si512(kTransposeSteps[step].keep);
    const __m512i swap = _mm512_load_si512(kTransposeSteps[step].swap);
    for (int i = 0; i < 16; ++i) {
      if (i & b) continue;
      const __m512 lo = r[i], hi = r[i + b];
      r[i] = _mm512_permutex2var_ps(lo, keep, hi);
      r[i + b] = _mm512_permutex2var_ps(lo, swap, hi);
    }
  }
}

}  // namespace tessel::ops::detail
