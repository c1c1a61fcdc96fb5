// SPMD ops against host references on random meshes and shardings (f64), sharding propagation,
// gradients against finite differences, and the same SGD run on different meshes.
#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/ops_test_util.h"
#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

using testing::expect_near;
using testing::Host;
using testing::put;
using testing::random_host;
using testing::values;

// Host references.
std::vector<double> host_dot(const Host& a, const Host& b, bool trans_b) {
  const int64_t k = a.shape.back(), m = a.size() / std::max<int64_t>(k, 1);
  const int64_t n = trans_b ? b.shape[0] : b.shape[1];
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        out[i * n + j] += a.v[i * k + p] * (trans_b ? b.v[j * k + p] : b.v[p * n + j]);
  return out;
}

TEST(Ops, DotAndItsTransposesMatchTheHostOnRandomShardings) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(6);
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Mesh mesh = testing::random_mesh(rng);
    auto dim = [&] { return std::uniform_int_distribution<int64_t>(1, 9)(rng); };
    const int64_t b0 = dim(), b1 = dim(), k = dim(), n = dim();
    const bool lead3 = iter % 2 == 0;
    std::vector<int64_t> as = lead3 ? std::vector<int64_t>{b0, b1, k} : std::vector<int64_t>{b0, k};
    const Host a = random_host(rng, as), b = random_host(rng, {k, n}), bt = random_host(rng, {n, k});
    auto sh = [&](size_t rank) { return NamedSharding(mesh, testing::random_spec(rng, mesh, rank)); };
    const Tensor ta = put(rt, a, sh(as.size())), tb = put(rt, b, sh(2)), tbt = put(rt, bt, sh(2));
    expect_near(values(ops::dot(ta, tb)), host_dot(a, b, false));
    expect_near(values(ops::dot_nt(ta, tbt)), host_dot(a, bt, true));
    // dot_tn: a^T g over all leading dims.
    std::vector<int64_t> gs = as;
    gs.back() = n;
    const Host g = random_host(rng, gs);
    const int64_t rows = a.size() / k;
    std::vector<double> want(static_cast<size_t>(k * n), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < n; ++j) want[i * n + j] += a.v[r * k + i] * g.v[r * n + j];
    expect_near(values(ops::dot_tn(ta, put(rt, g, sh(gs.size())))), want);
  }
}

// An input read by three products (a transformer's queries, keys and values from one normalized
// input): its gradient's terms after the first are added by the products' GEMMs, starting from the
// sum so far, instead of by passes of their own. With k in one GEMM block, each element has the
// bits of the terms taken apart and added in the same order; on random meshes and shardings (where
// a term is a partial sum or split otherwise, the terms are added apart), in f32 and f64.
TEST(Ops, ProductsAddTheirInputsGradientTermsToTheBit) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(60);
  for (int iter = 0; iter < 16; ++iter) {
    const Mesh mesh = iter < 2 ? Mesh::parse("data=1") : testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    SCOPED_TRACE(mesh.to_string() + " " + std::string(name(dtype)));
    auto sh = [&](size_t rank) {
      return NamedSharding(mesh, iter < 2 ? PartitionSpec{} : testing::random_spec(rng, mesh, rank));
    };
    const Host x = random_host(rng, {4, 6, 24});
    const Tensor tx = ops::requires_grad(ops::cast(put(rt, x, sh(3)), dtype));
    std::vector<Tensor> w, g;
    for (int i = 0; i < 3; ++i) {
      w.push_back(ops::cast(put(rt, random_host(rng, {24, 16}), sh(2)), dtype));
      g.push_back(ops::cast(put(rt, random_host(rng, {4, 6, 16}), sh(3)), dtype));
    }
    auto term = [&](int i) { return ops::sum(ops::mul(ops::dot(tx, w[i]), g[i])); };
    const Tensor all = ops::grad(ops::add(ops::add(term(0), term(1)), term(2)), {tx})[0];
    std::vector<Tensor> apart;
    for (int i = 0; i < 3; ++i) apart.push_back(ops::grad(term(i), {tx})[0]);
    // grad() visits the last product first.
    const Tensor want = ops::add(ops::add(apart[2], apart[1]), apart[0]);
    EXPECT_EQ(values(ops::cast(all, DType::kF64)), values(ops::cast(want, DType::kF64)));
    EXPECT_EQ(all.sharding(), tx.sharding());
  }
}

// A weight gradient contracting a batch split over axes of size 1 (MaxText's batch over data and
// fsdp on a tensor-only mesh) is whole, not a partial sum: its replicated block is computed once and
// every device's replica shares it, as the same product on one device.
TEST(Ops, ContractingOverAxesOfSizeOneLeavesNoPartialSum) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(11);
  const Mesh mesh = Mesh::parse("data=1,fsdp=1,tensor=8");
  const NamedSharding batch(mesh, {{"data", "fsdp"}, {}});
  const Host x = random_host(rng, {12, 5}), g = random_host(rng, {12, 3});
  const Tensor dw = ops::dot_tn(put(rt, x, batch), put(rt, g, batch));
  EXPECT_FALSE(dw.is_partial());
  EXPECT_EQ(dw.sharding(), NamedSharding(mesh, {}));
  const Array& a = dw.shards();
  for (int64_t d = 1; d < 8; ++d) EXPECT_EQ(a.shard(d).buffer.data(), a.shard(0).buffer.data()) << "device " << d;
  const Tensor one = ops::dot_tn(put(rt, x, NamedSharding(Mesh::parse("data=1"), {})),
                                 put(rt, g, NamedSharding(Mesh::parse("data=1"), {})));
  EXPECT_EQ(values(dw), values(one));  // the same bits as one device's product
}

TEST(Ops, ElementwiseAndReductionsMatchTheHostWithBroadcasting) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(7);
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Mesh mesh = testing::random_mesh(rng);
    auto dim = [&] { return std::uniform_int_distribution<int64_t>(1, 7)(rng); };
    const int64_t r = dim(), c = dim();
    const Host x = random_host(rng, {r, c}), row = random_host(rng, {c}), col = random_host(rng, {r, 1});
    auto sh = [&](size_t rank) { return NamedSharding(mesh, testing::random_spec(rng, mesh, rank)); };
    const Tensor tx = put(rt, x, sh(2)), trow = put(rt, row, sh(1)), tcol = put(rt, col, sh(2));
    std::vector<double> add(x.v.size()), mul(x.v.size()), sub(x.v.size()), relu(x.v.size()), sq(x.v.size());
    std::vector<double> sum0(static_cast<size_t>(c), 0.0), sum1(static_cast<size_t>(r), 0.0);
    double total = 0;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const double v = x.v[i * c + j];
        add[i * c + j] = v + row.v[j];
        mul[i * c + j] = v * col.v[i];
        sub[i * c + j] = col.v[i] - v;
        relu[i * c + j] = v > 0 ? v : 0;
        sq[i * c + j] = v * v;
        sum0[j] += v;
        sum1[i] += v;
        total += v;
      }
    expect_near(values(ops::add(tx, trow)), add);
    expect_near(values(ops::mul(tx, tcol)), mul);
    expect_near(values(ops::sub(tcol, tx)), sub);
    expect_near(values(ops::relu(tx)), relu);
    expect_near(values(ops::square(tx)), sq);
    expect_near(values(ops::sum(tx, 0)), sum0);
    expect_near(values(ops::sum(tx, 1)), sum1);
    expect_near(values(ops::mean(tx)), {total / static_cast<double>(r * c)});
    // Partial sums stay partial through linear ops and are reduced exactly once.
    const Tensor p = ops::sum(tx, 0);
    std::vector<double> twice(sum0.size());
    for (size_t i = 0; i < sum0.size(); ++i) twice[i] = -3 * sum0[i] + sum0[i];
    expect_near(values(ops::add(ops::scale(p, -3), p)), twice);
  }
}

// Blocks large enough that a broadcasting op or a transpose splits its first dimension over the
// cores: every slice must start at its own rows of each operand, broadcast or not.
TEST(Ops, LargeBroadcastsAndTransposesMatchTheHost) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(11);
  for (int iter = 0; iter < 6; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Mesh mesh = testing::random_mesh(rng);
    const int64_t r = std::uniform_int_distribution<int64_t>(60, 130)(rng), m = 3;
    const int64_t c = std::uniform_int_distribution<int64_t>(300, 700)(rng);
    const Host x = random_host(rng, {r, m, c}), y = random_host(rng, {r, 1, c}), z = random_host(rng, {m, 1});
    auto sh = [&](size_t rank) {
      return iter % 2 == 0 ? NamedSharding(mesh, PartitionSpec(std::vector<DimSharding>(rank)))
                           : NamedSharding(mesh, testing::random_spec(rng, mesh, rank));
    };
    const Tensor tx = put(rt, x, sh(3)), ty = put(rt, y, sh(3)), tz = put(rt, z, sh(2));
    std::vector<double> sum_xy(x.v.size()), mul_xz(x.v.size()), sub_zy(x.v.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t k = 0; k < m; ++k)
        for (int64_t j = 0; j < c; ++j) {
          const size_t at = static_cast<size_t>((i * m + k) * c + j);
          sum_xy[at] = x.v[at] + y.v[static_cast<size_t>(i * c + j)];
          mul_xz[at] = x.v[at] * z.v[static_cast<size_t>(k)];
          sub_zy[at] = z.v[static_cast<size_t>(k)] - y.v[static_cast<size_t>(i * c + j)];
        }
    expect_near(values(ops::add(tx, ty)), sum_xy);
    expect_near(values(ops::mul(tx, tz)), mul_xz);
    expect_near(values(ops::sub(tz, ty)), sub_zy);
    // Transposes large enough to be split over the cores along their first output dimension.
    std::vector<double> t201(x.v.size()), t021(x.v.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t k = 0; k < m; ++k)
        for (int64_t j = 0; j < c; ++j) {
          const double v = x.v[static_cast<size_t>((i * m + k) * c + j)];
          t201[static_cast<size_t>((j * r + i) * m + k)] = v;
          t021[static_cast<size_t>((i * c + j) * m + k)] = v;
        }
    expect_near(values(ops::transpose(tx, {2, 0, 1})), t201);
    expect_near(values(ops::transpose(tx, {0, 2, 1})), t021);
  }
}

TEST(Ops, ShardingPropagationFollowsGspmd) {
  Runtime rt = Runtime::host(8);
  const Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2");
  std::mt19937 rng(8);
  const Tensor x = put(rt, random_host(rng, {8, 6}), NamedSharding(mesh, {{"data"}, {}}));
  // An MLP whose hidden layer is wider than its output, as in a transformer.
  const Tensor w1 = put(rt, random_host(rng, {6, 24}), NamedSharding(mesh, {{}, {"tensor"}}));
  const Tensor w2 = put(rt, random_host(rng, {24, 6}), NamedSharding(mesh, {{"tensor"}, {}}));
  // (data, None) @ (None, tensor) -> (data, tensor), nothing to reduce.
  const Tensor h = ops::dot(x, w1);
  EXPECT_EQ(h.sharding().spec(), PartitionSpec({{"data"}, {"tensor"}}));
  EXPECT_FALSE(h.is_partial());
  // Contracting over tensor: a partial sum over tensor (cheaper than gathering the hidden layer).
  const Tensor y = ops::dot(ops::relu(h), w2);
  EXPECT_EQ(y.sharding().spec(), PartitionSpec({{"data"}, {}}));
  EXPECT_EQ(y.partial(), std::vector<std::string>{"tensor"});
  EXPECT_THROW(y.array(), ValueError);
  // Reduced into a sharding that splits over the partial axis: a reduce-scatter.
  const Tensor z = ops::reshard(y, NamedSharding(mesh, {{"data"}, {"tensor"}}));
  EXPECT_FALSE(z.is_partial());
  expect_near(values(z), values(y));
  // Abstract tensors give the same shardings without any buffer.
  const Tensor ax = Tensor::abstract(x.shape(), x.dtype(), x.sharding());
  const Tensor aw1 = Tensor::abstract(w1.shape(), w1.dtype(), w1.sharding());
  const Tensor aw2 = Tensor::abstract(w2.shape(), w2.dtype(), w2.sharding());
  const Tensor ay = ops::dot(ops::relu(ops::dot(ax, aw1)), aw2);
  EXPECT_TRUE(ay.is_abstract());
  EXPECT_EQ(ay.sharding(), y.sharding());
  EXPECT_EQ(ay.partial(), y.partial());
}

TEST(Ops, ErrorsNameTheOperands) {
  Runtime rt = Runtime::host(2);
  const Mesh mesh = Mesh::parse("x=2");
  std::mt19937 rng(9);
  const Tensor a = put(rt, random_host(rng, {2, 3}), NamedSharding(mesh, {}));
  const Tensor b = put(rt, random_host(rng, {4, 2}), NamedSharding(mesh, {}));
  EXPECT_THROW(ops::dot(a, b), ValueError);
  EXPECT_THROW(ops::add(a, b), ValueError);
  EXPECT_THROW(ops::grad(a, {a}), ValueError);  // not a scalar
  // Mixed dtypes, integer tensors and different meshes are refused by name.
  const Tensor f = Tensor(device_put(rt, testing::iota({2, 3}, DType::kF32), NamedSharding(mesh, {})));
  EXPECT_THAT([&] { ops::add(a, f); }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("dtypes differ")));
  const Tensor i = Tensor(device_put(rt, testing::iota({2, 3}), NamedSharding(mesh, {})));
  EXPECT_THAT([&] { ops::relu(i); }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("f32 or f64")));
  const Tensor other = put(rt, random_host(rng, {2, 3}), NamedSharding(Mesh::parse("y=2"), {}));
  EXPECT_THROW(ops::add(a, other), ShardingError);
  // A partial sum over an axis its sharding uses is no partial sum.
  EXPECT_THROW(Tensor::partial_sum(put(rt, random_host(rng, {2, 3}), NamedSharding(mesh, {{"x"}})).array(), {"x"}),
               ValueError);
}

// The MLP loss of DotReluDot with a mean-squared error.
Tensor mlp_loss(const Tensor& x, const Tensor& w1, const Tensor& w2, const Tensor& y) {
  return ops::mean(ops::square(ops::sub(ops::dot(ops::relu(ops::dot(x, w1)), w2), y)));
}

TEST(Autodiff, GradientsMatchFiniteDifferencesOnShardedInputs) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(10);
  for (const char* m : {"x=1", "data=2,fsdp=2,tensor=2", "fsdp=8", "tensor=4,data=2"}) {
    SCOPED_TRACE(m);
    const Mesh mesh = Mesh::parse(m);
    auto has = [&](const char* a) { return mesh.has_axis(a) ? DimSharding{a} : DimSharding{}; };
    const NamedSharding xs(mesh, {has("data"), {}}), w1s(mesh, {has("fsdp"), has("tensor")}),
        w2s(mesh, {has("tensor"), has("fsdp")});
    const Host x = random_host(rng, {8, 6}), w1 = random_host(rng, {6, 4}), w2 = random_host(rng, {4, 6}),
               y = random_host(rng, {8, 6});
    const Tensor tx = ops::requires_grad(put(rt, x, xs));
    const Tensor t1 = ops::requires_grad(put(rt, w1, w1s)), t2 = ops::requires_grad(put(rt, w2, w2s));
    const Tensor ty = put(rt, y, xs);
    const std::vector<Tensor> g = ops::grad(mlp_loss(tx, t1, t2, ty), {tx, t1, t2});
    EXPECT_EQ(g[0].sharding(), xs);
    EXPECT_EQ(g[1].sharding(), w1s);
    EXPECT_EQ(g[2].sharding(), w2s);
    const std::vector<const Host*> inputs{&x, &w1, &w2};
    for (size_t which = 0; which < 3; ++which) {
      const std::vector<double> got = values(g[which]);
      for (int64_t i = 0; i < inputs[which]->size(); i += 5) {
        auto loss_at = [&](double delta) {
          Host in[3] = {x, w1, w2};
          in[which].v[i] += delta;
          return values(mlp_loss(put(rt, in[0], xs), put(rt, in[1], w1s), put(rt, in[2], w2s), ty))[0];
        };
        const double h = 1e-6, fd = (loss_at(h) - loss_at(-h)) / (2 * h);
        EXPECT_NEAR(got[static_cast<size_t>(i)], fd, 1e-6 * (1 + std::abs(fd))) << "input " << which << " element " << i;
      }
    }
  }
}

// SGD on DotReluDot, f32: the same losses on one device and on every parallelism.
std::vector<double> sgd_run(const Runtime& rt, const Mesh& mesh, int steps) {
  std::mt19937 rng(11);
  auto has = [&](const char* a) { return mesh.has_axis(a) ? DimSharding{a} : DimSharding{}; };
  DimSharding batch;
  for (const char* a : {"data", "fsdp"}) if (mesh.has_axis(a)) batch.push_back(a);
  const NamedSharding xs(mesh, {batch, {}}), w1s(mesh, {has("fsdp"), has("tensor")}), w2s(mesh, {has("tensor"), has("fsdp")});
  auto f32 = [&](const Host& h, const NamedSharding& s) {
    std::vector<float> v(h.v.begin(), h.v.end());
    return Tensor(device_put(rt, HostArray::from<float>(Shape(h.shape), std::span<const float>(v)), s));
  };
  const Host x = random_host(rng, {32, 16}), y = random_host(rng, {32, 16});
  Host h1 = random_host(rng, {16, 64}), h2 = random_host(rng, {64, 16});
  for (auto& v : h1.v) v *= 0.25;
  for (auto& v : h2.v) v *= 0.125;
  Tensor w1 = f32(h1, w1s), w2 = f32(h2, w2s);
  const Tensor tx = f32(x, xs), ty = f32(y, xs);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const Tensor p1 = ops::requires_grad(w1), p2 = ops::requires_grad(w2);
    const Tensor loss = mlp_loss(tx, p1, p2, ty);
    const HostArray value = to_host(ops::reduce(loss).array());
    losses.push_back(value.values<float>()[0]);
    const auto g = ops::grad(loss, {p1, p2});
    EXPECT_EQ(g[0].sharding(), w1s);
    w1 = ops::sub(w1, ops::scale(g[0], 0.1));
    w2 = ops::sub(w2, ops::scale(g[1], 0.1));
    EXPECT_EQ(w1.sharding(), w1s);
  }
  return losses;
}

TEST(Training, DotReluDotLossesAgreeAcrossMeshes) {
  Runtime rt = Runtime::host(8);
  const std::vector<double> one = sgd_run(rt, Mesh::parse("x=1"), 10);
  EXPECT_LT(one.back(), one.front());  // it learns
  for (const char* m : {"data=8", "fsdp=8", "tensor=8", "data=2,fsdp=2,tensor=2"}) {
    SCOPED_TRACE(m);
    const std::vector<double> other = sgd_run(rt, Mesh::parse(m), 10);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(other[i], one[i], 1e-4 * std::abs(one[i])) << "step " << i;
  }
}

}  // namespace
}  // namespace tessel
