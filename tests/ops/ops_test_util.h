// Test helpers for the ops: f64 host arrays, placing them on devices, reading tensors back.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/array.h"

namespace tessel::testing {

// A row-major f64 array on the host.
struct Host {
  std::vector<int64_t> shape;
  std::vector<double> v;
  int64_t size() const { return static_cast<int64_t>(v.size()); }
};

// n floats drawn from the standard normal distribution.
inline std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline Host random_host(std::mt19937& rng, std::vector<int64_t> shape) {
  Host h{shape, {}};
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::normal_distribution<double> dist;
  for (int64_t i = 0; i < n; ++i) h.v.push_back(dist(rng));
  return h;
}

inline Tensor put(const Runtime& rt, const Host& h, const NamedSharding& s) {
  return Tensor(device_put(rt, HostArray::from<double>(Shape(h.shape), std::span<const double>(h.v)), s));
}

inline Tensor put_ids(const Runtime& rt, const std::vector<int64_t>& shape, const std::vector<int32_t>& ids,
                      const NamedSharding& s) {
  return Tensor(device_put(rt, HostArray::from<int32_t>(Shape(shape), std::span<const int32_t>(ids)), s));
}

// The (reduced) value of t.
inline std::vector<double> values(const Tensor& t) {
  const HostArray h = to_host(ops::reduce(t).array());
  auto v = h.values<double>();
  return {v.begin(), v.end()};
}

inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-10) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks the gradient of sum(f(inputs) * r) (r fixed and random, so every output element
// matters) against central differences, for a sample of every input's elements.
inline void check_gradient(const Runtime& rt, std::mt19937& rng, const Mesh& mesh, const std::vector<Host>& inputs,
                    const Fn& f) {
  std::vector<NamedSharding> shardings;
  std::vector<Tensor> tensors;
  for (const Host& h : inputs) {
    shardings.emplace_back(mesh, random_spec(rng, mesh, h.shape.size()));
    tensors.push_back(ops::requires_grad(put(rt, h, shardings.back())));
  }
  const Tensor out = f(tensors);
  const Tensor weights = put(rt, random_host(rng, out.shape().dims()), NamedSharding(mesh, {}));
  auto loss_of = [&](const std::vector<Tensor>& xs) { return ops::sum(ops::mul(f(xs), weights)); };
  const std::vector<Tensor> g = ops::grad(loss_of(tensors), tensors);
  for (size_t which = 0; which < inputs.size(); ++which) {
    ASSERT_EQ(g[which].sharding(), shardings[which]);
    const std::vector<double> got = values(g[which]);
    const int64_t stride = std::max<int64_t>(1, inputs[which].size() / 12);
    for (int64_t i = 0; i < inputs[which].size(); i += stride) {
      auto at = [&](double delta) {
        std::vector<Tensor> xs;
        for (size_t k = 0; k < inputs.size(); ++k) {
          Host h = inputs[k];
          if (k == which) h.v[static_cast<size_t>(i)] += delta;
          xs.push_back(put(rt, h, shardings[k]));
        }
        return values(loss_of(xs))[0];
      };
      const double h = 1e-6, fd = (at(h) - at(-h)) / (2 * h);
      ASSERT_NEAR(got[static_cast<size_t>(i)], fd, 1e-5 * (1 + std::abs(fd))) << "input " << which << " element " << i;
    }
  }
}

}  // namespace tessel::testing
