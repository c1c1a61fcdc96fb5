// Internal: the rotation of rotary embeddings for the heads at one position, built so the compiler
// vectorizes it (the scalar loop, with its operands possibly aliased, took 2% of the LM's step).
// Compiled without FMA contraction: every vector width gives the scalar formula's bits.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

// For each of `heads` heads of 2 * half elements (contiguous, one after another) and each pair k:
//   y_i = x_i * cos[k] - x_j * sin[k],   y_j = x_j * cos[k] + x_i * sin[k]
// where (i, j) = (k, k + half), or (2k, 2k + 1) when interleaved. x and y do not overlap. With a
// `scale` other than 1, y is multiplied by it after the rotation, or with `scale_input` x before
// it: each the bits of a separate pass multiplying by scale (a scaled rope's forward, its gradient).
void rope_heads(const float* x, float* y, const float* cos, const float* sin, int64_t heads, int64_t half,
                bool interleaved, float scale, bool scale_input);
void rope_heads(const double* x, double* y, const double* cos, const double* sin, int64_t heads, int64_t half,
                bool interleaved, double scale, bool scale_input);

// The same for one head (halves paired) at positions 0 to rows - 1: row p of x (x_row elements
// apart) into row p of y (y_row apart), turned by row p of cos and sin (half elements apart).
// The bits of rope_heads row by row.
void rope_rows(const float* x, int64_t x_row, float* y, int64_t y_row, const float* cos, const float* sin, int64_t rows,
               int64_t half, float scale, bool scale_input);
void rope_rows(const double* x, int64_t x_row, double* y, int64_t y_row, const double* cos, const double* sin,
               int64_t rows, int64_t half, double scale, bool scale_input);

}  // namespace tessel::ops::detail
