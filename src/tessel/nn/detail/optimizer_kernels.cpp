#include "tessel/nn/detail/optimizer_kernels.h"

#include <cmath>

#include "tessel/detail/vector_clones.h"

// Compiled with -O3 -fno-math-errno -ffp-contract=off (src/CMakeLists.txt): sqrt stays one
// correctly rounded instruction and no multiply-add is fused, so every clone gives the bits of
// the baseline build.

namespace tessel::nn::detail {

TESSEL_VECTOR_CLONES void adam_f32(const AdamF32& c, const float* x, const float* g, const float* mu, const float* nu,
                                   float* __restrict out, float* __restrict mu_out, float* __restrict nu_out,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float m = static_cast<float>(c.b1 * mu[i] + c.k1 * g[i]);
    const double gc = c.clip * g[i];
    const float s = static_cast<float>(c.b2 * nu[i] + c.k2 * gc * gc);
    const double update = (m / c.bc1) / (std::sqrt(s / c.bc2) + c.eps) + c.weight_decay * x[i];
    out[i] = static_cast<float>(x[i] - c.lr * update);
    mu_out[i] = m;
    nu_out[i] = s;
  }
}

TESSEL_VECTOR_CLONES void sgd_f32(double rate, const float* x, const float* g, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - rate * g[i]);
}

TESSEL_VECTOR_CLONES void sgd_momentum_f32(double clip, double momentum, double lr, const float* x, const float* g,
                                           const float* mu, float* __restrict out, float* __restrict mu_out,
                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float m = static_cast<float>(clip * g[i] + momentum * mu[i]);
    out[i] = static_cast<float>(x[i] - lr * m);
    mu_out[i] = m;
  }
}

}  // namespace tessel::nn::detail
