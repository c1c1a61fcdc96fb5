#include "tessel/ops/detail/rope_kernels.h"

#include "tessel/detail/vector_clones.h"

namespace tessel::ops::detail {
namespace {

// Where a rotation's scale factor goes: nowhere (1), on its output, or on its input.
enum class Scaling { kNone, kAfter, kBefore };

// Both helpers are forced inline: target_clones compiles only the marked function for each ISA, so
// a helper left out of line ran the baseline's SSE code under every clone (rope 2.5x slower).
template <class T, Scaling kScaling>
[[gnu::always_inline]] inline void rotate(const T* __restrict x, T* __restrict y, const T* __restrict c, const T* __restrict s,
                   int64_t heads, int64_t half, bool interleaved, T f) {
  auto in = [f](T v) { return kScaling == Scaling::kBefore ? v * f : v; };
  auto out = [f](T v) { return kScaling == Scaling::kAfter ? v * f : v; };
  const int64_t d = 2 * half;
  for (int64_t h = 0; h < heads; ++h, x += d, y += d) {
    if (interleaved) {
      for (int64_t k = 0; k < half; ++k) {
        const T xi = in(x[2 * k]), xj = in(x[2 * k + 1]);
        y[2 * k] = out(xi * c[k] - xj * s[k]);
        y[2 * k + 1] = out(xj * c[k] + xi * s[k]);
      }
    } else {
      for (int64_t k = 0; k < half; ++k) y[k] = out(in(x[k]) * c[k] - in(x[k + half]) * s[k]);
      for (int64_t k = 0; k < half; ++k) y[k + half] = out(in(x[k + half]) * c[k] + in(x[k]) * s[k]);
    }
  }
}

template <class T>
[[gnu::always_inline]] inline void rotate_scaled(const T* x, T* y, const T* c, const T* s, int64_t heads, int64_t half, bool interleaved,
                          T scale, bool scale_input) {
  if (scale == T(1)) {
    rotate<T, Scaling::kNone>(x, y, c, s, heads, half, interleaved, scale);
  } else if (scale_input) {
    rotate<T, Scaling::kBefore>(x, y, c, s, heads, half, interleaved, scale);
  } else {
    rotate<T, Scaling::kAfter>(x, y, c, s, heads, half, interleaved, scale);
  }
}

template <class T>
[[gnu::always_inline]] inline void rotate_rows(const T* x, int64_t x_row, T* y, int64_t y_row, const T* c, const T* s,
                                               int64_t rows, int64_t half, T scale, bool scale_input) {
  for (int64_t p = 0; p < rows; ++p)
    rotate_scaled(x + p * x_row, y + p * y_row, c + p * half, s + p * half, 1, half, false, scale, scale_input);
}

}  // namespace

TESSEL_VECTOR_CLONES void rope_rows(const float* x, int64_t x_row, float* y, int64_t y_row, const float* cos,
                                    const float* sin, int64_t rows, int64_t half, float scale, bool scale_input) {
  rotate_rows(x, x_row, y, y_row, cos, sin, rows, half, scale, scale_input);
}

TESSEL_VECTOR_CLONES void rope_rows(const double* x, int64_t x_row, double* y, int64_t y_row, const double* cos,
                                    const double* sin, int64_t rows, int64_t half, double scale, bool scale_input) {
  rotate_rows(x, x_row, y, y_row, cos, sin, rows, half, scale, scale_input);
}

TESSEL_VECTOR_CLONES void rope_heads(const float* x, float* y, const float* cos, const float* sin, int64_t heads,
                                     int64_t half, bool interleaved, float scale, bool scale_input) {
  rotate_scaled(x, y, cos, sin, heads, half, interleaved, scale, scale_input);
}

TESSEL_VECTOR_CLONES void rope_heads(const double* x, double* y, const double* cos, const double* sin, int64_t heads,
                                     int64_t half, bool interleaved, double scale, bool scale_input) {
  rotate_scaled(x, y, cos, sin, heads, half, interleaved, scale, scale_input);
}

}  // namespace tessel::ops::detail
