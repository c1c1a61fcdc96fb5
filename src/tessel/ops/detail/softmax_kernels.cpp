#include "tessel/ops/detail/softmax_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tessel/detail/vector_clones.h"
#include "tessel/ops/detail/rows.h"
#include "tessel/ops/detail/vmath.h"

namespace tessel::ops::detail {
namespace {

// Inlined into each clone below, so that each is vectorized for its own instruction set.
// y = softmax(x) for each of `rows` rows of n (x == y allowed).
template <class T>
[[gnu::always_inline]] inline void softmax(const T* x, T* y, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * n;
    T* out = y + r * n;
    const T m = reduce_lanes(n, -std::numeric_limits<T>::infinity(), [in](int64_t i) { return in[i]; },
                             [](T a, T b) { return std::max(a, b); });
    T z;
    if constexpr (std::is_same_v<T, float>) {
      z = exp_shifted_sum_f32(in, m, out, n);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[i] - m);
      z = reduce_lanes(n, T(0), [out](int64_t i) { return out[i]; }, kPlus);
    }
    const T inv = T(1) / z;
    for (int64_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

// dx = y * (g - sum(g * y)) per row (dx == g allowed).
template <class T>
[[gnu::always_inline]] inline void softmax_grad(const T* y, const T* g, T* dx, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *yr = y + r * n, *gr = g + r * n;
    const T dot = reduce_lanes(n, T(0), [yr, gr](int64_t i) { return yr[i] * gr[i]; }, kPlus);
    for (int64_t i = 0; i < n; ++i) dx[r * n + i] = yr[i] * (gr[i] - dot);
  }
}

}  // namespace

TESSEL_VECTOR_CLONES void softmax_rows(const float* x, float* y, int64_t rows, int64_t n) { softmax(x, y, rows, n); }
TESSEL_VECTOR_CLONES void softmax_rows(const double* x, double* y, int64_t rows, int64_t n) { softmax(x, y, rows, n); }

TESSEL_VECTOR_CLONES void softmax_grad_rows(const float* y, const float* g, float* dx, int64_t rows, int64_t n) {
  softmax_grad(y, g, dx, rows, n);
}
TESSEL_VECTOR_CLONES void softmax_grad_rows(const double* y, const double* g, double* dx, int64_t rows, int64_t n) {
  softmax_grad(y, g, dx, rows, n);
}

}  // namespace tessel::ops::detail
