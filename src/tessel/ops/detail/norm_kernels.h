// Internal: RMSNorm's row kernels, built for AVX-512 and AVX2 as well as the baseline (the row
// sums' double lanes and the scaling at baseline SSE width took RMSNorm's backward to about twice
// its memory time). Compiled without FMA contraction and with the row sums in rows.h's fixed lanes:
// every vector width gives the same bits.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

// For each of `rows` rows of n: inv = 1 / sqrt(mean(x^2) + eps) (the sum of squares in double),
// y = x * inv * scale.
void rms_rows(const float* x, const float* scale, float* y, float* inv, int64_t rows, int64_t n, double eps);
void rms_rows(const double* x, const double* scale, double* y, double* inv, int64_t rows, int64_t n, double eps);

// dx = inv * (g * scale - x * inv^2 * mean(g * scale * x)) per row (the mean's sum in double),
// with `plus` (unless null) added to it: plus + dx, each rounded as its own add would round it.
void rms_grad_rows(const float* x, const float* scale, const float* inv, const float* g, const float* plus, float* dx,
                   int64_t rows, int64_t n);
void rms_grad_rows(const double* x, const double* scale, const double* inv, const double* g, const double* plus,
                   double* dx, int64_t rows, int64_t n);

// acc[c] += g[c] * (x[c] * inv) for c in [0, n): one row's terms of the scale's gradient.
void rms_scale_grad_row(const float* x, const float* g, float inv, float* acc, int64_t n);
void rms_scale_grad_row(const double* x, const double* g, double inv, double* acc, int64_t n);

}  // namespace tessel::ops::detail
