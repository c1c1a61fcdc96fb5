#include "tessel/ops/detail/vmath.h"

#include <bit>
#include <cmath>

#include "tessel/detail/vector_clones.h"
#include "tessel/ops/detail/rows.h"

namespace tessel::ops::detail {
namespace {

// e^x for x in [-87, 88]: 2^n * e^r with |r| <= ln2 / 2, Cephes' expf polynomial. Above, e^88;
// below, 0: e^-87 is near the smallest normal float, and what lies under it would be subnormal, which
// the products that use the result (softmax's probabilities, whose masked entries land here) pay
// for a hundredfold on CPUs that handle subnormal operands in microcode. XLA's CPU code flushes them
// to zero too.
//
// Computed for a block of 32 elements, one step for all of them before the next: element by element,
// each exp is a chain of about 25 dependent operations, more than the core's scheduler overlaps
// across elements (gelu ran at 3.7 cycles per element on Zen 3, 2.5 in blocks); a step over a
// block is several independent vectors. Every element goes through the same operations wherever it
// lies in the array, so the bits do not depend on the position.
constexpr int64_t kBlock = 32;

[[gnu::always_inline]] inline void exp_block(const float* in, float* out) {
  float x[kBlock], n[kBlock], r[kBlock], p[kBlock];
  for (int64_t k = 0; k < kBlock; ++k) x[k] = in[k] < -87.0f ? -87.0f : (in[k] > 88.0f ? 88.0f : in[k]);
  for (int64_t k = 0; k < kBlock; ++k) n[k] = __builtin_floorf(x[k] * 1.44269504088896341f + 0.5f);
  for (int64_t k = 0; k < kBlock; ++k) r[k] = x[k] - n[k] * 0.693359375f + n[k] * 2.12194440e-4f;
  for (int64_t k = 0; k < kBlock; ++k) p[k] = 1.9875691500e-4f * r[k] + 1.3981999507e-3f;
  for (int64_t k = 0; k < kBlock; ++k) p[k] = p[k] * r[k] + 8.3334519073e-3f;
  for (int64_t k = 0; k < kBlock; ++k) p[k] = p[k] * r[k] + 4.1665795894e-2f;
  for (int64_t k = 0; k < kBlock; ++k) p[k] = p[k] * r[k] + 1.6666665459e-1f;
  for (int64_t k = 0; k < kBlock; ++k) p[k] = p[k] * r[k] + 5.0000001201e-1f;
  for (int64_t k = 0; k < kBlock; ++k) {
    const float y = p[k] * r[k] * r[k] + r[k] + 1.0f;
    out[k] = in[k] < -87.0f ? 0.0f : std::bit_cast<float>(std::bit_cast<int32_t>(y) + (static_cast<int32_t>(n[k]) << 23));
  }
}

// For i in [0, n): e = exp(arg(i)), then put(i, e); the last block padded with zeros.
template <class Arg, class Put>
[[gnu::always_inline]] inline void with_exp(int64_t n, Arg arg, Put put) {
  float u[kBlock], e[kBlock];
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) u[k] = arg(i + k);
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) put(i + k, e[k]);
  }
  if (i == n) return;
  const int64_t m = n - i;
  for (int64_t k = 0; k < kBlock; ++k) u[k] = k < m ? arg(i + k) : 0.0f;
  exp_block(u, e);
  for (int64_t k = 0; k < m; ++k) put(i + k, e[k]);
}

// gelu's tanh form: tanh(a) = 1 - 2 / (e^(2a) + 1), absolute error about 1e-7; the argument of
// that exp, and tanh from it.
constexpr float kGeluC = 0.7978845608028654f, kGeluK = 0.044715f;
inline float gelu_exp_arg(float v) { return 2.0f * (kGeluC * (v + kGeluK * v * v * v)); }
inline float tanh_from_exp(float e) { return 1.0f - 2.0f / (e + 1.0f); }

}  // namespace

TESSEL_VECTOR_CLONES void exp_f32(const float* x, float* out, int64_t n) {
  // Whole blocks straight from x: through with_exp's copy of the arguments this loop ran at half
  // the speed (g++ 12, AVX2).
  const int64_t whole = n / kBlock * kBlock;
  for (int64_t i = 0; i < whole; i += kBlock) {
    float e[kBlock];
    exp_block(x + i, e);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = e[k];
  }
  with_exp(n - whole, [&](int64_t i) { return x[whole + i]; }, [&](int64_t i, float e) { out[whole + i] = e; });
}

TESSEL_VECTOR_CLONES float exp_shifted_sum_f32(const float* x, float m, float* out, int64_t n) {
  // Lane j sums elements j, j + kLanes, ... in order, as reduce_lanes does: a block of kBlock
  // elements starts at a multiple of kLanes.
  static_assert(kBlock % kLanes == 0);
  float acc[kLanes] = {};
  const int64_t whole = n / kBlock * kBlock;
  for (int64_t i = 0; i < whole; i += kBlock) {
    float u[kBlock], e[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) u[k] = x[i + k] - m;
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = e[k];
    for (int64_t h = 0; h < kBlock; h += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] += e[h + j];
  }
  with_exp(n - whole, [&](int64_t i) { return x[whole + i] - m; }, [&](int64_t i, float e) {
    out[whole + i] = e;
    acc[i % kLanes] += e;
  });
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

TESSEL_VECTOR_CLONES void gelu_f32(const float* x, float* out, int64_t n) {
  with_exp(n, [&](int64_t i) { return gelu_exp_arg(x[i]); },
           [&](int64_t i, float e) { out[i] = 0.5f * x[i] * (1.0f + tanh_from_exp(e)); });
}

TESSEL_VECTOR_CLONES void silu_f32(const float* x, float* out, int64_t n) {
  with_exp(n, [&](int64_t i) { return -x[i]; }, [&](int64_t i, float e) { out[i] = x[i] / (1.0f + e); });
}

TESSEL_VECTOR_CLONES void gelu_grad_f32(const float* x, const float* g, float* out, int64_t n) {
  with_exp(n, [&](int64_t i) { return gelu_exp_arg(x[i]); }, [&](int64_t i, float e) {
    const float v = x[i], t = tanh_from_exp(e);
    out[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluK * v * v));
  });
}

TESSEL_VECTOR_CLONES void silu_grad_f32(const float* x, const float* g, float* out, int64_t n) {
  with_exp(n, [&](int64_t i) { return -x[i]; }, [&](int64_t i, float e) {
    const float s = 1.0f / (1.0f + e);
    out[i] = g[i] * s * (1.0f + x[i] * (1.0f - s));
  });
}

TESSEL_VECTOR_CLONES void row_sums_f32(const float* x, float* out, int64_t rows, int64_t cols) {
  // Eight partial sums per row: a vector's worth of independent additions.
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      for (int k = 0; k < 8; ++k) acc[k] += row[c + k];
    }
    float total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; c < cols; ++c) total += row[c];
    out[r] = total;
  }
}

// 32 lanes (four AVX-512 accumulators): with one, each step waited for the last add (2 elements a
// cycle, the global norm 2% of DotReluDot's step). The lanes are added pairwise in a fixed order,
// whatever the vector width.
TESSEL_VECTOR_CLONES double sum_squares_f32(const float* x, int64_t n) {
  constexpr int kSquareLanes = 32;
  double acc[kSquareLanes] = {};
  int64_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes) {
    for (int k = 0; k < kSquareLanes; ++k) acc[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  }
  for (int width = kSquareLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  double total = acc[0];
  for (; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

}  // namespace tessel::ops::detail
