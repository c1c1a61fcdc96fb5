// Internal: the Adam(W) element loop for f32 state, in f64 exactly as the generic loop in
// optimizer.cpp (same operations, same order, so the same bits), built so the compiler
// vectorizes it: without it the f64 divide and square root ran one element at a time. One pass
// reads each element's parameter, gradient and moments once and writes the three results: three
// passes (moments, then the parameter) read and wrote 10 arrays instead of 7 and took 1.3x as long
// (the LM's 11 parameters, 3.3M elements).
#pragma once

#include <cstdint>

namespace tessel::nn::detail {

// One AdamW step for f32 state, element by element in one pass over the four inputs:
//   mu_out = f32(b1 * mu + k1 * g)
//   nu_out = f32(b2 * nu + (k2 * (clip * g)) * (clip * g))
//   out    = f32(x - lr * ((mu_out / bc1) / (sqrt(nu_out / bc2) + eps) + weight_decay * x))
// with k1 = (1 - b1) * clip and k2 = 1 - b2 (the parameter from the rounded moments).
struct AdamF32 {
  double b1, k1, b2, k2, clip, lr, bc1, bc2, eps, weight_decay;
};
void adam_f32(const AdamF32& c, const float* x, const float* g, const float* mu, const float* nu, float* out,
              float* mu_out, float* nu_out, int64_t n);

}  // namespace tessel::nn::detail
