#include "tessel/ops/detail/norm_kernels.h"

#include <cmath>

#include "tessel/detail/vector_clones.h"
#include "tessel/ops/detail/rows.h"

namespace tessel::ops::detail {
namespace {

// Inlined into each clone below, so that each is vectorized for its own instruction set.
template <class T>
[[gnu::always_inline]] inline void rms(const T* x, const T* scale, T* y, T* inv, int64_t rows, int64_t n, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * n;
    const double ss = reduce_lanes(n, 0.0, [in](int64_t i) { return static_cast<double>(in[i]) * in[i]; }, kPlus);
    const T v = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    inv[r] = v;
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = in[i] * v * scale[i];
  }
}

template <class T>
[[gnu::always_inline]] inline void rms_grad(const T* x, const T* scale, const T* inv, const T* g, const T* plus, T* dx,
                                            int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * n, *gr = g + r * n;
    const double dot =
        reduce_lanes(n, 0.0, [gr, scale, xr](int64_t i) { return static_cast<double>(gr[i]) * scale[i] * xr[i]; }, kPlus);
    const T v = inv[r];
    const T c = static_cast<T>(dot / static_cast<double>(n)) * v * v;
    if (plus) {
      const T* pr = plus + r * n;
      for (int64_t i = 0; i < n; ++i) dx[r * n + i] = pr[i] + v * (gr[i] * scale[i] - xr[i] * c);
    } else {
      for (int64_t i = 0; i < n; ++i) dx[r * n + i] = v * (gr[i] * scale[i] - xr[i] * c);
    }
  }
}

}  // namespace

TESSEL_VECTOR_CLONES void rms_rows(const float* x, const float* scale, float* y, float* inv, int64_t rows, int64_t n,
                                   double eps) {
  rms(x, scale, y, inv, rows, n, eps);
}
TESSEL_VECTOR_CLONES void rms_rows(const double* x, const double* scale, double* y, double* inv, int64_t rows,
                                   int64_t n, double eps) {
  rms(x, scale, y, inv, rows, n, eps);
}

TESSEL_VECTOR_CLONES void rms_grad_rows(const float* x, const float* scale, const float* inv, const float* g,
                                        const float* plus, float* dx, int64_t rows, int64_t n) {
  rms_grad(x, scale, inv, g, plus, dx, rows, n);
}
TESSEL_VECTOR_CLONES void rms_grad_rows(const double* x, const double* scale, const double* inv, const double* g,
                                        const double* plus, double* dx, int64_t rows, int64_t n) {
  rms_grad(x, scale, inv, g, plus, dx, rows, n);
}

TESSEL_VECTOR_CLONES void rms_scale_grad_row(const float* x, const float* g, float inv, float* acc, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += g[c] * (x[c] * inv);
}
TESSEL_VECTOR_CLONES void rms_scale_grad_row(const double* x, const double* g, double inv, double* acc, int64_t n) {
  for (int64_t c = 0; c < n; ++c) acc[c] += g[c] * (x[c] * inv);
}

}  // namespace tessel::ops::detail
