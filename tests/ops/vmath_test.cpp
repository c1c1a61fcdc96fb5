// The f32 element kernels (ops/detail/vmath.h): exp against std::exp over its whole range, and no
// subnormal results, which products pay for a hundredfold on some CPUs; the causal softmax's
// masked probabilities are exact zeros, as in JAX; whole arrays (computed a block of elements at a
// time) and single elements give the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/ops/detail/rows.h"
#include "tessel/ops/detail/vmath.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

TEST(Vmath, ExpIsAccurateAndNeverSubnormal) {
  std::vector<float> x;
  for (float v = -120.0f; v <= 88.0f; v += 0.01f) x.push_back(v);
  for (float v : {-87.0f, std::nextafter(-87.0f, -100.0f), -87.5f, -1e30f, -std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  std::vector<float> y(x.size());
  ops::detail::exp_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "x = " << x[i]);
    EXPECT_NE(std::fpclassify(y[i]), FP_SUBNORMAL);
    if (x[i] < -87.0f) {
      EXPECT_EQ(y[i], 0.0f);  // below the smallest normal result: flushed, as XLA's CPU code does
    } else {
      const double want = std::exp(static_cast<double>(x[i]));
      EXPECT_NEAR(y[i], want, 4e-7 * want);
    }
  }
}

// The kernels compute blocks of 32 elements, the last one padded: a value must not depend on where it
// falls in an array (in a whole block, at any lane, or in the padded one).
TEST(Vmath, WholeArraysAndSingleElementsGiveTheSameBits) {
  std::mt19937 rng(21);
  std::normal_distribution<float> wide(0.0f, 30.0f);  // reaches exp's clamps at -87 and 88
  std::vector<float> x(1003), g(x.size());
  for (float& v : x) v = wide(rng);
  for (float& v : g) v = wide(rng);
  x[5] = -1e30f;
  x[6] = 1e30f;
  x[7] = 0.0f;
  using Unary = void (*)(const float*, float*, int64_t);
  using Binary = void (*)(const float*, const float*, float*, int64_t);
  const std::pair<const char*, Unary> unary[] = {
      {"exp", ops::detail::exp_f32}, {"gelu", ops::detail::gelu_f32}, {"silu", ops::detail::silu_f32}};
  const std::pair<const char*, Binary> binary[] = {{"gelu_grad", ops::detail::gelu_grad_f32},
                                                   {"silu_grad", ops::detail::silu_grad_f32}};
  const auto n = static_cast<int64_t>(x.size());
  for (const auto& [name, f] : unary) {
    std::vector<float> whole(x.size()), single(x.size());
    f(x.data(), whole.data(), n);
    for (int64_t i = 0; i < n; ++i) f(&x[static_cast<size_t>(i)], &single[static_cast<size_t>(i)], 1);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&whole[static_cast<size_t>(i)], &single[static_cast<size_t>(i)], 4), 0)
          << name << " of " << x[static_cast<size_t>(i)] << ": " << whole[static_cast<size_t>(i)] << " against "
          << single[static_cast<size_t>(i)];
  }
  for (const auto& [name, f] : binary) {
    std::vector<float> whole(x.size()), single(x.size());
    f(x.data(), g.data(), whole.data(), n);
    for (int64_t i = 0; i < n; ++i) f(&x[static_cast<size_t>(i)], &g[static_cast<size_t>(i)], &single[static_cast<size_t>(i)], 1);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&whole[static_cast<size_t>(i)], &single[static_cast<size_t>(i)], 4), 0)
          << name << " of " << x[static_cast<size_t>(i)] << ": " << whole[static_cast<size_t>(i)] << " against "
          << single[static_cast<size_t>(i)];
  }
}

// exp_shifted_sum_f32 (softmax's rows) in one pass: the bits of subtracting m, exp_f32 and a sum in
// rows.h's lanes, for rows of every length across the 32-element blocks and the 16 lanes, in place
// or not.
TEST(Vmath, ShiftedExpAndItsSumHaveTheBitsOfThreePasses) {
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 8.0f);
  for (int64_t n = 0; n <= 130; ++n) {
    SCOPED_TRACE(testing::Message() << "n = " << n);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    const float m = n ? *std::max_element(x.begin(), x.end()) : 0.0f;
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] - m;
    ops::detail::exp_f32(want.data(), want.data(), n);
    const float want_sum = ops::detail::reduce_lanes(n, 0.0f, [&](int64_t i) { return want[i]; }, ops::detail::kPlus);
    std::vector<float> out(x.size());
    const float sum = ops::detail::exp_shifted_sum_f32(x.data(), m, out.data(), n);
    EXPECT_EQ(std::memcmp(&sum, &want_sum, sizeof(float)), 0) << sum << " against " << want_sum;
    EXPECT_TRUE(same_bits(out, want));
    std::vector<float> in_place = x;
    EXPECT_EQ(ops::detail::exp_shifted_sum_f32(in_place.data(), m, in_place.data(), n), want_sum);
    EXPECT_TRUE(same_bits(in_place, want));
  }
}

TEST(Vmath, CausalSoftmaxInF32HasExactZerosAndNoSubnormals) {
  Runtime rt = Runtime::host(1);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  const int64_t s = 64;
  std::vector<float> scores(static_cast<size_t>(s * s));
  for (float& v : scores) v = dist(rng);
  const Tensor t(device_put(rt, HostArray::from<float>(Shape({s, s}), std::span<const float>(scores)),
                            NamedSharding(Mesh::parse("x=1"), PartitionSpec{})));
  const HostArray probs = to_host(ops::softmax(ops::causal_mask(t), 1).array());
  const auto p = probs.values<float>();
  for (int64_t q = 0; q < s; ++q)
    for (int64_t k = 0; k < s; ++k) {
      const float v = p[static_cast<size_t>(q * s + k)];
      EXPECT_NE(std::fpclassify(v), FP_SUBNORMAL) << "query " << q << " key " << k;
      if (k > q) EXPECT_EQ(v, 0.0f) << "query " << q << " key " << k;
    }
}

}  // namespace
}  // namespace tessel
