// Internal: the Adam(W) element loops for f32 state, in f64 exactly as the generic loops in
// optimizer.cpp (same operations, same order, so the same bits), built so the compiler
// vectorizes them: without it the f64 divide and square root ran one element at a time.
#pragma once

#include <cstdint>

namespace tessel::nn::detail {

// out = f32(b1 * mu + k * g), with k = (1 - b1) * clip.
void adam_mu_f32(double b1, double k, const float* mu, const float* g, float* out, int64_t n);
// out = f32(b2 * nu + (k * (clip * g)) * (clip * g)), with k = 1 - b2.
void adam_nu_f32(double b2, double k, double clip, const float* nu, const float* g, float* out, int64_t n);
// out = f32(x - lr * ((mu / bc1) / (sqrt(nu / bc2) + eps) + weight_decay * x)).
void adam_param_f32(double lr, double bc1, double bc2, double eps, double weight_decay, const float* x,
                    const float* mu, const float* nu, float* out, int64_t n);

}  // namespace tessel::nn::detail
