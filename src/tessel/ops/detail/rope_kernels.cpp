#include "tessel/ops/detail/rope_kernels.h"

#include "tessel/detail/vector_clones.h"

namespace tessel::ops::detail {
namespace {

template <class T>
inline void rotate(const T* __restrict x, T* __restrict y, const T* __restrict c, const T* __restrict s,
                   int64_t heads, int64_t half, bool interleaved) {
  const int64_t d = 2 * half;
  for (int64_t h = 0; h < heads; ++h, x += d, y += d) {
    if (interleaved) {
      for (int64_t k = 0; k < half; ++k) {
        const T xi = x[2 * k], xj = x[2 * k + 1];
        y[2 * k] = xi * c[k] - xj * s[k];
        y[2 * k + 1] = xj * c[k] + xi * s[k];
      }
    } else {
      for (int64_t k = 0; k < half; ++k) y[k] = x[k] * c[k] - x[k + half] * s[k];
      for (int64_t k = 0; k < half; ++k) y[k + half] = x[k + half] * c[k] + x[k] * s[k];
    }
  }
}

}  // namespace

TESSEL_VECTOR_CLONES void rope_heads(const float* x, float* y, const float* cos, const float* sin, int64_t heads,
                                     int64_t half, bool interleaved) {
  rotate(x, y, cos, sin, heads, half, interleaved);
}

TESSEL_VECTOR_CLONES void rope_heads(const double* x, double* y, const double* cos, const double* sin, int64_t heads,
                                     int64_t half, bool interleaved) {
  rotate(x, y, cos, sin, heads, half, interleaved);
}

}  // namespace tessel::ops::detail
