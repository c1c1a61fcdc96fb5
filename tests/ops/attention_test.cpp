// The fused causal attention (ops/attention.h): values against a host reference (f64) on random
// meshes and shardings, grouped-query, sliding windows, sequences across the 64-query blocks and
// value widths other than the key width; gradients against finite differences; in f32 the same
// bits on every mesh.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/ops_test_util.h"
#include "tessel/core/error.h"
#include "tessel/nn/attention.h"
#include "tessel/ops/attention.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

using testing::check_gradient;
using testing::expect_near;
using testing::Host;
using testing::put;
using testing::random_host;
using testing::values;

// softmax(mask(q k^T)) v per head on the host: q [b, s, h, d], k [b, s, kv, d], v [b, s, kv, dv].
std::vector<double> reference(const Host& q, const Host& k, const Host& v, int64_t window) {
  const int64_t b = q.shape[0], s = q.shape[1], h = q.shape[2], d = q.shape[3], kv = k.shape[2], dv = v.shape[3];
  std::vector<double> out(static_cast<size_t>(b * s * h * dv));
  for (int64_t t = 0; t < b; ++t)
    for (int64_t i = 0; i < h; ++i) {
      const int64_t j = i / (h / kv);
      for (int64_t p = 0; p < s; ++p) {
        std::vector<double> w(static_cast<size_t>(s), 0.0);
        double m = -1e300, z = 0;
        for (int64_t x = 0; x <= p; ++x) {
          if (window > 0 && p - x >= window) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q.v[((t * s + p) * h + i) * d + c] * k.v[((t * s + x) * kv + j) * d + c];
          w[x] = dot;
          m = std::max(m, dot);
        }
        for (int64_t x = 0; x <= p; ++x) {
          if (window > 0 && p - x >= window) continue;
          w[x] = std::exp(w[x] - m);
          z += w[x];
        }
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (int64_t x = 0; x <= p; ++x) {
            if (window > 0 && p - x >= window) continue;
            acc += w[x] / z * v.v[((t * s + x) * kv + j) * dv + c];
          }
          out[((t * s + p) * h + i) * dv + c] = acc;
        }
      }
    }
  return out;
}

TEST(Attention, MatchesTheHostOnRandomMeshesWindowsAndGroups) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(41);
  const int64_t lengths[] = {1, 5, 64, 65, 130};
  for (int iter = 0; iter < 10; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const int64_t b = 2, s = lengths[iter % 5], h = 4, kv = (iter % 3 == 0) ? 4 : (iter % 3 == 1 ? 2 : 1);
    const int64_t d = 3, dv = iter % 2 == 0 ? 3 : 5, window = (iter / 2) % 3 == 0 ? 0 : 1 + iter * 7 % 40;
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " s " << s << " kv " << kv << " dv " << dv << " window "
                                    << window);
    const Host q = random_host(rng, {b, s, h, d}), k = random_host(rng, {b, s, kv, d}), v = random_host(rng, {b, s, kv, dv});
    auto place = [&](const Host& x) { return put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))); };
    const Tensor o = ops::causal_attention(place(q), place(k), place(v), window);
    EXPECT_EQ(o.shape(), Shape({b, s, h, dv}));
    expect_near(values(o), reference(q, k, v, window));
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(42);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const int64_t s = iter < 3 ? 6 : 67, kv = iter % 2 == 0 ? 2 : 1, window = iter % 3 == 2 ? 3 : 0;
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " s " << s << " kv " << kv << " window " << window);
    const Host q = random_host(rng, {2, s, 2, 3}), k = random_host(rng, {2, s, kv, 3}), v = random_host(rng, {2, s, kv, 2});
    check_gradient(rt, rng, mesh, {q, k, v}, [window](const std::vector<Tensor>& in) {
      return ops::causal_attention(in[0], in[1], in[2], window);
    });
  }
}

// f32 on 1 device and on meshes splitting the batch and the heads: the same bits, forward and
// backward (every device runs its (batch, head) blocks the same way).
TEST(Attention, F32HasTheSameBitsOnEveryMesh) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(43);
  const int64_t b = 4, s = 100, h = 8, kv = 4, d = 16;
  std::normal_distribution<float> dist;
  auto random = [&](std::vector<int64_t> shape) {
    std::vector<float> x(static_cast<size_t>(Shape(shape).num_elements()));
    for (float& e : x) e = dist(rng);
    return std::make_pair(Shape(shape), x);
  };
  const auto q = random({b, s, h, d}), k = random({b, s, kv, d}), v = random({b, s, kv, d}), w = random({b, s, h, d});
  auto run = [&](const char* mesh_text, const PartitionSpec& spec) {
    const Mesh mesh = Mesh::parse(mesh_text);
    auto place = [&](const std::pair<Shape, std::vector<float>>& x) {
      return Tensor(device_put(rt, HostArray::from<float>(x.first, std::span<const float>(x.second)), NamedSharding(mesh, spec)));
    };
    const Tensor tq = ops::requires_grad(place(q)), tk = ops::requires_grad(place(k)), tv = ops::requires_grad(place(v));
    const Tensor o = ops::causal_attention(tq, tk, tv, 30);
    const auto g = ops::grad(ops::sum(ops::mul(o, place(w))), {tq, tk, tv});
    std::vector<float> out;
    for (const Tensor& t : {o, g[0], g[1], g[2]}) {
      const HostArray host = to_host(ops::reduce(t).array());
      const auto x = host.values<float>();
      out.insert(out.end(), x.begin(), x.end());
    }
    return out;
  };
  const std::vector<float> one = run("x=1", PartitionSpec{});
  for (auto [mesh, spec] : {std::pair{"data=4,tensor=2", PartitionSpec{{"data"}, {}, {"tensor"}, {}}},
                            std::pair{"data=2,tensor=4", PartitionSpec{{"data"}, {}, {"tensor"}, {}}},
                            std::pair{"data=8", PartitionSpec{{}, {"data"}, {}, {}}}}) {
    const std::vector<float> other = run(mesh, spec);
    ASSERT_EQ(other.size(), one.size());
    EXPECT_EQ(std::memcmp(other.data(), one.data(), one.size() * sizeof(float)), 0) << mesh;
  }
}

// f32 (oneDNN's or OpenBLAS's per-head products, blocks of 64 queries) against f64, forward
// and backward, on random meshes: head widths of whole and partial registers, sequences across
// the query blocks, grouped-query and windows.
TEST(Attention, F32MatchesF64ForwardAndBackward) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(44);
  const int64_t lengths[] = {37, 64, 130, 200}, widths[] = {64, 16, 5, 33};
  for (int iter = 0; iter < 8; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const int64_t s = lengths[iter % 4], d = widths[iter % 4], dv = widths[(iter + 1) % 4], kv = iter % 2 ? 2 : 4;
    const int64_t window = iter % 3 == 2 ? 50 : 0;
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " s " << s << " d " << d << " dv " << dv << " kv " << kv
                                      << " window " << window);
    const Host q = random_host(rng, {2, s, 4, d}), k = random_host(rng, {2, s, kv, d}), v = random_host(rng, {2, s, kv, dv}),
               w = random_host(rng, {2, s, 4, dv});
    auto run = [&](DType dtype) {
      auto place = [&](const Host& x) { return ops::cast(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))), dtype); };
      const Tensor tq = ops::requires_grad(place(q)), tk = ops::requires_grad(place(k)), tv = ops::requires_grad(place(v));
      const Tensor o = ops::causal_attention(tq, tk, tv, window);
      const std::vector<Tensor> g = ops::grad(ops::sum(ops::mul(o, place(w))), {tq, tk, tv});
      std::vector<std::vector<double>> out{values(ops::cast(o, DType::kF64))};
      for (const Tensor& x : g) out.push_back(values(ops::cast(x, DType::kF64)));
      return out;
    };
    const auto f32 = run(DType::kF32), f64 = run(DType::kF64);
    for (size_t i = 0; i < f64.size(); ++i) {
      SCOPED_TRACE(i == 0 ? "output" : "gradient " + std::to_string(i - 1));
      expect_near(f32[i], f64[i], 2e-4);
    }
  }
}

// The backward computes only the gradients asked for (each pair's score gradients in scratch, for
// dq and dk): any subset of {q, k, v} has the bits of the same gradients asked for together, on
// meshes with replicas and split heads, grouped-query, across the 64-query blocks, in f32 and f64.
TEST(Attention, AnySubsetOfGradientsHasTheBitsOfAllThree) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(45);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    const int64_t s = iter < 3 ? 9 : 70, kv = iter % 3 == 0 ? 1 : 2, window = iter % 3 == 2 ? 5 : 0;
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " " << name(dtype) << " s " << s << " kv " << kv);
    const Host q = random_host(rng, {2, s, 4, 3}), k = random_host(rng, {2, s, kv, 3}), v = random_host(rng, {2, s, kv, 2}),
               w = random_host(rng, {2, s, 4, 2});
    auto place = [&](const Host& x) {
      return ops::cast(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))), dtype);
    };
    const Tensor tq = place(q), tk = place(k), tv = place(v), tw = place(w);
    auto bits = [](const Tensor& t) { return values(ops::cast(ops::reduce(t), DType::kF64)); };
    // grads[i] of the inputs flagged in `want` (q, k, v), the others held constant.
    auto grads = [&](std::array<bool, 3> want) {
      std::vector<Tensor> in{tq, tk, tv}, asked;
      for (size_t i = 0; i < 3; ++i) {
        if (want[i]) {
          in[i] = ops::requires_grad(in[i]);
          asked.push_back(in[i]);
        }
      }
      const std::vector<Tensor> g = ops::grad(ops::sum(ops::mul(ops::causal_attention(in[0], in[1], in[2], window), tw)), asked);
      std::vector<std::vector<double>> out;
      for (const Tensor& x : g) out.push_back(bits(x));
      return out;
    };
    const auto all = grads({true, true, true});
    for (std::array<bool, 3> want : {std::array{true, false, false}, std::array{false, true, false},
                                     std::array{false, false, true}, std::array{true, false, true},
                                     std::array{false, true, true}}) {
      const auto some = grads(want);
      size_t next = 0;
      for (size_t i = 0; i < 3; ++i) {
        if (want[i]) EXPECT_EQ(some[next++], all[i]) << "input " << i;
      }
    }
  }
}

// Heads of width 0 (q and k, or v): uniform weights over the visible keys, or an empty output;
// the gradients of sum(o): with d = 0, dv[x] = sum over the group's 2 heads and the queries p >= x
// of 1 / (p + 1); with dv = 0, dq and dk are zeros. On meshes with replicas.
TEST(Attention, HeadsOfWidthZero) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(46);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const int64_t d = iter % 2 ? 0 : 3, dv = iter % 2 ? 2 : 0, s = iter < 3 ? 5 : 70;
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " d " << d << " dv " << dv << " s " << s);
    const Host q = random_host(rng, {2, s, 4, d}), k = random_host(rng, {2, s, 2, d}), v = random_host(rng, {2, s, 2, dv});
    auto place = [&](const Host& x) {
      return ops::requires_grad(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))));
    };
    const Tensor tq = place(q), tk = place(k), tv = place(v);
    const Tensor o = ops::causal_attention(tq, tk, tv, 0);
    EXPECT_EQ(o.shape(), Shape({2, s, 4, dv}));
    expect_near(values(o), reference(q, k, v, 0));
    const auto g = ops::grad(ops::sum(o), {tq, tk, tv});
    EXPECT_EQ(g[0].shape(), tq.shape());
    EXPECT_EQ(g[1].shape(), tk.shape());
    EXPECT_EQ(g[2].shape(), tv.shape());
    if (dv == 0) {
      for (size_t i = 0; i < 2; ++i)
        for (double e : values(ops::reduce(g[i]))) EXPECT_EQ(e, 0.0) << "input " << i;
    } else {
      std::vector<double> want;
      for (int64_t t = 0; t < 2; ++t)
        for (int64_t x = 0; x < s; ++x) {
          double w = 0;
          for (int64_t p = x; p < s; ++p) w += 2.0 / static_cast<double>(p + 1);
          want.insert(want.end(), static_cast<size_t>(2 * dv), w);
        }
      expect_near(values(ops::reduce(g[2])), want);
    }
  }
}

// Rotary embeddings inside the op: the output and every gradient (all three asked together, or dq,
// dk or dv alone, whose paths rotate different operands) have the bits of the rope ops followed by
// the op, on random meshes, in f32 and f64, grouped-query, windows, sequences across the 64-query
// blocks, heads of width 0 to 64; an odd head_dim or a bad max_timescale is refused.
TEST(Attention, RopeInsideHasTheBitsOfTheRopeOps) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(47);
  const int64_t lengths[] = {9, 70, 130}, widths[] = {2, 16, 64, 0};
  for (int iter = 0; iter < 12; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    const int64_t s = lengths[iter % 3], d = widths[iter / 3], kv = iter % 3 == 1 ? 1 : 2;
    const int64_t window = iter % 4 == 3 ? 20 : 0;
    const ops::AttentionRope rope{.max_timescale = iter % 2 ? 500.0 : 10000.0,
                                  .query_scale = std::uniform_real_distribution<double>(0.1, 2.0)(rng)};
    SCOPED_TRACE(::testing::Message() << mesh.to_string() << " " << name(dtype) << " s " << s << " d " << d << " kv "
                                      << kv << " window " << window);
    const Host q = random_host(rng, {2, s, 4, d}), k = random_host(rng, {2, s, kv, d}), v = random_host(rng, {2, s, kv, 3}),
               w = random_host(rng, {2, s, 4, 3});
    auto place = [&](const Host& x) {
      return ops::cast(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))), dtype);
    };
    const Tensor tq = place(q), tk = place(k), tv = place(v), tw = place(w);
    auto bits = [](const Tensor& t) { return values(ops::cast(ops::reduce(t), DType::kF64)); };
    // The output and the gradients of the inputs flagged in `want` (q, k, v).
    auto run = [&](bool inside, std::array<bool, 3> want) {
      std::vector<Tensor> in{tq, tk, tv}, asked;
      for (size_t i = 0; i < 3; ++i) {
        if (want[i]) {
          in[i] = ops::requires_grad(in[i]);
          asked.push_back(in[i]);
        }
      }
      const Tensor o = inside ? ops::causal_attention(in[0], in[1], in[2], window, rope)
                              : ops::causal_attention(ops::rope(in[0], 1, rope.max_timescale, rope.query_scale),
                                                      ops::rope(in[1], 1, rope.max_timescale), in[2], window);
      std::vector<std::vector<double>> out{bits(o)};
      for (const Tensor& x : ops::grad(ops::sum(ops::mul(o, tw)), asked)) out.push_back(bits(x));
      return out;
    };
    for (std::array<bool, 3> want : {std::array{true, true, true}, std::array{true, false, false},
                                     std::array{false, true, false}, std::array{false, false, true}}) {
      const auto fused = run(true, want), composite = run(false, want);
      ASSERT_EQ(fused.size(), composite.size());
      for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], composite[i]) << (i == 0 ? "output" : "gradient");
    }
  }
  const Mesh mesh = Mesh::parse("x=1");
  const Tensor odd = put(rt, random_host(rng, {1, 4, 2, 3}), NamedSharding(mesh, {}));
  EXPECT_THAT([&] { ops::causal_attention(odd, odd, odd, 0, ops::AttentionRope{}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("head_dim, which must be even")));
  const Tensor even = put(rt, random_host(rng, {1, 4, 2, 4}), NamedSharding(mesh, {}));
  EXPECT_THAT([&] { ops::causal_attention(even, even, even, 0, ops::AttentionRope{.max_timescale = 0}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("max_timescale must be positive")));
  EXPECT_THAT([&] {
    ops::causal_attention(even, even, even, 0, ops::AttentionRope{.query_scale = std::numeric_limits<double>::infinity()});
  }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("query_scale must be finite")));
}

// nn::causal_attention with rope: the fused op's bits without sinks; with sinks, the composite over
// the rope ops' rotated q and k.
TEST(Attention, LayerRotatesWithOrWithoutSinks) {
  Runtime rt = Runtime::host(2);
  std::mt19937 rng(48);
  const Mesh mesh = Mesh::parse("x=2");
  const Host q = random_host(rng, {2, 7, 4, 4}), k = random_host(rng, {2, 7, 2, 4}), v = random_host(rng, {2, 7, 2, 3});
  auto place = [&](const Host& x) { return put(rt, x, NamedSharding(mesh, {{"x"}})); };
  const ops::AttentionRope rope{.max_timescale = 100, .query_scale = 0.5};
  const Tensor tq = place(q), tk = place(k), tv = place(v);
  const Tensor rq = ops::rope(tq, 1, 100, 0.5), rk = ops::rope(tk, 1, 100);
  EXPECT_EQ(values(nn::causal_attention(tq, tk, tv, {.window = 3, .rope = rope})),
            values(nn::causal_attention(rq, rk, tv, {.window = 3})));
  const Tensor sinks = put(rt, random_host(rng, {4}), NamedSharding(mesh, {}));
  EXPECT_EQ(values(nn::causal_attention(tq, tk, tv, {.sinks = sinks, .rope = rope})),
            values(nn::causal_attention(rq, rk, tv, {.sinks = sinks})));
}

// nn::causal_attention without sinks is the fused op: [b, s, h * dv], the same as the composite's
// math (checked against the host above); a bad window or shape is refused by name.
TEST(Attention, LayerUsesTheFusedOpAndRefusesBadInput) {
  Runtime rt = Runtime::host(2);
  std::mt19937 rng(44);
  const Mesh mesh = Mesh::parse("x=2");
  const Host q = random_host(rng, {2, 7, 4, 3}), k = random_host(rng, {2, 7, 2, 3}), v = random_host(rng, {2, 7, 2, 5});
  auto place = [&](const Host& x) { return put(rt, x, NamedSharding(mesh, {{"x"}})); };
  const Tensor merged = nn::causal_attention(place(q), place(k), place(v), {.window = 2});
  EXPECT_EQ(merged.shape(), Shape({2, 7, 20}));
  expect_near(values(merged), reference(q, k, v, 2));
  EXPECT_THAT([&] { ops::causal_attention(place(q), place(k), place(v), -1); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("window must not be negative")));
  EXPECT_THAT([&] { ops::causal_attention(place(q), place(q), place(v)); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("causal_attention: needs q [b, s, h, d]")));
}

}  // namespace
}  // namespace tessel
