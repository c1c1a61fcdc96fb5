// Internal: f32 element loops the compiler vectorizes (AVX-512, AVX2 or baseline, picked at
// run time). exp is Cephes' polynomial (about 2 ulp), and tanh inside gelu is built on it: the
// activations need absolute, not relative, accuracy near zero. f64 ops keep std:: functions.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

void exp_f32(const float* x, float* out, int64_t n);
void gelu_f32(const float* x, float* out, int64_t n);
void silu_f32(const float* x, float* out, int64_t n);
// out[i] = e^(x[i] - m), and the sum of out in rows.h's lanes (reduce_lanes' order): the bits of
// a pass subtracting m, exp_f32, and reduce_lanes over its result, in one pass (softmax's rows).
float exp_shifted_sum_f32(const float* x, float m, float* out, int64_t n);
// out = g * f'(x)
void gelu_grad_f32(const float* x, const float* g, float* out, int64_t n);
void silu_grad_f32(const float* x, const float* g, float* out, int64_t n);
// out[r] = sum of row r (rows of `cols` contiguous elements).
void row_sums_f32(const float* x, float* out, int64_t rows, int64_t cols);

// The sum of x[i]^2, accumulated in f64.
double sum_squares_f32(const float* x, int64_t n);

}  // namespace tessel::ops::detail
