// The fused causal attention (ops/attention.h) at the LM benchmark's shapes (batch 16, 128
// positions, 4 heads of 64), 1 device, forward and backward, against its share of the LM's GEMM
// bound (bench_train_rounds): the whole square's products (QK^T and PV, twice as much again
// backward: train_models.h's count) at the mean rate of the LM's four big product shapes. The op
// skips the masked quarter of a 128-long square, so 0.75 would be its products at that rate with
// nothing else. The backward is that of sum(o * w), whose own passes over o (about 2 MB) count
// too. Each round measures the rate, then the op; the ratio is taken within a round.
// Usage: bench_attention [ROUNDS [BATCH SEQ HEADS HEAD_DIM]]   (defaults 20, 16 128 4 64)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/attention.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"

namespace {

using namespace tessel;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 0 ? (v[n / 2 - 1] + v[n / 2]) / 2 : v[n / 2];
}

Tensor random_tensor(Runtime& rt, const Shape& shape, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(shape.num_elements()));
  uint32_t state = seed;
  for (float& e : x) {
    state = state * 1664525u + 1013904223u;
    e = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
  }
  return Tensor(device_put(rt, HostArray::from<float>(shape, std::span<const float>(x)), NamedSharding(Mesh::parse("x=1"), {})));
}

// The mean rate (FLOP/s) of the LM's four big product shapes (train_models.h), as
// bench_train_rounds's bound measures it.
double gemm_rate(const Runtime& rt) {
  struct Shape3 { int64_t m, n, k; bool ta, tb; };
  const std::vector<Shape3> shapes = {{2048, 1024, 256, false, false}, {2048, 256, 1024, false, true},
                                      {256, 1024, 2048, true, false}, {2048, 256, 256, false, false}};
  double sum = 0;
  ops::detail::run_spread(rt, [&] {
    for (const Shape3& g : shapes) {
      std::vector<float> a(static_cast<size_t>(g.m * g.k), 0.5f), b(static_cast<size_t>(g.k * g.n), 0.25f),
          c(static_cast<size_t>(g.m * g.n));
      std::vector<double> times;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = Clock::now();
        ops::detail::gemm(DType::kF32, g.ta, g.tb, g.m, g.n, g.k, reinterpret_cast<const std::byte*>(a.data()),
                          reinterpret_cast<const std::byte*>(b.data()), reinterpret_cast<std::byte*>(c.data()), false);
        times.push_back(seconds_since(t0));
      }
      sum += 2.0 * static_cast<double>(g.m * g.n * g.k) / median(times);
    }
  });
  return sum / static_cast<double>(shapes.size());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
    int64_t b = 16, s = 128, h = 4, d = 64;
    if (argc == 6) {
      b = std::atoll(argv[2]);
      s = std::atoll(argv[3]);
      h = std::atoll(argv[4]);
      d = std::atoll(argv[5]);
    } else if (argc != 1 && argc != 2) {
      throw ValueError("usage: bench_attention [ROUNDS [BATCH SEQ HEADS HEAD_DIM]]");
    }
    if (rounds < 1 || b < 1 || s < 1 || h < 1 || d < 1) throw ValueError("bench_attention: ROUNDS and the shape must be positive");
    Runtime rt = Runtime::host(1);
    const Shape shape{b, s, h, d};
    const Tensor q = ops::requires_grad(random_tensor(rt, shape, 1)), k = ops::requires_grad(random_tensor(rt, shape, 2)),
                 v = ops::requires_grad(random_tensor(rt, shape, 3)), w = random_tensor(rt, shape, 4);
    std::vector<double> forward, both, to_bound;
    // The bound's count: QK^T and PV over the whole square, forward, and twice that backward.
    const double bound_flops = 3.0 * 2 * 2 * static_cast<double>(b * h) * static_cast<double>(s * s) * static_cast<double>(d);
    for (int round = -1; round < rounds; ++round) {  // round -1 warms the caches and the allocator
      const double rate = gemm_rate(rt);
      auto t0 = Clock::now();
      const Tensor o = ops::causal_attention(q, k, v);
      const double f = seconds_since(t0);
      t0 = Clock::now();
      ops::grad(ops::sum(ops::mul(o, w)), {q, k, v});
      const double total = f + seconds_since(t0);
      if (round < 0) continue;
      forward.push_back(f);
      both.push_back(total);
      to_bound.push_back(total / (bound_flops / rate));
    }
    std::printf("{\"shape\": [%lld, %lld, %lld, %lld], \"rounds\": %d, \"forward_ms\": %.3f, \"forward_backward_ms\": %.3f, "
                "\"to_bound\": %.3f}\n",
                static_cast<long long>(b), static_cast<long long>(s), static_cast<long long>(h), static_cast<long long>(d),
                rounds, 1e3 * median(forward), 1e3 * median(both), median(to_bound));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 2;
  }
}
