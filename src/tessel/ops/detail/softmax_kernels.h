// Internal: softmax's row kernels (the softmax op's and the fused attention's), built for AVX-512
// and AVX2 as well as the baseline. Compiled without FMA contraction, the row reductions in
// rows.h's fixed lanes and exp from vmath: every vector width gives the same bits.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

// y = softmax(x) for each of `rows` rows of n (x == y allowed).
void softmax_rows(const float* x, float* y, int64_t rows, int64_t n);
void softmax_rows(const double* x, double* y, int64_t rows, int64_t n);

// dx = y * (g - sum(g * y)) per row (dx == g allowed).
void softmax_grad_rows(const float* y, const float* g, float* dx, int64_t rows, int64_t n);
void softmax_grad_rows(const double* y, const double* g, double* dx, int64_t rows, int64_t n);

}  // namespace tessel::ops::detail
