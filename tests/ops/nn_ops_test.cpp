// The ops a transformer needs, on random meshes and shardings (f64): values against host
// references, and every op's gradient against central finite differences.
#include <cmath>
#include <cstring>
#include <functional>
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
using testing::put_ids;
using testing::random_host;
using testing::values;

using testing::check_gradient;

// Elementwise ops against std:: on the host, gradients against finite differences.
TEST(NnOps, UnaryAndDivisionMatchTheHostAndFiniteDifferences) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(21);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
  };
  const double c = std::sqrt(2.0 / M_PI);
  const std::vector<Case> cases{
      {"exp", [](const Tensor& x) { return ops::exp(x); }, [](double v) { return std::exp(v); }},
      {"log", [](const Tensor& x) { return ops::log(ops::add_scalar(ops::square(x), 0.5)); },
       [](double v) { return std::log(v * v + 0.5); }},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, [](double v) { return std::tanh(v); }},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); },
       [c](double v) { return 0.5 * v * (1 + std::tanh(c * (v + 0.044715 * v * v * v))); }},
      {"silu", [](const Tensor& x) { return ops::silu(x); }, [](double v) { return v / (1 + std::exp(-v)); }},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(ops::add_scalar(ops::square(x), 0.5)); },
       [](double v) { return 1 / std::sqrt(v * v + 0.5); }},
  };
  for (int iter = 0; iter < 4; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const Host x = random_host(rng, {5, 6});
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(k.name) + " on " + mesh.to_string());
      const Tensor t = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
      std::vector<double> want;
      for (double v : x.v) want.push_back(k.ref(v));
      expect_near(values(k.op(t)), want);
      check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) { return k.op(in[0]); });
    }
    SCOPED_TRACE("div on " + mesh.to_string());
    const Host y = random_host(rng, {6});
    const Tensor a = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
    Host ypos = y;
    for (auto& v : ypos.v) v = v * v + 0.5;
    const Tensor b = put(rt, ypos, NamedSharding(mesh, testing::random_spec(rng, mesh, 1)));
    std::vector<double> want;
    for (size_t i = 0; i < x.v.size(); ++i) want.push_back(x.v[i] / ypos.v[i % 6]);
    expect_near(values(ops::div(a, b)), want);
    check_gradient(rt, rng, mesh, {x, y}, [](const std::vector<Tensor>& in) {
      return ops::div(in[0], ops::add_scalar(ops::square(in[1]), 0.5));
    });
  }
}

TEST(NnOps, BroadcastingGradientsAndLogicalConstraints) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(28);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const Host x = random_host(rng, {3, 4, 5}), row = random_host(rng, {5}), col = random_host(rng, {3, 1, 1});
    check_gradient(rt, rng, mesh, {x, row, col}, [](const std::vector<Tensor>& in) {
      return ops::mul(ops::add(in[0], in[1]), ops::sub(in[2], ops::neg(in[1])));
    });
    check_gradient(rt, rng, mesh, {x}, [](const std::vector<Tensor>& in) {
      return ops::log_softmax(ops::scale(in[0], 0.5), 2);
    });
  }
  // A logical constraint resolves through the rules, like flax's nn.with_logical_constraint.
  const LogicalRules rules(std::vector<LogicalRule>{{"batch", {"data"}}, {"embed", {"fsdp"}}}, {"data", "fsdp"});
  const Mesh mesh = Mesh::parse("data=2,fsdp=4");
  const Tensor t = put(rt, random_host(rng, {4, 8}), NamedSharding(mesh, {}));
  const Tensor c = ops::with_sharding_constraint(t, {"batch", "embed"}, rules);
  EXPECT_EQ(c.sharding().spec(), PartitionSpec({{"data"}, {"fsdp"}}));
  expect_near(values(c), values(t));
  EXPECT_THROW(ops::with_sharding_constraint(t, {"batch"}, rules), ValueError);
}

TEST(NnOps, BatchedMatmulWithTransposesMatchesTheHost) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(22);
  for (int iter = 0; iter < 32; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Mesh mesh = testing::random_mesh(rng);
    auto dim = [&] { return std::uniform_int_distribution<int64_t>(1, 6)(rng); };
    const int64_t b0 = dim(), b1 = dim(), m = dim(), k = dim(), n = dim();
    const bool ta = iter % 2 == 1, tb = (iter / 2) % 2 == 1;
    const Host a = random_host(rng, ta ? std::vector<int64_t>{b0, b1, k, m} : std::vector<int64_t>{b0, b1, m, k});
    const Host b = random_host(rng, tb ? std::vector<int64_t>{b0, b1, n, k} : std::vector<int64_t>{b0, b1, k, n});
    std::vector<double> want(static_cast<size_t>(b0 * b1 * m * n), 0.0);
    for (int64_t t = 0; t < b0 * b1; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t p = 0; p < k; ++p) {
            const double av = ta ? a.v[(t * k + p) * m + i] : a.v[(t * m + i) * k + p];
            const double bv = tb ? b.v[(t * n + j) * k + p] : b.v[(t * k + p) * n + j];
            want[(t * m + i) * n + j] += av * bv;
          }
    const Tensor tx = put(rt, a, NamedSharding(mesh, testing::random_spec(rng, mesh, 4)));
    const Tensor ty = put(rt, b, NamedSharding(mesh, testing::random_spec(rng, mesh, 4)));
    expect_near(values(ops::matmul(tx, ty, ta, tb)), want);
    if (iter < 8) {
      check_gradient(rt, rng, mesh, {a, b},
                     [&](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], ta, tb); });
    }
  }
}

TEST(NnOps, SoftmaxMaxAndCrossEntropyMatchTheHost) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(23);
  for (int iter = 0; iter < 12; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t rows = 1 + iter % 5, classes = 2 + iter % 7;
    const Host x = random_host(rng, {rows, classes});
    const Tensor t = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
    std::vector<double> sm, lsm, mx;
    std::vector<int32_t> labels;
    double ce = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double m = -1e300, z = 0;
      for (int64_t c = 0; c < classes; ++c) m = std::max(m, x.v[r * classes + c]);
      for (int64_t c = 0; c < classes; ++c) z += std::exp(x.v[r * classes + c] - m);
      for (int64_t c = 0; c < classes; ++c) {
        sm.push_back(std::exp(x.v[r * classes + c] - m) / z);
        lsm.push_back(x.v[r * classes + c] - m - std::log(z));
      }
      mx.push_back(m);
      labels.push_back(static_cast<int32_t>(rng() % classes));
      ce -= lsm[static_cast<size_t>(r * classes + labels.back())];
    }
    ce /= static_cast<double>(rows);
    expect_near(values(ops::softmax(t, 1)), sm);
    expect_near(values(ops::log_softmax(t, 1)), lsm);
    expect_near(values(ops::max(t, 1)), mx);
    const Tensor tl = put_ids(rt, {rows}, labels, NamedSharding(mesh, testing::random_spec(rng, mesh, 1)));
    expect_near(values(ops::cross_entropy(t, tl)), {ce});
    check_gradient(rt, rng, mesh, {x}, [](const std::vector<Tensor>& in) { return ops::softmax(in[0], 1); });
    check_gradient(rt, rng, mesh, {x}, [](const std::vector<Tensor>& in) { return ops::max(in[0], 0); });
    check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], tl); });
    check_gradient(rt, rng, mesh, {x},
                   [](const std::vector<Tensor>& in) { return ops::mean(in[0], 1, true); });
  }
  // Labels outside the classes are refused by value.
  const Mesh mesh = Mesh::parse("x=2");
  const Tensor t = put(rt, random_host(rng, {2, 3}), NamedSharding(mesh, {}));
  EXPECT_THAT([&] { ops::cross_entropy(t, put_ids(rt, {2}, {1, 3}, NamedSharding(mesh, {}))); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("index 3 is out of range [0, 3)")));
}

// The per-position loss is one pass per row over whole classes: the same bits as the composite
// -sum(log_softmax * one_hot), forward and gradient, in f32 and f64 (classes whole, or on an axis of
// size 1); against the host where the classes are split; bad labels and shapes refused.
TEST(NnOps, SoftmaxCrossEntropyWithIntegerLabelsIsTheCompositeFused) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(41);
  auto composite = [](const Tensor& logits, const Tensor& labels) {
    return ops::neg(ops::sum(ops::mul(ops::log_softmax(logits, 2), ops::one_hot(labels, logits)), 2));
  };
  auto bits = [](const Tensor& t) {
    const HostArray h = to_host(ops::reduce(t).array());
    return std::vector<std::byte>(h.bytes().begin(), h.bytes().end());
  };
  for (const char* spec : {"data=2,fsdp=2,tensor=2", "data=4,tensor=1", "data=1,tensor=1"}) {
    const Mesh mesh = Mesh::parse(spec);
    for (const int64_t classes : {1, 7, 16, 37}) {
      for (const bool split_classes : {false, true}) {
        for (DType dtype : {DType::kF32, DType::kF64}) {
          SCOPED_TRACE(std::string(spec) + " classes " + std::to_string(classes) + (split_classes ? " split" : "") + " " +
                       std::string(name(dtype)));
          const Host x = random_host(rng, {4, 3, classes});
          std::vector<int32_t> labels;
          std::vector<double> want;
          for (int64_t r = 0; r < 12; ++r) {
            labels.push_back(static_cast<int32_t>(rng() % classes));
            double m = -1e300, z = 0;
            for (int64_t c = 0; c < classes; ++c) m = std::max(m, x.v[r * classes + c]);
            for (int64_t c = 0; c < classes; ++c) z += std::exp(x.v[r * classes + c] - m);
            want.push_back(std::log(z) - (x.v[r * classes + labels.back()] - m));
          }
          const DimSharding on_classes = split_classes ? DimSharding{"tensor"} : DimSharding{};
          const NamedSharding xs(mesh, PartitionSpec{{"data"}, {}, on_classes});
          const Tensor logits = ops::requires_grad(ops::cast(put(rt, x, xs), dtype));
          const Tensor tl = put_ids(rt, {4, 3}, labels, NamedSharding(mesh, {{}, {"data"}}));
          const Tensor loss = ops::softmax_cross_entropy_with_integer_labels(logits, tl);
          EXPECT_EQ(loss.shape(), Shape({4, 3}));
          expect_near(values(ops::cast(loss, DType::kF64)), want, dtype == DType::kF32 ? 1e-5 : 1e-12);
          const Tensor w = ops::cast(put(rt, random_host(rng, {4, 3}), NamedSharding(mesh, {})), dtype);
          const Tensor g = ops::grad(ops::sum(ops::mul(loss, w)), {logits})[0];
          if (!split_classes || mesh.axis_size("tensor") == 1) {
            const Tensor ref = composite(logits, tl);
            EXPECT_EQ(bits(loss), bits(ref));
            EXPECT_EQ(bits(g), bits(ops::grad(ops::sum(ops::mul(ref, w)), {logits})[0]));
          }
          // d/dx of sum(w * loss) = w * (softmax - one_hot).
          std::vector<double> want_g;
          for (int64_t r = 0; r < 12; ++r) {
            double m = -1e300, z = 0;
            for (int64_t c = 0; c < classes; ++c) m = std::max(m, x.v[r * classes + c]);
            for (int64_t c = 0; c < classes; ++c) z += std::exp(x.v[r * classes + c] - m);
            const double wr = values(ops::cast(w, DType::kF64))[static_cast<size_t>(r)];
            for (int64_t c = 0; c < classes; ++c)
              want_g.push_back(wr * (std::exp(x.v[r * classes + c] - m) / z - (c == labels[static_cast<size_t>(r)] ? 1 : 0)));
          }
          expect_near(values(ops::cast(g, DType::kF64)), want_g, dtype == DType::kF32 ? 1e-5 : 1e-12);
        }
      }
    }
  }
  const Mesh mesh = Mesh::parse("data=2");
  const Tensor t = put(rt, random_host(rng, {2, 3}), NamedSharding(mesh, {{"data"}}));
  EXPECT_THAT([&] { ops::softmax_cross_entropy_with_integer_labels(t, put_ids(rt, {2}, {1, -1}, NamedSharding(mesh, {}))); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("index -1 is out of range [0, 3)")));
  EXPECT_THAT([&] { ops::softmax_cross_entropy_with_integer_labels(t, put_ids(rt, {3}, {0, 1, 2}, NamedSharding(mesh, {}))); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("do not match the leading dimensions")));
  const Tensor scalar = ops::sum(t);
  EXPECT_THAT([&] { ops::cross_entropy(scalar, put_ids(rt, {}, {0}, NamedSharding(mesh, {}))); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("logits need a class dimension")));
  EXPECT_THAT([&] { ops::softmax_cross_entropy_with_integer_labels(t, ops::cast(t, DType::kF32)); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("takes i32 or i64 indices")));
}

TEST(NnOps, RmsNormMatchesTheHostFusedOrNot) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(27);
  for (int iter = 0; iter < 12; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t rows = 1 + iter % 4, n = 2 + iter % 5;
    const Host x = random_host(rng, {2, rows, n}), scale = random_host(rng, {n});
    std::vector<double> want;
    for (int64_t r = 0; r < 2 * rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += x.v[r * n + i] * x.v[r * n + i];
      const double inv = 1 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
      for (int64_t i = 0; i < n; ++i) want.push_back(x.v[r * n + i] * inv * scale.v[i]);
    }
    const Tensor tx = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 3)));
    const Tensor ts = put(rt, scale, NamedSharding(mesh, testing::random_spec(rng, mesh, 1)));
    expect_near(values(ops::rms_norm(tx, ts, 1e-5)), want);
    check_gradient(rt, rng, mesh, {x, scale},
                   [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-5); });
  }
}

// RMSNorm's row kernels are built for several vector widths without FMA contraction: on a device
// holding whole rows, the output and both gradients equal the formulas written out here to the
// bit (the row sums in double over 16 interleaved lanes joined pairwise, as rows.h's reduce_lanes
// does), in f32 and f64, with rows of 70 (vector tails) split over the cores. Fails when the
// kernels are built with FMA contraction.
TEST(NnOps, RmsNormHasTheScalarFormulasBits) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(41);
  const int64_t rows = 40, n = 70;
  const double eps = 1e-5;
  auto lanes = [n](auto term) {
    double acc[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += term(i + j);
    for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
    for (int width = 8; width >= 1; width /= 2)
      for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
    return acc[0];
  };
  // y, dx and dscale of sum(rms_norm(x, scale) * g) in T.
  auto formulas = [&]<class T>(const Host& x, const Host& scale, const Host& g) {
    std::vector<double> y, dx, dscale(static_cast<size_t>(n), 0.0);
    std::vector<T> ds(static_cast<size_t>(n), T(0));
    for (int64_t r = 0; r < rows; ++r) {
      auto X = [&](int64_t i) { return static_cast<T>(x.v[static_cast<size_t>(r * n + i)]); };
      auto G = [&](int64_t i) { return static_cast<T>(g.v[static_cast<size_t>(r * n + i)]); };
      auto S = [&](int64_t i) { return static_cast<T>(scale.v[static_cast<size_t>(i)]); };
      const double ss = lanes([&](int64_t i) { return static_cast<double>(X(i)) * X(i); });
      const T v = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
      const double dot = lanes([&](int64_t i) { return static_cast<double>(G(i)) * S(i) * X(i); });
      const T c = static_cast<T>(dot / static_cast<double>(n)) * v * v;
      for (int64_t i = 0; i < n; ++i) {
        y.push_back(static_cast<double>(static_cast<T>(X(i) * v) * S(i)));
        dx.push_back(static_cast<double>(v * static_cast<T>(G(i) * S(i) - static_cast<T>(X(i) * c))));
        ds[static_cast<size_t>(i)] += G(i) * static_cast<T>(X(i) * v);
      }
    }
    for (int64_t i = 0; i < n; ++i) dscale[static_cast<size_t>(i)] = static_cast<double>(ds[static_cast<size_t>(i)]);
    return std::vector<std::vector<double>>{y, dx, dscale};
  };
  const Mesh mesh = Mesh::parse("data=1");
  for (DType dtype : {DType::kF32, DType::kF64}) {
    SCOPED_TRACE(std::string(name(dtype)));
    Host x = random_host(rng, {rows, n}), scale = random_host(rng, {n}), g = random_host(rng, {rows, n});
    if (dtype == DType::kF32) {  // values an f32 holds exactly, so the formulas start from the same inputs
      for (auto* v : {&x.v, &scale.v, &g.v})
        for (double& e : *v) e = static_cast<float>(e);
    }
    const NamedSharding replicated(mesh, {});
    const Tensor tx = ops::requires_grad(ops::cast(put(rt, x, replicated), dtype));
    const Tensor ts = ops::requires_grad(ops::cast(put(rt, scale, replicated), dtype));
    const Tensor y = ops::rms_norm(tx, ts, eps);
    const std::vector<Tensor> grads =
        ops::grad(ops::sum(ops::mul(y, ops::cast(put(rt, g, replicated), dtype))), {tx, ts});
    const std::vector<std::vector<double>> want =
        dtype == DType::kF32 ? formulas.operator()<float>(x, scale, g) : formulas.operator()<double>(x, scale, g);
    EXPECT_EQ(values(ops::cast(y, DType::kF64)), want[0]);
    EXPECT_EQ(values(ops::cast(grads[0], DType::kF64)), want[1]);
    EXPECT_EQ(values(ops::cast(grads[1], DType::kF64)), want[2]);
  }
}

// x's gradient from a residual add and from the RMSNorm reading x (a transformer block's residual
// stream): RMSNorm's backward adds the gradient x has gathered so far as it writes its own. The
// total has the bits of the two gradients taken apart and added, in f32 and f64, on random meshes
// and shardings of x's rows (where the gathered gradient is split otherwise than x, the sum is taken
// apart).
TEST(NnOps, RmsNormFoldsTheResidualGradientInToTheBit) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(57);
  for (int iter = 0; iter < 12; ++iter) {
    const Mesh mesh = iter < 2 ? Mesh::parse("data=1") : testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    SCOPED_TRACE(mesh.to_string() + " " + std::string(name(dtype)));
    const Host x = random_host(rng, {4, 3, 16}), w = random_host(rng, {4, 3, 16}), scale = random_host(rng, {16});
    // Whole rows: the fused kernel's case (a split last dimension takes RMSNorm's composite path,
    // whose graph sums x's gradient from several ops, in an order of its own).
    std::vector<DimSharding> dims = iter < 2 ? std::vector<DimSharding>(3) : testing::random_spec(rng, mesh, 3).dims();
    dims[2] = {};
    const NamedSharding xs(mesh, PartitionSpec(dims));
    const Tensor tx = ops::requires_grad(ops::cast(put(rt, x, xs), dtype));
    const Tensor tw = ops::cast(put(rt, w, xs), dtype);
    const Tensor ts = ops::cast(put(rt, scale, NamedSharding(mesh, {})), dtype);
    const Tensor normed = ops::rms_norm(tx, ts, 1e-5);
    const Tensor both = ops::grad(ops::sum(ops::mul(ops::add(tx, normed), tw)), {tx})[0];
    const Tensor residual = ops::grad(ops::sum(ops::mul(tx, tw)), {tx})[0];
    const Tensor norm_only = ops::grad(ops::sum(ops::mul(normed, tw)), {tx})[0];
    EXPECT_EQ(values(ops::cast(both, DType::kF64)), values(ops::cast(ops::add(residual, norm_only), DType::kF64)));
  }
}

// The scale's gradient is summed over the rows in one pass (no products written): against the host
// on meshes whose rows are split while other axes hold replicas, with the scale split over such an
// axis (its gradient's reduce-scatter then reads the replicas' partial sums), rank 2 to 4, in f32
// and f64.
TEST(NnOps, RmsNormScaleGradientSumsTheRowsOnAnyMesh) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(31);
  const std::vector<std::vector<int64_t>> shapes = {{12, 8}, {4, 6, 8}, {2, 3, 5, 8}, {3, 0, 8}};
  for (const char* spec : {"data=2,fsdp=2,tensor=2", "data=4,tensor=2", "data=1"}) {
    const Mesh mesh = Mesh::parse(spec);
    for (const auto& shape : shapes) {
      for (DType dtype : {DType::kF32, DType::kF64}) {
        SCOPED_TRACE(std::string(spec) + " " + Shape(shape).to_string() + " " + std::string(name(dtype)));
        const Host x = random_host(rng, shape), w = random_host(rng, shape), scale = random_host(rng, {8});
        const int64_t n = 8, rows = x.size() / n;
        std::vector<double> want(8, 0.0);  // d/dscale of sum(rms_norm(x, scale) * w)
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < n; ++i) ss += x.v[r * n + i] * x.v[r * n + i];
          const double inv = 1 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
          for (int64_t i = 0; i < n; ++i) want[i] += w.v[r * n + i] * x.v[r * n + i] * inv;
        }
        std::vector<DimSharding> dims(shape.size());
        if (mesh.device_count() > 1) dims[0] = {"data"};
        if (shape.size() > 2 && std::string(spec).find("fsdp") != std::string::npos) dims[1] = {"fsdp"};
        const NamedSharding xs(mesh, PartitionSpec(dims));
        const NamedSharding ss = mesh.device_count() > 1 ? NamedSharding(mesh, {{"tensor"}}) : NamedSharding(mesh, {});
        const Tensor tx = ops::cast(put(rt, x, xs), dtype), tw = ops::cast(put(rt, w, xs), dtype);
        const Tensor ts = ops::requires_grad(ops::cast(put(rt, scale, ss), dtype));
        const Tensor loss = ops::sum(ops::mul(ops::rms_norm(tx, ts, 1e-5), tw));
        const Tensor g = ops::grad(loss, {ts})[0];
        EXPECT_EQ(g.sharding(), ss);
        expect_near(values(ops::cast(g, DType::kF64)), want, dtype == DType::kF32 ? 1e-4 : 1e-10);
      }
    }
  }
}

TEST(NnOps, TakeLooksUpRowsOfAShardedTable) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(24);
  for (int iter = 0; iter < 16; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t vocab = 3 + iter % 6, embed = 1 + iter % 5, b = 1 + iter % 3, s = 1 + iter % 4;
    const Host table = random_host(rng, {vocab, embed});
    std::vector<int32_t> ids;
    std::vector<double> want;
    for (int64_t i = 0; i < b * s; ++i) {
      ids.push_back(static_cast<int32_t>(rng() % vocab));
      for (int64_t e = 0; e < embed; ++e) want.push_back(table.v[ids.back() * embed + e]);
    }
    const Tensor tt = put(rt, table, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
    const Tensor ti = put_ids(rt, {b, s}, ids, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
    expect_near(values(ops::take(tt, ti)), want);
    check_gradient(rt, rng, mesh, {table}, [&](const std::vector<Tensor>& in) { return ops::take(in[0], ti); });
  }
  // A vocabulary split stays a partial sum (each device looks up its own rows).
  const Mesh mesh = Mesh::parse("data=2,tensor=4");
  const Tensor tt = put(rt, random_host(rng, {8, 4}), NamedSharding(mesh, {{"tensor"}, {}}));
  const Tensor ti = put_ids(rt, {2, 3}, {0, 7, 3, 4, 1, 2}, NamedSharding(mesh, {{"data"}, {}}));
  const Tensor out = ops::take(tt, ti);
  EXPECT_EQ(out.partial(), std::vector<std::string>{"tensor"});
  EXPECT_EQ(out.sharding().spec(), PartitionSpec({{"data"}, {}, {}}));
}

// Large enough that one device's block is split over the cores: the embedding gradient sums each
// table row over its positions in order (the bits of a host loop in f32), and index() copies a
// layer of a stacked weight (dimension 1, as a scan reads it) exactly.
TEST(NnOps, TakeGradientAndIndexSplitOverTheCoresKeepTheHostsBits) {
  Runtime rt = Runtime::host(2);
  std::mt19937 rng(41);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t vocab = 256, embed = 64, positions = 512;
  for (const char* mesh_text : {"data=1", "data=2"}) {
    SCOPED_TRACE(mesh_text);
    const Mesh mesh = Mesh::parse(mesh_text);
    std::vector<float> tv(static_cast<size_t>(vocab * embed)), gv(static_cast<size_t>(positions * embed));
    for (float& v : tv) v = dist(rng);
    for (float& v : gv) v = dist(rng);
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < positions; ++i) ids.push_back(static_cast<int32_t>(rng() % 40 == 0 ? 7 : rng() % vocab));
    const NamedSharding replicated(mesh, PartitionSpec{});
    auto put_f32 = [&](const std::vector<float>& v, Shape shape) {
      return Tensor(device_put(rt, HostArray::from<float>(shape, std::span<const float>(v)), replicated));
    };
    const Tensor table = ops::requires_grad(put_f32(tv, Shape({vocab, embed})));
    const Tensor g = put_f32(gv, Shape({positions, embed}));
    const Tensor ti = put_ids(rt, {positions}, ids, replicated);
    const Tensor loss = ops::sum(ops::mul(ops::take(table, ti), g));
    const HostArray got = to_host(ops::grad(loss, {table})[0].array());
    std::vector<float> want(tv.size(), 0.0f);
    for (int64_t i = 0; i < positions; ++i) {
      const int64_t id = ids[static_cast<size_t>(i)];
      for (int64_t e = 0; e < embed; ++e) want[static_cast<size_t>(id * embed + e)] += gv[static_cast<size_t>(i * embed + e)];
    }
    const auto gotv = got.values<float>();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::memcmp(&gotv[i], &want[i], 4), 0) << "table element " << i << ": " << gotv[i] << " against " << want[i];

    const int64_t rows = 256, layers = 4, cols = 1024;
    std::vector<float> sv(static_cast<size_t>(rows * layers * cols));
    for (float& v : sv) v = dist(rng);
    const Tensor stacked = put_f32(sv, Shape({rows, layers, cols}));
    for (int64_t l = 0; l < layers; ++l) {
      const HostArray slice = to_host(ops::index(stacked, 1, l).array());
      const auto sl = slice.values<float>();
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(&sl[static_cast<size_t>(r * cols)], &sv[static_cast<size_t>((r * layers + l) * cols)], cols * 4), 0)
            << "layer " << l << " row " << r;
    }
  }
}

TEST(NnOps, ReshapeTransposeAndIndexMoveShardsWithTheirDimensions) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(25);
  for (int iter = 0; iter < 24; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t b = 1 + iter % 3, s = 2 + iter % 3, h = 2 + iter % 4, d = 1 + iter % 3;
    const Host x = random_host(rng, {b, s, h, d});
    const Tensor t = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4)));
    // Reshape keeps the bytes' order.
    expect_near(values(ops::reshape(t, Shape{b, s, h * d})), x.v);
    expect_near(values(ops::reshape(ops::reshape(t, Shape{b * s, h * d}), Shape{b, s, h, d})), x.v);
    // [b, s, h, d] -> [b, h, s, d]
    std::vector<double> tr;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t k = 0; k < h; ++k)
        for (int64_t j = 0; j < s; ++j)
          for (int64_t e = 0; e < d; ++e) tr.push_back(x.v[((i * s + j) * h + k) * d + e]);
    expect_near(values(ops::transpose(t, {0, 2, 1, 3})), tr);
    // index along s
    const int64_t at = iter % s;
    std::vector<double> ix;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t k = 0; k < h * d; ++k) ix.push_back(x.v[(i * s + at) * h * d + k]);
    expect_near(values(ops::index(t, 1, at)), ix);
    if (iter < 6) {
      check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) {
        return ops::reshape(ops::transpose(in[0], {2, 0, 3, 1}), Shape{h * b, d * s});
      });
      check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) { return ops::index(in[0], 1, at); });
    }
  }
  // An even split of the leading dimension of a group survives a reshape with no communication.
  const Mesh mesh = Mesh::parse("data=2,tensor=4");
  const Tensor t = put(rt, random_host(rng, {2, 3, 8, 5}), NamedSharding(mesh, {{"data"}, {}, {"tensor"}, {}}));
  EXPECT_EQ(ops::reshape(t, Shape{2, 3, 40}).sharding().spec(), PartitionSpec({{"data"}, {}, {"tensor"}}));
  EXPECT_EQ(ops::reshape(t, Shape{2, 3, 4, 2, 5}).sharding().spec(), PartitionSpec({{"data"}, {}, {"tensor"}, {}, {}}));
  EXPECT_THROW(ops::reshape(t, Shape{7}), ValueError);
  EXPECT_THROW(ops::transpose(t, {0, 1, 1, 3}), ValueError);
  EXPECT_THROW(ops::index(t, 1, 3), ValueError);
}

// A scan reads layer l of a stacked parameter with index(); grad() places the gradients of all
// slices of one tensor with a single index_put_all: the same values as placing each slice in a
// zero-filled tensor and adding them, repeated and unused layers included.
TEST(NnOps, GradientsOfIndexedSlicesArePlacedTogether) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(31);
  for (int iter = 0; iter < 12; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t b = 2 + iter % 3, layers = 3 + iter % 2, h = 4;
    const Host x = random_host(rng, {b, layers, h});
    const Tensor t = put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 3)));
    std::vector<std::pair<int64_t, Tensor>> pieces;
    for (int64_t l : {int64_t{0}, layers - 1, int64_t{0}}) pieces.emplace_back(l, ops::index(t, 1, l));
    // index_put_all equals index_put per piece, added in order, bit for bit.
    const Tensor together = ops::index_put_all(t.shape(), 1, pieces);
    Tensor apart;
    for (const auto& [l, g] : pieces) {
      const Tensor one = ops::index_put(g, t.shape(), 1, l);
      apart = apart.defined() ? ops::add(apart, one) : one;
    }
    EXPECT_EQ(together.sharding(), apart.sharding());
    EXPECT_EQ(values(together), values(apart));
    if (iter < 6) {
      // Layer 0 twice, layer 1 unused, the whole tensor once more; then with one slice's
      // gradient on another sharding (placed apart).
      for (bool resharded : {false, true}) {
        check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) {
          const Tensor& s = in[0];
          Tensor y = ops::mul(ops::index(s, 1, 0), ops::index(s, 1, layers - 1));
          y = ops::add(y, ops::index(s, 1, 0));
          const Tensor two = ops::index(s, 1, 2);
          y = ops::add(y, resharded ? ops::with_sharding_constraint(two, PartitionSpec{{}, {mesh.axis_names().front()}}) : two);
          return ops::add(ops::broadcast_like(ops::reshape(y, Shape{b, 1, h}), s), s);
        });
      }
    }
  }
  Runtime one = Runtime::host(1);
  const Mesh m1 = Mesh::parse("data=1");
  const Tensor a = put(one, random_host(rng, {2, 3}), NamedSharding(m1, {}));
  EXPECT_THAT([&] { ops::index_put_all(Shape{2, 4, 3}, 1, {{4, a}}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("no element 4")));
  EXPECT_THAT([&] { ops::index_put_all(Shape{2, 4, 5}, 1, {{0, a}}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("is not a slice of")));
  EXPECT_THROW(ops::index_put_all(Shape{2, 4, 3}, 1, {}), ValueError);
  EXPECT_THAT([&] { ops::index_put_all(Shape{2, 4, 3}, 1, {{0, a}, {1, ops::cast(a, DType::kF32)}}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("differ in dtype or sharding")));
  EXPECT_THAT([&] { ops::index_put_all(Shape{2, 4, 3}, 3, {{0, a}}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("no dimension 3")));
}

TEST(NnOps, CausalMaskRopeAndCast) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(26);
  for (int iter = 0; iter < 8; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const int64_t b = 2, s = 3 + iter % 4, h = 2, d = 4;
    const Host scores = random_host(rng, {b, s, s});
    const Tensor ts = put(rt, scores, NamedSharding(mesh, testing::random_spec(rng, mesh, 3)));
    const std::vector<double> masked = values(ops::causal_mask(ts));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t q = 0; q < s; ++q)
        for (int64_t k = 0; k < s; ++k) {
          const size_t at = static_cast<size_t>((i * s + q) * s + k);
          if (k > q) {
            EXPECT_LT(masked[at], -1e300);
          } else {
            EXPECT_EQ(masked[at], scores.v[at]);
          }
        }
    // A sliding window keeps the `window` keys up to the query's own position.
    const int64_t window = 1 + iter % 3;
    const std::vector<double> windowed = values(ops::causal_mask(ts, window));
    for (int64_t i = 0; i < b; ++i)
      for (int64_t q = 0; q < s; ++q)
        for (int64_t k = 0; k < s; ++k) {
          const size_t at = static_cast<size_t>((i * s + q) * s + k);
          if (k > q || q - k >= window) {
            EXPECT_LT(windowed[at], -1e300) << "window " << window << " query " << q << " key " << k;
          } else {
            EXPECT_EQ(windowed[at], scores.v[at]) << "window " << window << " query " << q << " key " << k;
          }
        }
    // Rope on [b, s, h, d]: rotation of (x[k], x[k + d/2]) by pos / 10000^(2k/d).
    const Host x = random_host(rng, {b, s, h, d});
    std::vector<double> want(x.v.size());
    for (int64_t i = 0; i < b; ++i)
      for (int64_t p = 0; p < s; ++p)
        for (int64_t j = 0; j < h; ++j)
          for (int64_t k = 0; k < d / 2; ++k) {
            const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(k) / d);
            const size_t base = static_cast<size_t>(((i * s + p) * h + j) * d);
            const double x1 = x.v[base + k], x2 = x.v[base + k + d / 2];
            want[base + k] = x1 * std::cos(angle) - x2 * std::sin(angle);
            want[base + k + d / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
          }
    expect_near(values(ops::rope(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))), 1)), want);
    check_gradient(rt, rng, mesh, {x}, [](const std::vector<Tensor>& in) { return ops::rope(in[0], 1); });
    check_gradient(rt, rng, mesh, {scores},
                   [](const std::vector<Tensor>& in) { return ops::softmax(ops::causal_mask(in[0]), 2); });
    // f64 -> f32 -> bf16 -> f64 keeps values bf16 can hold; the gradient passes through.
    Host small = random_host(rng, {4, 3});
    for (auto& v : small.v) v = std::round(v * 8) / 8;
    const Tensor tsmall = put(rt, small, NamedSharding(mesh, testing::random_spec(rng, mesh, 2)));
    expect_near(values(ops::cast(ops::cast(ops::cast(tsmall, DType::kF32), DType::kBF16), DType::kF64)), small.v);
    const Tensor p = ops::requires_grad(tsmall);
    const auto g = ops::grad(ops::sum(ops::cast(ops::cast(p, DType::kF32), DType::kF64)), {p});
    expect_near(values(g[0]), std::vector<double>(small.v.size(), 1.0));
  }
}

// Rope's rotation is computed in the input's dtype from cos and sin rounded to it, the same bits
// whichever vector width the kernel runs at (it must not contract x * c - y * s into an FMA) and
// wherever a block's positions start: the forward, and the backward (the rotation by -angle), in
// f32 and f64, against that formula written out here, with a head_dim whose half (35) leaves
// vector tails and positions sharded.
TEST(NnOps, RopeHasTheScalarFormulasBitsOnAnyMesh) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(31);
  const int64_t b = 2, s = 12, h = 3, half = 35, d = 2 * half;
  auto rotate = [&]<class T>(const std::vector<double>& x, double sign) {
    std::vector<double> want(x.size());
    for (int64_t i = 0; i < b; ++i)
      for (int64_t p = 0; p < s; ++p)
        for (int64_t k = 0; k < half; ++k) {
          const double angle = static_cast<double>(p) * (1.0 / std::pow(10000.0, 2.0 * static_cast<double>(k) / d));
          const T c = static_cast<T>(std::cos(angle)), sn = static_cast<T>(sign * std::sin(angle));
          for (int64_t j = 0; j < h; ++j) {
            const size_t base = static_cast<size_t>(((i * s + p) * h + j) * d);
            const T x1 = static_cast<T>(x[base + k]), x2 = static_cast<T>(x[base + k + half]);
            const T a1 = x1 * c, b1 = x2 * sn, a2 = x2 * c, b2 = x1 * sn;
            want[base + k] = static_cast<double>(static_cast<T>(a1 - b1));
            want[base + k + half] = static_cast<double>(static_cast<T>(a2 + b2));
          }
        }
    return want;
  };
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    SCOPED_TRACE(mesh.to_string() + " " + std::string(name(dtype)));
    const NamedSharding sharding(mesh, testing::random_spec(rng, mesh, 4));
    Host x = random_host(rng, {b, s, h, d}), g = random_host(rng, {b, s, h, d});
    if (dtype == DType::kF32) {  // values an f32 holds exactly, so the host formula starts from the same inputs
      for (auto* v : {&x.v, &g.v})
        for (double& e : *v) e = static_cast<float>(e);
    }
    const Tensor tx = ops::requires_grad(ops::cast(put(rt, x, sharding), dtype));
    const Tensor y = ops::rope(tx, 1);
    const std::vector<double> gx = values(
        ops::cast(ops::grad(ops::sum(ops::mul(y, ops::cast(put(rt, g, sharding), dtype))), {tx})[0], DType::kF64));
    const std::vector<double> got = values(ops::cast(y, DType::kF64));
    if (dtype == DType::kF32) {
      EXPECT_EQ(got, rotate.operator()<float>(x.v, 1.0));
      EXPECT_EQ(gx, rotate.operator()<float>(g.v, -1.0));
    } else {
      EXPECT_EQ(got, rotate.operator()<double>(x.v, 1.0));
      EXPECT_EQ(gx, rotate.operator()<double>(g.v, -1.0));
    }
  }
}

// Rope's tables of cos and sin are kept between calls: a call gets the table of its own
// timescale, length and direction, also after others (more than the cache holds) came between.
TEST(NnOps, RopeReusesATableOnlyForItsOwnPositionsAndFrequencies) {
  Runtime rt = Runtime::host(4);
  const Mesh mesh({{"data", 2}, {"model", 2}});
  std::mt19937 rng(41);
  const int64_t b = 2, h = 2, half = 5, d = 2 * half;
  std::uniform_int_distribution<int> pick(0, 11);
  for (int iter = 0; iter < 40; ++iter) {
    const int which = pick(rng);  // 12 kinds of call: 3 timescales x 2 lengths x forward or back
    const double timescale = which % 3 == 0 ? 10000.0 : which % 3 == 1 ? 500000.0 : 37.0;
    const int64_t s = (which / 3) % 2 ? 6 : 8;
    const bool back = which >= 6;
    SCOPED_TRACE("timescale " + std::to_string(timescale) + " seq " + std::to_string(s) + (back ? " back" : ""));
    const Host x = random_host(rng, {b, s, h, d});
    const Tensor tx = ops::requires_grad(put(rt, x, NamedSharding(mesh, PartitionSpec({{"data"}, {"model"}}))));
    const Tensor y = ops::rope(tx, 1, timescale);
    const std::vector<double> got =
        back ? values(ops::grad(ops::sum(ops::mul(y, put(rt, x, NamedSharding(mesh, {})))), {tx})[0]) : values(y);
    std::vector<double> want(x.v.size());
    const double sign = back ? -1.0 : 1.0;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t p = 0; p < s; ++p)
        for (int64_t k = 0; k < half; ++k) {
          const double angle = static_cast<double>(p) * (1.0 / std::pow(timescale, 2.0 * static_cast<double>(k) / d));
          const double c = std::cos(angle), sn = sign * std::sin(angle);
          for (int64_t j = 0; j < h; ++j) {
            const size_t base = static_cast<size_t>(((i * s + p) * h + j) * d);
            const double x1 = x.v[base + k], x2 = x.v[base + k + half];
            want[base + k] = x1 * c - x2 * sn;
            want[base + k + half] = x2 * c + x1 * sn;
          }
        }
    EXPECT_EQ(got, want);
  }
}

// rope with a scale has the bits of scale after rope, forward and gradient (the gradient scaled
// before it is rotated back), on random meshes in f32 and f64, head_dim 70 (vector tails).
TEST(NnOps, RopeWithAScaleHasTheBitsOfScaleAfterRope) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(37);
  const double c = 1.0 / std::sqrt(48.0);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    const DType dtype = iter % 2 ? DType::kF64 : DType::kF32;
    SCOPED_TRACE(mesh.to_string() + " " + std::string(name(dtype)));
    const NamedSharding sharding(mesh, testing::random_spec(rng, mesh, 4));
    const Host x = random_host(rng, {2, 12, 3, 70}), g = random_host(rng, {2, 12, 3, 70});
    const Tensor tx = ops::requires_grad(ops::cast(put(rt, x, sharding), dtype));
    const Tensor tg = ops::cast(put(rt, g, sharding), dtype);
    const Tensor fused = ops::rope(tx, 1, 10000.0, c), apart = ops::scale(ops::rope(tx, 1), c);
    EXPECT_EQ(values(ops::cast(fused, DType::kF64)), values(ops::cast(apart, DType::kF64)));
    EXPECT_EQ(values(ops::cast(ops::grad(ops::sum(ops::mul(fused, tg)), {tx})[0], DType::kF64)),
              values(ops::cast(ops::grad(ops::sum(ops::mul(apart, tg)), {tx})[0], DType::kF64)));
  }
}

// slice, concat and broadcast_like (MLA's pieces) against host loops, gradients against finite
// differences, on random meshes and shardings.
TEST(NnOps, SliceConcatAndBroadcastMoveTheRightElements) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(17);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    SCOPED_TRACE(mesh.to_string());
    const Host a = random_host(rng, {3, 5, 4}), b = random_host(rng, {3, 2, 4}), r = random_host(rng, {3, 1, 4});
    auto spec = [&](size_t rank) { return NamedSharding(mesh, testing::random_spec(rng, mesh, rank)); };
    const Tensor ta = put(rt, a, spec(3)), tb = put(rt, b, spec(3)), tr = put(rt, r, spec(3));
    std::vector<double> want_slice, want_concat, want_bcast;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 7; ++j)
        for (int k = 0; k < 4; ++k) {
          want_concat.push_back(j < 5 ? a.v[(i * 5 + j) * 4 + k] : b.v[(i * 2 + j - 5) * 4 + k]);
          if (j >= 1 && j < 4) want_slice.push_back(a.v[(i * 5 + j) * 4 + k]);
          if (j < 5) want_bcast.push_back(r.v[i * 4 + k]);
        }
    expect_near(values(ops::slice(ta, 1, 1, 3)), want_slice);
    expect_near(values(ops::concat({ta, tb}, 1)), want_concat);
    const Tensor wide = ops::broadcast_like(tr, ta);
    EXPECT_EQ(wide.sharding(), ta.sharding());
    expect_near(values(wide), want_bcast);
    check_gradient(rt, rng, mesh, {a, b, r}, [](const std::vector<Tensor>& in) {
      return ops::concat({ops::slice(in[0], 1, 1, 3), in[1], ops::broadcast_like(in[2], in[0])}, 1);
    });
  }
  const Tensor x = put(Runtime::host(1), random_host(rng, {2, 3}), NamedSharding(Mesh({{"x", 1}}), {}));
  EXPECT_THAT([&] { ops::slice(x, 1, 2, 2); }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("[2, 4) along dimension 1")));
  EXPECT_THAT([&] { ops::concat({x, ops::slice(x, 0, 0, 1)}, 1); }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("does not join")));
}

// YaRN's rope against MaxText's formula written out here (complex pairs times exp(i pos f_k), the
// frequencies blended over the correction range), interleaved and halved, and its gradient.
TEST(NnOps, YarnRopeMatchesMaxTextsFormula) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(23);
  const int64_t b = 2, s = 5, h = 3, d = 8, half = d / 2;
  for (bool interleave : {true, false}) {
    const ops::YarnRope yarn{.max_timescale = 10000, .factor = 40, .beta_fast = 32, .beta_slow = 1,
                             .original_max_position = 4096, .interleave = interleave, .truncate = true,
                             .attention_scaling = interleave};
    // correction dims: 8 ln(4096 / (32 * 2 pi)) / (2 ln 1e4) = 1.31 -> 1; 8 ln(4096 / (2 pi)) / (2 ln 1e4) = 2.81 -> 3
    std::vector<double> freq(half);
    for (int64_t k = 0; k < half; ++k) {
      const double base = 1.0 / std::pow(10000.0, 2.0 * k / d);
      const double ramp = std::clamp((k - 1.0) / (3.0 - 1.0), 0.0, 1.0);
      freq[k] = base / 40 * ramp + base * (1 - ramp);
    }
    const double mscale = interleave ? 0.1 * std::log(40.0) + 1.0 : 1.0;
    const Host x = random_host(rng, {b, s, h, d});
    std::vector<double> want(x.v.size());
    for (int64_t row = 0; row < b * s * h; ++row) {
      const double pos = static_cast<double>((row / h) % s);
      for (int64_t k = 0; k < half; ++k) {
        const double re = x.v[row * d + (interleave ? 2 * k : k)], im = x.v[row * d + (interleave ? 2 * k + 1 : k + half)];
        const double c = std::cos(pos * freq[k]), sn = std::sin(pos * freq[k]);
        want[row * d + k] = (re * c - im * sn) * mscale;
        want[row * d + half + k] = (re * sn + im * c) * mscale;
      }
    }
    for (int iter = 0; iter < 3; ++iter) {
      const Mesh mesh = testing::random_mesh(rng);
      SCOPED_TRACE(mesh.to_string() + (interleave ? " interleaved" : " halves"));
      expect_near(values(ops::yarn_rope(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))), 1, yarn)),
                  want);
      check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) { return ops::yarn_rope(in[0], 1, yarn); });
      // The attention scaling, applied inside the rotation's pass, has the bits of a scale after
      // the whole op (forward and gradient).
      ops::YarnRope unscaled = yarn;
      unscaled.attention_scaling = false;
      const Tensor tx = ops::requires_grad(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 4))));
      const Tensor tg = put(rt, random_host(rng, {b, s, h, d}), NamedSharding(mesh, testing::random_spec(rng, mesh, 4)));
      const Tensor fused = ops::yarn_rope(tx, 1, yarn), apart = ops::scale(ops::yarn_rope(tx, 1, unscaled), mscale);
      EXPECT_EQ(values(fused), values(apart));
      EXPECT_EQ(values(ops::grad(ops::sum(ops::mul(fused, tg)), {tx})[0]),
                values(ops::grad(ops::sum(ops::mul(apart, tg)), {tx})[0]));
    }
  }
}

}  // namespace
}  // namespace tessel
