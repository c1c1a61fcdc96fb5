#include "tessel/ops/detail/vmath.h"

#include <bit>
#include <cmath>

#include "tessel/detail/vector_clones.h"

namespace tessel::ops::detail {
namespace {

// e^x for x in [-87, 88]: 2^n * e^r with |r| <= ln2 / 2, Cephes' expf polynomial. Above, e^88;
// below, 0: e^-87 is near the smallest normal float, and what lies under it would be subnormal, which
// the products that use the result (softmax's probabilities, whose masked entries land here) pay
// for a hundredfold on CPUs that handle subnormal operands in microcode. XLA's CPU code flushes them
// to zero too.
inline float exp_core(float x) {
  const bool under = x < -87.0f;
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return under ? 0.0f : std::bit_cast<float>(std::bit_cast<int32_t>(y) + (static_cast<int32_t>(n) << 23));
}

// tanh(u) = 1 - 2 / (e^(2u) + 1): absolute error about 1e-7.
inline float tanh_core(float u) { return 1.0f - 2.0f / (exp_core(2.0f * u) + 1.0f); }

constexpr float kGeluC = 0.7978845608028654f, kGeluK = 0.044715f;

// exp_core of kBlock elements, one step of it for all of them before the next. Element by element,
// each exp is a chain of about 25 dependent operations, more than the core's scheduler holds for
// several elements at once (the loops below ran at 2 to 5 cycles per element on Zen 3); a step
// over a block is several independent vectors. The same operations on each element: the same bits.
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

}  // namespace

TESSEL_VECTOR_CLONES void exp_f32(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float e[kBlock];
    exp_block(x + i, e);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = e[k];
  }
  for (; i < n; ++i) out[i] = exp_core(x[i]);
}

TESSEL_VECTOR_CLONES void gelu_f32(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float u[kBlock], e[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) {
      const float v = x[i + k];
      u[k] = 2.0f * (kGeluC * (v + kGeluK * v * v * v));
    }
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) {
      const float v = x[i + k];
      out[i + k] = 0.5f * v * (1.0f + (1.0f - 2.0f / (e[k] + 1.0f)));
    }
  }
  for (; i < n; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanh_core(kGeluC * (v + kGeluK * v * v * v)));
  }
}

TESSEL_VECTOR_CLONES void silu_f32(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float u[kBlock], e[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) u[k] = -x[i + k];
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = x[i + k] / (1.0f + e[k]);
  }
  for (; i < n; ++i) out[i] = x[i] / (1.0f + exp_core(-x[i]));
}

TESSEL_VECTOR_CLONES void gelu_grad_f32(const float* x, const float* g, float* out, int64_t n) {
  auto grad = [](float v, float t, float gi) {
    return gi * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluK * v * v));
  };
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float u[kBlock], e[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) {
      const float v = x[i + k];
      u[k] = 2.0f * (kGeluC * (v + kGeluK * v * v * v));
    }
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = grad(x[i + k], 1.0f - 2.0f / (e[k] + 1.0f), g[i + k]);
  }
  for (; i < n; ++i) {
    const float v = x[i];
    out[i] = grad(v, tanh_core(kGeluC * (v + kGeluK * v * v * v)), g[i]);
  }
}

TESSEL_VECTOR_CLONES void silu_grad_f32(const float* x, const float* g, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float u[kBlock], e[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) u[k] = -x[i + k];
    exp_block(u, e);
    for (int64_t k = 0; k < kBlock; ++k) {
      const float s = 1.0f / (1.0f + e[k]);
      out[i + k] = g[i + k] * s * (1.0f + x[i + k] * (1.0f - s));
    }
  }
  for (; i < n; ++i) {
    const float s = 1.0f / (1.0f + exp_core(-x[i]));
    out[i] = g[i] * s * (1.0f + x[i] * (1.0f - s));
  }
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
  constexpr int kLanes = 32;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  double total = acc[0];
  for (; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

}  // namespace tessel::ops::detail
