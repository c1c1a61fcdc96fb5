// Internal: row kernels of the fused normalizations (softmax, RMSNorm, attention). Row
// reductions run in interleaved lanes joined in a fixed order: they vectorize, and give the same
// bits on every machine and mesh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tessel/ops/detail/vmath.h"

namespace tessel::ops::detail {

// A row's reduction in kLanes interleaved partial results (element i goes to lane i % kLanes),
// joined pairwise in a fixed order at the end: one dependency chain per lane instead of one for the
// row, so the loop vectorizes (a left-to-right sum of a 128-element row waited on every add), and
// the result is the same on every machine and mesh.
constexpr int kLanes = 16;

// Always inlined: a caller built for a wider instruction set (a vector clone) vectorizes it too.
template <class A, class Term, class Join>
[[gnu::always_inline]] inline A reduce_lanes(int64_t n, A init, Term&& term, Join&& join) {
  A acc[kLanes];
  for (A& a : acc) a = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = join(acc[j], term(i + j));
  for (int j = 0; i + j < n; ++j) acc[j] = join(acc[j], term(i + j));
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] = join(acc[j], acc[j + width]);
  return acc[0];
}

constexpr auto kPlus = [](auto a, auto b) { return a + b; };

// y = softmax(x) for each of `rows` rows of n (x == y allowed).
template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * n;
    T* out = y + r * n;
    const T m = reduce_lanes(n, -std::numeric_limits<T>::infinity(), [in](int64_t i) { return in[i]; },
                             [](T a, T b) { return std::max(a, b); });
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] - m;
    if constexpr (std::is_same_v<T, float>) {
      exp_f32(out, out, n);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = std::exp(out[i]);
    }
    const T z = reduce_lanes(n, T(0), [out](int64_t i) { return out[i]; }, kPlus);
    const T inv = T(1) / z;
    for (int64_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

// dx = y * (g - sum(g * y)) per row (dx == g allowed).
template <class T>
void softmax_grad_rows(const T* y, const T* g, T* dx, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *yr = y + r * n, *gr = g + r * n;
    const T dot = reduce_lanes(n, T(0), [yr, gr](int64_t i) { return yr[i] * gr[i]; }, kPlus);
    for (int64_t i = 0; i < n; ++i) dx[r * n + i] = yr[i] * (gr[i] - dot);
  }
}

}  // namespace tessel::ops::detail
