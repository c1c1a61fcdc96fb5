#include "tessel/state/init.h"

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/device.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/models/transformer.h"
#include "tessel/state/plan.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// As MaxText: the rules declare the mesh axes, and a mesh names any of them (the rest size 1).
LogicalRules example_rules() {
  return LogicalRules({{"batch", {"data", "fsdp"}}, {"vocab", {"tensor"}}, {"embed", {"fsdp"}},
                       {"mlp", {"tensor"}}, {"heads", {"tensor"}}, {"q_heads", {"tensor"}},
                       {"kv_heads", {"tensor"}}, {"kv", {}}, {"norm", {}}, {"layers", {}}},
                      {"data", "fsdp", "tensor"});
}

Mesh mesh_of(const std::string& text) {
  std::vector<std::string> axes = {"data", "fsdp", "tensor"};
  return Mesh::parse(text, axes);
}

LogicalRules base_yml() { return load_rules(testing::testdata("maxtext/base.yml")); }

// Uneven sizes on purpose: blocks of ceil(n / k), some shorter.
TransformerConfig small_lm(bool scan) {
  return {.vocab = 37, .embed = 24, .layers = 3, .heads = 4, .kv_heads = 2, .mlp = 40, .scan_layers = scan,
          .gated_mlp = true, .qk_norm = true};
}

std::vector<std::byte> host_bytes(const Array& a) {
  HostArray h = to_host(a);
  auto b = h.bytes();
  return {b.begin(), b.end()};
}

std::map<std::string, std::vector<std::byte>> gathered(const State& s) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [path, v] : s) out[path] = host_bytes(v.array(path));
  return out;
}

TEST(Init, SameSeedGivesBitIdenticalParametersOnEveryMesh) {
  auto rt = Runtime::host(8);
  for (bool scan : {true, false}) {
    Module model = transformer_lm(small_lm(scan));
    auto reference = gathered(init(rt, model, 7, mesh_of("data=1"), example_rules()));
    for (const char* mesh : {"fsdp=8", "data=2,fsdp=2,tensor=2", "tensor=8", "fsdp=4,tensor=2", "data=8"}) {
      SCOPED_TRACE(std::string(mesh) + (scan ? " stacked" : " per layer"));
      State s = init(rt, model, 7, mesh_of(mesh), example_rules());
      ASSERT_EQ(s.size(), reference.size());
      for (const auto& [path, v] : s) EXPECT_EQ(host_bytes(v.array()), reference.at(path)) << path;
    }
  }
}

TEST(Init, SeedsAndPathsGiveDifferentValues) {
  auto rt = Runtime::host(8);
  Module model = transformer_lm(small_lm(false));
  Mesh mesh = mesh_of("fsdp=8");
  auto a = gathered(init(rt, model, 1, mesh, example_rules()));
  auto b = gathered(init(rt, model, 2, mesh, example_rules()));
  EXPECT_NE(a.at("token_embedder/embedding"), b.at("token_embedder/embedding"));
  EXPECT_NE(a.at("decoder/layers/0/mlp/wo/kernel"), a.at("decoder/layers/1/mlp/wo/kernel"));
  EXPECT_EQ(a.at("decoder/decoder_norm/scale"), b.at("decoder/decoder_norm/scale"));  // ones
}

void expect_same_abstract(const State& abstract, const State& concrete) {
  ASSERT_EQ(abstract.paths(), concrete.paths());
  for (const auto& [path, v] : concrete) {
    const Variable& a = abstract.at(path);
    EXPECT_TRUE(a.is_abstract());
    EXPECT_EQ(a.shape(), v.array().shape()) << path;
    EXPECT_EQ(a.dtype(), v.array().dtype()) << path;
    ASSERT_TRUE(a.sharding()) << path;
    EXPECT_EQ(a.sharding()->spec(), v.array().sharding().spec()) << path;
    EXPECT_TRUE(*a.sharding() == v.array().sharding()) << path;
    EXPECT_EQ(a.partitioning(), v.partitioning()) << path;
    EXPECT_EQ(a.kind(), v.kind()) << path;
  }
}

TEST(EvalShape, EqualsInitOnSeveralMeshesAndRuleSets) {
  auto rt = Runtime::host(8);
  struct Case {
    const char* mesh;
    LogicalRules rules;
    ResolveOptions options;
  };
  std::vector<Case> cases = {
      {"fsdp=8", example_rules(), {}},
      {"data=2,fsdp=2,tensor=2", example_rules(), {}},
      {"data=2,fsdp=2,tensor=2", example_rules(), {.drop_indivisible = true}},
      {"fsdp=4,tensor=2", base_yml(), {.remove_size_one_axes = true}},
      {"data=2,fsdp=2,tensor=2", base_yml(), {.remove_size_one_axes = true}},
      {"fsdp=2,fsdp_transpose=2,tensor=2", base_yml(), {}},
  };
  for (bool scan : {true, false})
    for (const Case& c : cases) {
      SCOPED_TRACE(c.mesh);
      const LogicalRules& rules = c.rules;
      Mesh mesh = Mesh::parse(c.mesh, rules.mesh_axes());
      Module model = transformer_lm(small_lm(scan));
      expect_same_abstract(eval_shape(model, mesh, rules, c.options), init(rt, model, 0, mesh, rules, c.options));
    }
}

TEST(EvalShape, BaseYmlShardsLikeMaxText) {
  // base.yml: embed -> fsdp (first of its axes), mlp -> tensor, vocab -> tensor; size-1 axes removed.
  LogicalRules rules = base_yml();
  Mesh mesh = Mesh::parse("fsdp=4,tensor=2", rules.mesh_axes());
  State s = eval_shape(transformer_lm(small_lm(true)), mesh, rules, {.remove_size_one_axes = true});
  auto spec = [&](const char* path) { return s.at(path).sharding()->spec(); };
  EXPECT_EQ(spec("decoder/layers/mlp/wi_0/kernel"), (PartitionSpec{{"fsdp"}, {}, {"tensor"}}));
  EXPECT_EQ(spec("decoder/layers/self_attention/query/kernel"), (PartitionSpec{{"fsdp"}, {}, {"tensor"}, {}}));
  EXPECT_EQ(spec("token_embedder/embedding"), (PartitionSpec{{"tensor"}, {"fsdp"}}));
  EXPECT_EQ(spec("decoder/decoder_norm/scale"), (PartitionSpec{{"tensor"}}));
}

TEST(EvalShape, AllocatesNothingAndAcceptsMeshesLargerThanTheRuntime) {
  auto rt = Runtime::host(8);
  State s = eval_shape(transformer_lm(small_lm(false)), mesh_of("data=16,fsdp=64,tensor=8"), example_rules());
  for (int64_t d = 0; d < rt.device_count(); ++d) {
    EXPECT_EQ(rt.device(d).memory_stats().peak, 0);
    EXPECT_EQ(rt.device(d).memory_stats().buffers, 0);
  }
  EXPECT_EQ(s.at("token_embedder/embedding").sharding()->mesh().device_count(), 8192);
  EXPECT_THAT([&] { init(rt, transformer_lm(small_lm(false)), 0, mesh_of("fsdp=16"), example_rules()); },
              ThrowsMessage<ValueError>(HasSubstr("device")));
}

TEST(Init, EachDevicesPeakEqualsItsPlannedBytes) {
  for (const char* mesh : {"fsdp=8", "data=2,fsdp=2,tensor=2", "tensor=8", "data=1"}) {
    SCOPED_TRACE(mesh);
    auto rt = Runtime::host(8);
    Module model = transformer_lm(small_lm(true));
    Mesh m = mesh_of(mesh);
    MemoryPlan p = plan(eval_shape(model, m, example_rules()));
    State s = init(rt, model, 3, m, example_rules());
    for (int64_t d : m.device_ids()) {
      EXPECT_EQ(rt.device(d).memory_stats().peak, p.params_by_device[static_cast<size_t>(m.position(d))]) << d;
      EXPECT_EQ(rt.device(d).memory_stats().peak, rt.device(d).memory_stats().in_use) << d;
    }
  }
}

TEST(Init, InitializerStatisticsHoldOnShardedParameters) {
  // lecun_normal over fan_in = embed: the sampled variance of a sharded kernel is 1/embed.
  auto rt = Runtime::host(8);
  TransformerConfig c{.vocab = 64, .embed = 256, .layers = 1, .heads = 4, .mlp = 512};
  State s = init(rt, transformer_lm(c), 11, mesh_of("fsdp=4,tensor=2"), example_rules());
  HostArray wh = to_host(s.at("decoder/layers/mlp/wi/kernel").array());
  std::span<const float> w = wh.values<float>();
  double sum = 0, sq = 0;
  for (float x : w) {
    sum += x;
    sq += double(x) * x;
  }
  const double n = static_cast<double>(w.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0, 5 * std::sqrt(1.0 / 256 / n));
  EXPECT_NEAR(var, 1.0 / 256, 0.05 / 256);
  HostArray eh = to_host(s.at("token_embedder/embedding").array());
  std::span<const float> e = eh.values<float>();
  double esq = 0;
  for (float x : e) esq += double(x) * x;
  EXPECT_NEAR(esq / static_cast<double>(e.size()), 1.0, 0.05);  // normal(1.0)
}

TEST(Init, StrictRulesNameTheParameterWithAnUnknownLogicalName) {
  auto rt = Runtime::host(2);
  LogicalRules rules({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}});  // no vocab, heads, ...
  Module model = transformer_lm(small_lm(true));
  EXPECT_THAT([&] { eval_shape(model, Mesh::parse("fsdp=2,tensor=1"), rules, {.strict = true}); },
              ThrowsMessage<ShardingError>(HasSubstr("token_embedder/embedding: dimension 0 ('vocab'): no rule")));
  EXPECT_NO_THROW(eval_shape(model, Mesh::parse("fsdp=2,tensor=1"), rules));  // lenient: unsharded
}

TEST(Init, ExplicitMeshAxesAndReplicatedParameters) {
  auto rt = Runtime::host(4);
  Module m("m");
  m.param({.name = "w", .shape = {8, 4}, .init = Initializer::normal(1.0),
           .partitioning = Partitioning::by_mesh_axes(PartitionSpec{{}, {"model"}})});
  m.param({.name = "b", .shape = {4}, .init = Initializer::constant(0.5)});
  m.param({.name = "bad", .shape = {4}, .partitioning = Partitioning::by_mesh_axes(PartitionSpec{{"nope"}})});
  EXPECT_THAT([&] { eval_shape(m, Mesh::parse("model=4"), LogicalRules()); },
              ThrowsMessage<ValueError>(HasSubstr("bad")));
  Module ok("m");
  ok.param(m.params()[0]);
  ok.param(m.params()[1]);
  State s = init(rt, ok, 0, Mesh::parse("model=4"), LogicalRules());
  EXPECT_EQ(s.at("w").sharding()->spec(), (PartitionSpec{{}, {"model"}}));
  EXPECT_TRUE(s.at("b").sharding()->is_fully_replicated());
  HostArray b = to_host(s.at("b").array());
  EXPECT_THAT(b.values<float>(), ::testing::Each(0.5f));
  auto specs = get_partition_spec(s);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].first, "b");
  // get_named_sharding re-resolves each variable's partitioning on another mesh.
  auto named = get_named_sharding(s, Mesh::parse("data=2,model=2"), LogicalRules());
  EXPECT_EQ(named[1].second.mesh().device_count(), 4);
  EXPECT_EQ(named[1].second.spec(), (PartitionSpec{{}, {"model"}}));
}

TEST(GetNamedSharding, RetargetsAStateToAnotherMesh) {
  Module model = transformer_lm(small_lm(true));
  LogicalRules rules = example_rules();
  State on8 = eval_shape(model, mesh_of("fsdp=8"), rules);
  Mesh other = mesh_of("data=2,fsdp=2,tensor=2");
  State direct = eval_shape(model, other, rules);
  auto retargeted = get_named_sharding(on8, other, rules);
  ASSERT_EQ(retargeted.size(), direct.size());
  for (const auto& [path, sharding] : retargeted) EXPECT_TRUE(sharding == *direct.at(path).sharding()) << path;
  State unplaced;
  unplaced.insert("w", Variable::abstract(kParam, {4}, DType::kF32));
  EXPECT_THAT([&] { get_partition_spec(unplaced); }, ThrowsMessage<ValueError>(HasSubstr("w: the variable is not placed")));
}

}  // namespace
}  // namespace tessel
