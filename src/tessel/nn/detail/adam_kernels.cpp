#include "tessel/nn/detail/adam_kernels.h"

#include <cmath>

#include "tessel/detail/vector_clones.h"

// Compiled with -O3 -fno-math-errno -ffp-contract=off (src/CMakeLists.txt): sqrt stays one
// correctly rounded instruction and no multiply-add is fused, so every clone gives the bits of
// the baseline build.

namespace tessel::nn::detail {

TESSEL_VECTOR_CLONES void adam_mu_f32(double b1, double k, const float* mu, const float* g, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(b1 * mu[i] + k * g[i]);
}

TESSEL_VECTOR_CLONES void adam_nu_f32(double b2, double k, double clip, const float* nu, const float* g, float* out,
                                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double gc = clip * g[i];
    out[i] = static_cast<float>(b2 * nu[i] + k * gc * gc);
  }
}

TESSEL_VECTOR_CLONES void adam_param_f32(double lr, double bc1, double bc2, double eps, double weight_decay,
                                         const float* x, const float* mu, const float* nu, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double update = (mu[i] / bc1) / (std::sqrt(nu[i] / bc2) + eps) + weight_decay * x[i];
    out[i] = static_cast<float>(x[i] - lr * update);
  }
}

}  // namespace tessel::nn::detail
