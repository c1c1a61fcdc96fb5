// Internal: the optimizers' element loops for f32 state, in f64 exactly as the generic loops in
// optimizer.cpp (same operations, same order, so the same bits), built so the compiler vectorizes
// them for the CPU it runs on. Without them Adam's f64 divide and square root ran one element at a
// time, and SGD's f64 arithmetic at the baseline's SSE2 width: 2x as long on 65536 elements in
// cache, 1.16x on 4M from memory. Adam runs in one pass reading each element's parameter,
// gradient and moments once and writing the three results: three passes (moments, then the
// parameter) read and wrote 10 arrays instead of 7 and took 1.3x as long (the LM's 11 parameters,
// 3.3M elements).
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

// One SGD step for f32 parameters: out = f32(x - rate * g), with rate = lr * clip.
void sgd_f32(double rate, const float* x, const float* g, float* out, int64_t n);

// One SGD step with momentum for f32 state:
//   mu_out = f32(clip * g + momentum * mu)
//   out    = f32(x - lr * mu_out)
void sgd_momentum_f32(double clip, double momentum, double lr, const float* x, const float* g, const float* mu,
                      float* out, float* mu_out, int64_t n);

}  // namespace tessel::nn::detail
