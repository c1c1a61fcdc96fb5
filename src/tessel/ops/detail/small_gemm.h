// Internal: the small products of the fused causal attention (ops/attention.cpp): one head's
// blocks, a few dozen rows by up to a few hundred columns, thousands of calls per step. A library
// GEMM call costs about as much in its driver (dispatch, packing) as these products take; here
// A is read in place (either orientation) and B row by row, with no packing.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

// Whether this CPU runs small_gemm (AVX-512F).
bool small_gemm_supported();

// C [m, n] = A [m, k] B [k, n], or C + A B when `accumulate`. Element (r, p) of A is at
// a[r * a_row + p * a_col] (a_row = 1 reads A stored transposed); rows of B are ldb apart, of C
// ldc. Each C element is one fused multiply-add chain over p in order from zero, then stored or
// added to C: its bits depend on the values alone, never on m, n, the strides or which tile it
// fell in. Throws unless small_gemm_supported().
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate);

// out [cols, rows] (rows ld_out apart) = x [rows, cols] (rows ld_x apart) transposed.
// Throws unless small_gemm_supported().
void transpose_block(int64_t rows, int64_t cols, const float* x, int64_t ld_x, float* out, int64_t ld_out);

}  // namespace tessel::ops::detail
