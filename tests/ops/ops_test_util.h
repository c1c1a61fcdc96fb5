// Test helpers for the ops: f64 host arrays, placing them on devices, reading tensors back.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/ops/ops.h"
#include "tessel/runtime/array.h"

namespace tessel::testing {

// A row-major f64 array on the host.
struct Host {
  std::vector<int64_t> shape;
  std::vector<double> v;
  int64_t size() const { return static_cast<int64_t>(v.size()); }
};

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

}  // namespace tessel::testing
