// Training end to end: the same losses on every mesh, resume on another mesh, eval_shape of a
// step, and the optimizers against host references.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/models/train.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/init.h"

namespace tessel {
namespace {

ModelConfig small_lm() {
  return parse_model_config(R"(
model: transformer
vocab: 256
embed: 32
layers: 2
heads: 8
kv_heads: 4
mlp: 64
)", "small_lm");
}

nn::OptimizerConfig adamw() {
  return {.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 3e-3, .warmup = 5, .decay_steps = 50}};
}

std::vector<double> train(const Runtime& rt, const Mesh& mesh, int64_t from, int64_t to, State* state,
                          const models::Trainer& t, const nn::ByteDataset& data) {
  std::vector<double> losses;
  for (int64_t s = from; s < to; ++s) {
    const nn::Batch b = t.batch(&data, {.seed = 3, .step = s}, 8, 16);
    losses.push_back(t.step(*state, b, s).loss);
  }
  (void)rt;
  (void)mesh;
  return losses;
}

TEST(Train, LmLossesAgreeAcrossMeshes) {
  Runtime rt = Runtime::host(8);
  const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  std::vector<double> one;
  for (const char* m : {"data=1", "data=8", "fsdp=8", "tensor=8", "data=2,fsdp=2,tensor=2"}) {
    SCOPED_TRACE(m);
    const LogicalRules rules = models::default_rules();
    const Mesh mesh = Mesh::parse(m, rules.mesh_axes());
    models::Trainer t(rt, small_lm(), mesh, rules, adamw());
    State state = t.init(1);
    const std::vector<double> losses = train(rt, mesh, 0, 20, &state, t, data);
    if (one.empty()) {
      one = losses;
      EXPECT_LT(losses.back(), losses.front() - 0.5);
      continue;
    }
    for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(losses[i], one[i], 1e-4 * std::abs(one[i])) << "step " << i;
  }
}

TEST(Train, ResumedOnAnotherMeshGivesTheSameLosses) {
  Runtime rt = Runtime::host(8);
  const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  const LogicalRules rules = models::default_rules();
  const Mesh a = Mesh::parse("data=2,fsdp=2,tensor=2", rules.mesh_axes());
  const Mesh b = Mesh::parse("fsdp=4,tensor=2", rules.mesh_axes());
  models::Trainer ta(rt, small_lm(), a, rules, adamw()), tb(rt, small_lm(), b, rules, adamw());
  State straight = ta.init(1);
  const std::vector<double> want = train(rt, a, 0, 20, &straight, ta, data);

  testing::TempDir dir;
  State first = ta.init(1);
  std::vector<double> got = train(rt, a, 0, 10, &first, ta, data);
  {
    CheckpointManager ckpt(dir.path());
    ckpt.save(10, first, {{"data", nn::DataPosition{.seed = 3, .step = 10}.to_json(&data)}});
  }
  CheckpointManager ckpt(dir.path());
  State resumed = ckpt.restore(rt, 10, tb.eval_shape());
  for (const auto& [path, v] : resumed) EXPECT_EQ(v.sharding()->mesh(), b) << path;
  const nn::DataPosition at = nn::DataPosition::from_json(ckpt.restore_json(10, "data"), &data);
  EXPECT_EQ(at.step, 10);
  const std::vector<double> rest = train(rt, b, at.step, 20, &resumed, tb, data);
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << "step " << i;
}

// eval_shape of a whole step: the shapes, dtypes and shardings of a real step's outputs, with
// nothing allocated.
TEST(Train, EvalShapeOfAStepMatchesARealStep) {
  for (const char* model : {"lm", "mlp"}) {
    SCOPED_TRACE(model);
    Runtime rt = Runtime::host(8);
    const LogicalRules rules = models::default_rules();
    const Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2", rules.mesh_axes());
    const ModelConfig config = std::string(model) == "lm" ? small_lm()
                                                          : parse_model_config("model: dot_relu_dot\ndepth: 16\nhidden: 32\n");
    models::Trainer t(rt, config, mesh, rules, adamw());
    const State abstract = t.eval_shape();
    int64_t in_use = 0;
    for (int64_t d = 0; d < 8; ++d) in_use += rt.device(d).memory_stats().in_use;
    const models::StepOutputs shapes = t.eval_shape_step(abstract, 8, 16);
    int64_t after = 0;
    for (int64_t d = 0; d < 8; ++d) after += rt.device(d).memory_stats().in_use;
    EXPECT_EQ(after, in_use);  // nothing allocated
    EXPECT_TRUE(shapes.loss.is_abstract());
    const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
    const nn::Batch batch = t.batch(&data, {}, 8, 16);
    const models::StepOutputs real = t.run(t.init(0), Tensor(batch.inputs), Tensor(batch.targets), 0);
    EXPECT_EQ(shapes.loss.shape(), real.loss.shape());
    EXPECT_EQ(shapes.loss.sharding(), real.loss.sharding());
    ASSERT_EQ(shapes.state.paths(), real.state.paths());
    ASSERT_EQ(shapes.grads.paths(), real.grads.paths());
    for (const State* s : {&shapes.state, &shapes.grads}) {
      const State& r = s == &shapes.state ? real.state : real.grads;
      for (const auto& [path, v] : *s) {
        const Variable& w = r.at(path);
        EXPECT_TRUE(v.is_abstract());
        EXPECT_EQ(v.shape(), w.shape()) << path;
        EXPECT_EQ(v.dtype(), w.dtype()) << path;
        EXPECT_EQ(*v.sharding(), *w.sharding()) << path;
        EXPECT_EQ(v.kind(), w.kind()) << path;
      }
    }
    // Gradients and optimizer state are sharded exactly like their parameters.
    for (const auto& [path, v] : real.state) {
      if (v.kind() != kParam) continue;
      EXPECT_EQ(*real.grads.at(path).sharding(), *v.sharding()) << path;
      EXPECT_EQ(*real.state.at("opt_state/mu/" + path).sharding(), *v.sharding()) << path;
      EXPECT_EQ(*real.state.at("opt_state/nu/" + path).sharding(), *v.sharding()) << path;
    }
  }
}

// AdamW and SGD with momentum against optax's formulas on the host, with clipping.
TEST(Optimizer, UpdatesFollowOptaxOnShardedParameters) {
  Runtime rt = Runtime::host(8);
  const Mesh mesh = Mesh::parse("fsdp=4,tensor=2");
  const NamedSharding sharding(mesh, {{"fsdp"}, {"tensor"}});
  std::vector<double> p0(24), g0(24);
  for (size_t i = 0; i < 24; ++i) {
    p0[i] = std::sin(static_cast<double>(i));
    g0[i] = std::cos(3.0 * static_cast<double>(i));
  }
  auto array = [&](const std::vector<double>& v) {
    return device_put(rt, HostArray::from<double>(Shape{8, 3}, std::span<const double>(v)), sharding);
  };
  double norm = 0;
  for (double g : g0) norm += g * g;
  norm = std::sqrt(norm);
  for (const nn::OptimizerKind kind : {nn::OptimizerKind::kAdamW, nn::OptimizerKind::kSgd}) {
    nn::OptimizerConfig c{.kind = kind, .schedule = {.peak = 0.1, .warmup = 2, .decay_steps = 4}, .clip_norm = norm / 2};
    State params;
    params.insert("w", Variable(kParam, array(p0)));
    State opt = nn::init_optimizer(c, params);
    EXPECT_EQ(opt.size(), kind == nn::OptimizerKind::kAdamW ? 2u : 1u);
    std::vector<double> p = p0, m(24, 0.0), v(24, 0.0);
    for (int64_t step = 0; step < 4; ++step) {
      const nn::UpdateStats s = nn::apply_updates(c, step, params, opt, {{"w", array(g0)}});
      EXPECT_NEAR(s.grad_norm, norm, 1e-12);
      EXPECT_NEAR(s.lr, c.schedule.at(step), 1e-15);
      for (size_t i = 0; i < 24; ++i) {
        const double g = g0[i] * 0.5;  // clipped to half the norm
        if (kind == nn::OptimizerKind::kAdamW) {
          m[i] = 0.9 * m[i] + 0.1 * g;
          v[i] = 0.95 * v[i] + 0.05 * g * g;
          const double t = static_cast<double>(step + 1);
          const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
          p[i] -= s.lr * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * p[i]);
        } else {
          m[i] = g + 0.9 * m[i];
          p[i] -= s.lr * m[i];
        }
      }
      const HostArray host = to_host(params.at("w").array());
      const auto got = host.values<double>();
      for (size_t i = 0; i < 24; ++i) ASSERT_NEAR(got[i], p[i], 1e-12) << "step " << step << " element " << i;
      EXPECT_EQ(params.at("w").sharding(), sharding);
    }
  }
  // Warmup then cosine to 10%.
  const nn::Schedule s{.peak = 1.0, .warmup = 10, .decay_steps = 100};
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
}

// The f32 update tests' parameter and gradient: 61103 elements (vector tails, split over the
// cores), the gradient's sizes spread over three orders; and the gradient's norm.
constexpr int64_t kUpdateRows = 301, kUpdateCols = 203;
struct UpdateInputs {
  std::vector<float> p0, g0;
  double norm = 0;
};
UpdateInputs update_inputs() {
  const auto n = static_cast<size_t>(kUpdateRows * kUpdateCols);
  UpdateInputs in{std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    in.p0[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    in.g0[i] = static_cast<float>(std::cos(1.3 * static_cast<double>(i)) * (i % 7 == 0 ? 1e-3 : 1.0));
    in.norm += static_cast<double>(in.g0[i]) * in.g0[i];
  }
  in.norm = std::sqrt(in.norm);
  return in;
}

// fn(spec, sharding, array) on a mesh that splits the update's arrays unevenly and on one device,
// where an update's pass is spread over the cores; array(values) places values on the mesh.
void on_update_meshes(
    const std::function<void(const char*, const NamedSharding&, const std::function<Array(const std::vector<float>&)>&)>&
        fn) {
  for (const char* spec : {"fsdp=4,tensor=2", "data=1"}) {
    const Mesh mesh = Mesh::parse(spec);
    const NamedSharding sharding = mesh.device_count() > 1 ? NamedSharding(mesh, {{"fsdp"}, {"tensor"}})
                                                           : NamedSharding(mesh, {});
    Runtime rt = Runtime::host(mesh.device_count());
    fn(spec, sharding, [&](const std::vector<float>& v) {
      return device_put(rt, HostArray::from<float>(Shape{kUpdateRows, kUpdateCols}, std::span<const float>(v)),
                        sharding);
    });
  }
}

// f32 AdamW runs its moments and parameter in one pass per element: each step's values are the
// documented f64 arithmetic rounded to f32 (moments first, the parameter from the rounded
// moments), bit for bit, on a mesh that splits the array unevenly and on one device, where the
// pass is spread over the cores.
TEST(Optimizer, AdamWInF32IsTheF64FormulaRoundedPerStep) {
  const UpdateInputs in = update_inputs();
  const std::vector<float>&p0 = in.p0, &g0 = in.g0;
  const size_t n = p0.size();
  on_update_meshes([&](const char* spec, const NamedSharding& sharding, const auto& array) {
    const nn::OptimizerConfig c{.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 0.01, .warmup = 1},
                                .clip_norm = in.norm / 3};
    State params;
    params.insert("w", Variable(kParam, array(p0)));
    State opt = nn::init_optimizer(c, params);
    std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
    for (int64_t step = 0; step < 3; ++step) {
      const nn::UpdateStats s = nn::apply_updates(c, step, params, opt, {{"w", array(g0)}});
      const double clip = c.clip_norm / s.grad_norm, t = static_cast<double>(step + 1);
      const double bc1 = 1 - std::pow(c.b1, t), bc2 = 1 - std::pow(c.b2, t);
      for (size_t i = 0; i < n; ++i) {
        const double gc = clip * g0[i];
        m[i] = static_cast<float>(c.b1 * m[i] + (1 - c.b1) * clip * g0[i]);
        v[i] = static_cast<float>(c.b2 * v[i] + (1 - c.b2) * gc * gc);
        const double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps) + c.weight_decay * p[i];
        p[i] = static_cast<float>(p[i] - s.lr * update);
      }
      const HostArray hp = to_host(params.at("w").array()), hm = to_host(opt.at("opt_state/mu/w").array()),
                      hv = to_host(opt.at("opt_state/nu/w").array());
      const auto gp = hp.values<float>(), gm = hm.values<float>(), gv = hv.values<float>();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(gm[i], m[i]) << spec << " step " << step << " mu " << i;
        ASSERT_EQ(gv[i], v[i]) << spec << " step " << step << " nu " << i;
        ASSERT_EQ(gp[i], p[i]) << spec << " step " << step << " param " << i;
      }
      EXPECT_EQ(params.at("w").sharding(), sharding);
      EXPECT_EQ(opt.at("opt_state/mu/w").sharding(), sharding);
    }
  });
}

// f32 SGD, plain and with momentum, is the f64 formula rounded to f32 per step, bit for bit (the
// vectorized loop's every width).
TEST(Optimizer, SgdInF32IsTheF64FormulaRoundedPerStep) {
  const UpdateInputs in = update_inputs();
  const std::vector<float>&p0 = in.p0, &g0 = in.g0;
  const size_t n = p0.size();
  on_update_meshes([&](const char* spec, const NamedSharding& sharding, const auto& array) {
    for (const double momentum : {0.0, 0.9}) {
      const nn::OptimizerConfig c{.kind = nn::OptimizerKind::kSgd, .schedule = {.peak = 0.03, .warmup = 1},
                                  .momentum = momentum, .clip_norm = in.norm / 3};
      State params;
      params.insert("w", Variable(kParam, array(p0)));
      State opt = nn::init_optimizer(c, params);
      std::vector<float> p = p0, m(n, 0.0f);
      for (int64_t step = 0; step < 3; ++step) {
        const nn::UpdateStats s = nn::apply_updates(c, step, params, opt, {{"w", array(g0)}});
        const double clip = c.clip_norm / s.grad_norm;
        for (size_t i = 0; i < n; ++i) {
          if (momentum == 0) {
            p[i] = static_cast<float>(p[i] - s.lr * clip * g0[i]);
          } else {
            m[i] = static_cast<float>(clip * g0[i] + momentum * m[i]);
            p[i] = static_cast<float>(p[i] - s.lr * m[i]);
          }
        }
        const HostArray hp = to_host(params.at("w").array());
        const auto gp = hp.values<float>();
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(gp[i], p[i]) << spec << " momentum " << momentum << " step " << step << " " << i;
        if (momentum != 0) {
          const HostArray hm = to_host(opt.at("opt_state/mu/w").array());
          const auto gm = hm.values<float>();
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(gm[i], m[i]) << spec << " step " << step << " mu " << i;
        }
        EXPECT_EQ(params.at("w").sharding(), sharding);
      }
    }
  });
}

// The global norm spreads a large shard over the cores in fixed chunks: the same bits with 1, 2 or 5
// worker threads, on one device and on a sharded mesh, and the f64 norm to rounding.
TEST(Optimizer, GlobalNormHasTheSameBitsOnAnyNumberOfCores) {
  const int64_t rows = 613, cols = 509;  // 312017 elements: several chunks and a partial one
  std::vector<float> x(static_cast<size_t>(rows * cols)), y(1000);
  double exact = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(std::sin(0.71 * static_cast<double>(i)) * (1 + static_cast<double>(i % 13)));
    exact += static_cast<double>(x[i]) * x[i];
  }
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<float>(0.5 + static_cast<double>(i) * 1e-3);
    exact += static_cast<double>(y[i]) * y[i];
  }
  exact = std::sqrt(exact);
  for (const char* spec : {"data=1", "fsdp=4,tensor=2"}) {
    const Mesh mesh = Mesh::parse(spec);
    std::optional<double> first;
    for (int threads : {1, 2, 5}) {
      Runtime rt = Runtime::host(RuntimeOptions{.devices = mesh.device_count(), .threads = threads});
      const NamedSharding s = mesh.device_count() > 1 ? NamedSharding(mesh, {{"fsdp"}, {"tensor"}}) : NamedSharding(mesh, {});
      const std::map<std::string, Array> arrays = {
          {"a", device_put(rt, HostArray::from<float>(Shape{rows, cols}, std::span<const float>(x)), s)},
          {"b", device_put(rt, HostArray::from<float>(Shape{1000}, std::span<const float>(y)), NamedSharding(mesh, {}))}};
      const double norm = nn::global_norm(arrays);
      EXPECT_NEAR(norm, exact, 1e-12 * exact) << spec << " threads " << threads;
      if (!first) first = norm;
      EXPECT_EQ(norm, *first) << spec << " threads " << threads;
    }
  }
}

// Without clipping the norm is summed in the update's own pass: the bits of global_norm, and the
// same updates as with a clip that never binds (the norm taken first), on any mesh and core count.
TEST(Optimizer, AnUnclippedUpdateReportsTheGlobalNormsBits) {
  const int64_t rows = 613, cols = 509;  // several norm chunks and a partial one
  std::vector<float> p0(static_cast<size_t>(rows * cols)), g0(p0.size()), b0(1000), gb0(1000);
  for (size_t i = 0; i < p0.size(); ++i) {
    p0[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    g0[i] = static_cast<float>(std::sin(0.71 * static_cast<double>(i)) * (1 + static_cast<double>(i % 13)));
  }
  for (size_t i = 0; i < b0.size(); ++i) {
    b0[i] = static_cast<float>(0.25 + static_cast<double>(i) * 1e-3);
    gb0[i] = static_cast<float>(std::cos(static_cast<double>(i)));
  }
  for (const char* spec : {"data=1", "fsdp=4,tensor=2", "data=8"}) {
    const Mesh mesh = Mesh::parse(spec);
    const NamedSharding a_sharding =
        mesh.has_axis("fsdp") ? NamedSharding(mesh, {{"fsdp"}, {"tensor"}}) : NamedSharding(mesh, {});
    for (int threads : {1, 2, 5}) {
      Runtime rt = Runtime::host(RuntimeOptions{.devices = mesh.device_count(), .threads = threads});
      auto put = [&](const std::vector<float>& v, const Shape& shape, const NamedSharding& s) {
        return device_put(rt, HostArray::from<float>(shape, std::span<const float>(v)), s);
      };
      const std::map<std::string, Array> grads = {{"a", put(g0, Shape{rows, cols}, a_sharding)},
                                                   {"b", put(gb0, Shape{1000}, NamedSharding(mesh, {}))}};
      for (const nn::OptimizerKind kind : {nn::OptimizerKind::kAdamW, nn::OptimizerKind::kSgd}) {
        for (double momentum : {0.0, 0.9}) {
          if (kind == nn::OptimizerKind::kAdamW && momentum == 0.0) continue;
          SCOPED_TRACE(::testing::Message() << spec << ", " << threads << " threads, kind " << static_cast<int>(kind)
                                          << ", momentum " << momentum);
          std::vector<std::vector<float>> results;
          for (double clip_norm : {0.0, 1e300}) {
            const nn::OptimizerConfig c{.kind = kind, .schedule = {.peak = 0.01}, .momentum = momentum, .clip_norm = clip_norm};
            State params;
            params.insert("a", Variable(kParam, put(p0, Shape{rows, cols}, a_sharding)));
            params.insert("b", Variable(kParam, put(b0, Shape{1000}, NamedSharding(mesh, {}))));
            State opt = nn::init_optimizer(c, params);
            const nn::UpdateStats stats = nn::apply_updates(c, 0, params, opt, grads);
            EXPECT_EQ(stats.grad_norm, nn::global_norm(grads)) << "clip_norm " << clip_norm;
            std::vector<float> all;
            for (const char* path : {"a", "b"}) {
              const HostArray h = to_host(params.at(path).array());
              const auto v = h.values<float>();
              all.insert(all.end(), v.begin(), v.end());
            }
            results.push_back(std::move(all));
          }
          EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(Dataset, BatchesArePureFunctionsOfSeedAndStepAndRefuseBadInput) {
  Runtime rt = Runtime::host(8);
  testing::TempDir dir;
  const auto text = dir.write("t.txt", "abcdefghijklmnopqrstuvwxyz");
  const nn::ByteDataset data = nn::ByteDataset::open(text);
  const Mesh mesh = Mesh::parse("data=4,tensor=2");
  auto host = [&](const Array& a) {
    const HostArray h = to_host(a);
    const auto v = h.values<int32_t>();
    return std::vector<int32_t>(v.begin(), v.end());
  };
  const nn::Batch b1 = nn::make_batch(rt, data, {.seed = 1, .step = 4}, 8, 5, NamedSharding(mesh, {{"data"}}));
  const nn::Batch b2 = nn::make_batch(rt, data, {.seed = 1, .step = 4}, 8, 5, NamedSharding(mesh, {}));
  EXPECT_EQ(host(b1.inputs), host(b2.inputs));
  const std::vector<int32_t> in = host(b1.inputs), tg = host(b1.targets);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(tg[i], in[i] + 1);  // consecutive letters
  EXPECT_NE(host(nn::make_batch(rt, data, {.seed = 1, .step = 5}, 8, 5, NamedSharding(mesh, {})).inputs), in);
  // Each device's shard holds only its rows.
  EXPECT_EQ(b1.inputs.shard(0).box.volume(), 2 * 5);
  EXPECT_THAT([&] { nn::make_batch(rt, data, {}, 2, 26, NamedSharding(mesh, {})); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("need at least 27")));
  EXPECT_THROW(nn::ByteDataset::open(dir.path() / "missing.txt"), IoError);
  // Positions round-trip through JSON and refuse another text.
  const nn::DataPosition p = nn::DataPosition::from_json(nn::DataPosition{.seed = 9, .step = 12}.to_json(&data), &data);
  EXPECT_EQ(p.seed, 9u);
  EXPECT_EQ(p.step, 12);
  const nn::ByteDataset other = nn::ByteDataset::open(nn::ByteDataset::default_path());
  EXPECT_THAT([&] { nn::DataPosition::from_json(nn::DataPosition{}.to_json(&data), &other); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("resume with the same --data")));
  EXPECT_THROW(nn::DataPosition::from_json("{\"seed\": 1}", &data), ValueError);
  EXPECT_THROW(nn::DataPosition::from_json("not json", &data), ValueError);
}

}  // namespace
}  // namespace tessel
