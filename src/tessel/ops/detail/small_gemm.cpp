#include "tessel/ops/detail/small_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <string>

#include "tessel/core/error.h"
#include "tessel/ops/detail/blas_setup.h"
#include "tessel/ops/detail/transpose16.h"

namespace tessel::ops::detail {

namespace {

// The columns a tile covers at most: 8 registers of 16 lanes.
constexpr int64_t kMaxChunks = 8;

__mmask16 lanes(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1); }

// R rows by NC registers of C; the last register's lanes `last`.
template <int R, int NC>
__attribute__((target("avx512f"))) void tile(int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                                             int64_t ldb, float* c, int64_t ldc, __mmask16 last, bool accumulate) {
  // Loops over R and NC fully unrolled (at any optimization level), so the accumulators live in
  // registers.
  __m512 acc[R][NC];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m512 bv[NC];
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) bv[j] = j == NC - 1 ? _mm512_maskz_loadu_ps(last, bp + 16 * j) : _mm512_loadu_ps(bp + 16 * j);
    const float* ap = a + p * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(ap[r * a_row]);
#pragma GCC unroll 8
      for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_fmadd_ps(ar, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      float* cp = c + r * ldc + 16 * j;
      const __mmask16 m = j == NC - 1 ? last : static_cast<__mmask16>(0xffffu);
      __m512 v = acc[r][j];
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cp), v);
      _mm512_mask_storeu_ps(cp, m, v);
    }
  }
}

// Every row of one column chunk of NC registers: tiles of R rows (24 accumulators at most), then
// one tile of the rows left.
template <int NC>
__attribute__((target("avx512f"))) void chunk_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row,
                                                   int64_t a_col, const float* b, int64_t ldb, float* c, int64_t ldc,
                                                   bool accumulate) {
  constexpr int R = NC <= 4 ? 6 : 3;
  const __mmask16 last = lanes(n - 16 * (NC - 1));
  int64_t r = 0;
  for (; r + R <= m; r += R) tile<R, NC>(k, a + r * a_row, a_row, a_col, b, ldb, c + r * ldc, ldc, last, accumulate);
  const float* ar = a + r * a_row;
  float* cr = c + r * ldc;
  const int64_t left = m - r;  // < R
  if constexpr (R > 5) {
    if (left == 5) return tile<5, NC>(k, ar, a_row, a_col, b, ldb, cr, ldc, last, accumulate);
  }
  if constexpr (R > 4) {
    if (left == 4) return tile<4, NC>(k, ar, a_row, a_col, b, ldb, cr, ldc, last, accumulate);
  }
  if constexpr (R > 3) {
    if (left == 3) return tile<3, NC>(k, ar, a_row, a_col, b, ldb, cr, ldc, last, accumulate);
  }
  if (left == 2) return tile<2, NC>(k, ar, a_row, a_col, b, ldb, cr, ldc, last, accumulate);
  if (left == 1) tile<1, NC>(k, ar, a_row, a_col, b, ldb, cr, ldc, last, accumulate);
}

using ChunkFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                         int64_t, bool);
constexpr ChunkFn kChunks[kMaxChunks + 1] = {nullptr,        chunk_rows<1>, chunk_rows<2>, chunk_rows<3>, chunk_rows<4>,
                                             chunk_rows<5>, chunk_rows<6>, chunk_rows<7>, chunk_rows<8>};

void check_supported(const char* what) {
  if (!small_gemm_supported()) throw Error(std::string(what) + ": this CPU has no AVX-512F");
}

}  // namespace

bool small_gemm_supported() {
  static const bool avx512 = CpuFeatures::of_this_cpu().avx512;
  return avx512;
}

void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  check_supported("small_gemm");
  if (m <= 0 || n <= 0) return;
  for (int64_t j0 = 0; j0 < n; j0 += 16 * kMaxChunks) {
    const int64_t width = std::min<int64_t>(n - j0, 16 * kMaxChunks);
    kChunks[(width + 15) / 16](m, width, k, a, a_row, a_col, b + j0, ldb, c + j0, ldc, accumulate);
  }
}

__attribute__((target("avx512f"))) void transpose_block(int64_t rows, int64_t cols, const float* x, int64_t ld_x,
                                                        float* out, int64_t ld_out) {
  check_supported("transpose_block");
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const int64_t h = std::min<int64_t>(rows - i0, 16);
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const int64_t w = std::min<int64_t>(cols - j0, 16);
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i)
        r[i] = i < h ? _mm512_maskz_loadu_ps(lanes(w), x + (i0 + i) * ld_x + j0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < w; ++j) _mm512_mask_storeu_ps(out + (j0 + j) * ld_out + i0, lanes(h), r[j]);
    }
  }
}

}  // namespace tessel::ops::detail
