#include "tessel/state/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/state/init.h"
#include "tessel/models/dot_relu_dot.h"
#include "tessel/models/transformer.h"

namespace tessel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

LogicalRules rules() { return LogicalRules({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}}); }

// w: f32[10,6] (embed, mlp); b: f32[6] replicated; n: bf16[8] replicated.
Module small() {
  Module m("m");
  m.param({.name = "w", .shape = {10, 6}, .partitioning = Partitioning::by_logical({"embed", "mlp"})});
  m.param({.name = "b", .shape = {6}});
  m.param({.name = "n", .shape = {8}, .dtype = DType::kBF16});
  return m;
}

TEST(Plan, CountsEachDevicesBlocksOfUnevenShapes) {
  // fsdp=4 splits 10 rows into 3,3,3,1; tensor=2 splits 6 columns 3,3. Device = fsdp * 2 + tensor.
  MemoryPlan p = plan(eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), rules()));
  EXPECT_EQ(p.device_count, 8);
  EXPECT_EQ(p.param_count, 60 + 6 + 8);
  EXPECT_EQ(p.param_bytes, 240 + 24 + 16);
  EXPECT_EQ(p.params_per_device.max, 36 + 24 + 16);
  EXPECT_EQ(p.params_per_device.max_device, 0);
  EXPECT_EQ(p.params_per_device.min, 12 + 24 + 16);  // devices 6 and 7 hold one row
  EXPECT_DOUBLE_EQ(p.params_per_device.mean, (6.0 * 76 + 2 * 52) / 8);
  EXPECT_EQ(p.gradients_per_device.max, 0);
  EXPECT_EQ(p.total.max, 76);
  ASSERT_EQ(p.params.size(), 3u);
  EXPECT_EQ(p.params[2].path, "w");
  EXPECT_EQ(p.params[2].max_device_bytes, 36);
  EXPECT_EQ(p.params[2].copies, 1);
  EXPECT_EQ(p.params[0].copies, 8);
}

TEST(Plan, NamesTheFullestDeviceByItsId) {
  Mesh reversed({{"fsdp", 4}, {"tensor", 2}}, {7, 6, 5, 4, 3, 2, 1, 0});
  MemoryPlan p = plan(eval_shape(small(), reversed, rules()));
  EXPECT_EQ(p.params_per_device.max_device, 7);  // mesh position 0
  EXPECT_EQ(p.params_by_device.back(), 52);      // position 7 (device 0) holds one row
}

TEST(Plan, OptimizersScaleTheParameterBytes) {
  State s = eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), rules());
  MemoryPlan adam = plan(s, {.optimizer = Optimizer::kAdamW});
  EXPECT_EQ(adam.gradients_per_device.max, 76);
  EXPECT_EQ(adam.optimizer_per_device.max, 152);
  EXPECT_EQ(adam.total.max, 4 * 76);
  EXPECT_EQ(adam.total.min, 4 * 52);
  MemoryPlan sgd = plan(s, {.optimizer = Optimizer::kSgdMomentum});
  EXPECT_EQ(sgd.total.max, 3 * 76);
  MemoryPlan grads = plan(s, {.gradients = true});
  EXPECT_EQ(grads.total.max, 2 * 76);
  EXPECT_EQ(parse_optimizer("adamw"), Optimizer::kAdamW);
  EXPECT_THROW(parse_optimizer("lion"), ValueError);
}

TEST(Plan, ListsReplicatedParametersAndChecksShardingInBytes) {
  MemoryPlan p = plan(eval_shape(small(), Mesh::parse("data=2,fsdp=4,tensor=2"), rules()));
  EXPECT_THAT(p.weight_axes, ElementsAre("fsdp", "tensor"));  // data replicates by design
  ASSERT_EQ(p.largest_replicated.size(), 2u);
  EXPECT_EQ(p.params[p.largest_replicated[0]].path, "b");  // 24 bytes before n's 16
  EXPECT_EQ(p.unsharded_bytes, 40);
  EXPECT_DOUBLE_EQ(p.unsharded_fraction, 40.0 / 280);
  EXPECT_FALSE(p.sufficiently_sharded);
  EXPECT_TRUE(plan(eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), rules()), {.tolerance = 0.2})
                  .sufficiently_sharded);
  // w sharded on fsdp only when tensor is absent from its spec: an offender too.
  MemoryPlan q = plan(eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), LogicalRules({{"embed", {"fsdp"}}})));
  EXPECT_EQ(q.params[q.offenders[0]].path, "w");
  EXPECT_THAT(q.params[q.offenders[0]].unsharded_axes, ElementsAre("tensor"));
  // Only replica axes: nothing to check.
  MemoryPlan d = plan(eval_shape(small(), Mesh::parse("data=8,fsdp=1,tensor=1"), rules()));
  EXPECT_TRUE(d.weight_axes.empty());
  EXPECT_TRUE(d.sufficiently_sharded);
  EXPECT_THAT(d.to_string(), HasSubstr("nothing to check"));
}

TEST(Plan, JsonAndTextCarryTheFigures) {
  MemoryPlan p = plan(eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), rules()), {.optimizer = Optimizer::kAdamW});
  auto j = nlohmann::json::parse(p.to_json());
  EXPECT_EQ(j["per_device"]["total"]["max"], 304);
  EXPECT_EQ(j["param_bytes"], 280);
  EXPECT_EQ(j["params"][2]["spec"], nlohmann::json::parse(R"(["fsdp","tensor"])"));
  EXPECT_EQ(j["sufficiently_sharded"]["unsharded_bytes"], 40);
  std::string text = p.to_string();
  EXPECT_THAT(text, HasSubstr("opt (adamw)"));
  EXPECT_THAT(text, HasSubstr("304 B"));
}

TEST(Plan, RejectsUnplacedVariablesAndMixedMeshes) {
  State s = eval_shape(small(), Mesh::parse("fsdp=4,tensor=2"), rules());
  State other = eval_shape(dot_relu_dot({.depth = 4}), Mesh::parse("fsdp=2,tensor=1"), rules());
  EXPECT_THAT([&] { plan(State::merge({s, other})); }, ThrowsMessage<ValueError>(HasSubstr("one mesh at a time")));
  State unplaced;
  unplaced.insert("x", Variable::abstract(kParam, {2}, DType::kF32));
  EXPECT_THAT([&] { plan(unplaced); }, ThrowsMessage<ValueError>(HasSubstr("'x' has no sharding")));
  EXPECT_THROW(plan(s, {.tolerance = 2}), ValueError);
}

TEST(Plan, AbsurdSizesFailInsteadOfWrappingAround) {
  // A fuzzer finding: each parameter fits in int64 bytes, their sum does not.
  TransformerConfig c{.embed = int64_t{910064704}, .heads = 4, .mlp = 1};
  c.vocab = 1;
  EXPECT_THAT([&] { plan(eval_shape(transformer_lm(c), Mesh::parse("fsdp=1,tensor=1"), rules())); },
              ThrowsMessage<ValueError>(HasSubstr("exceed 2^63")));
  Module m("m");
  EXPECT_THAT([&] { m.param({.name = "w", .shape = {int64_t{1} << 31, int64_t{1} << 31}, .dtype = DType::kF64}); },
              ThrowsMessage<ValueError>(HasSubstr("more than 2^63 bytes")));
}

TEST(Plan, ScalesToA405BModelOn8192Devices) {
  TransformerConfig c{.vocab = 128256, .embed = 16384, .layers = 126, .heads = 128, .kv_heads = 8,
                      .head_dim = 128, .mlp = 53248, .gated_mlp = true, .dtype = DType::kBF16};
  LogicalRules r({{"vocab", {"tensor"}}, {"embed", {"fsdp"}}, {"mlp", {"tensor"}}, {"heads", {"tensor"}},
                  {"q_heads", {"tensor"}}, {"kv_heads", {"tensor"}}});
  MemoryPlan p = plan(eval_shape(transformer_lm(c), Mesh::parse("data=16,fsdp=64,tensor=8"), r));
  EXPECT_EQ(p.param_count, 405853388800);  // Llama 3.1 405B's published count
  EXPECT_EQ(p.device_count, 8192);
  EXPECT_NEAR(static_cast<double>(p.params_per_device.max), 2.0 * 405853388800 / 512, 0.01 * 2 * 405853388800 / 512);
}

}  // namespace
}  // namespace tessel
