#include "tessel/sharding/logical_rules.h"

#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Json = nlohmann::json;

std::vector<std::string> axes_of(const Json& j) {
  if (j.is_null()) return {};
  if (j.is_string()) return {j.get<std::string>()};
  return j.get<std::vector<std::string>>();
}

PartitionSpec spec_of(const Json& j) {
  std::vector<DimSharding> dims;
  for (const Json& d : j) dims.push_back(axes_of(d));
  return PartitionSpec(dims);
}

LogicalAxes names_of(const Json& j) {
  LogicalAxes names;
  for (const Json& n : j) names.push_back(n.is_null() ? std::nullopt : std::optional(n.get<std::string>()));
  return names;
}

TEST(LogicalRules, SharedCasesMatchFlaxAndMaxText) {
  Json doc = Json::parse(testing::read_file(testing::testdata("logical_rules_cases.json")));
  ASSERT_GE(doc["cases"].size(), 8u);
  for (const Json& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<LogicalRule> rules;
    for (const Json& r : c["rules"]) rules.push_back({r[0].get<std::string>(), axes_of(r[1])});
    std::vector<MeshAxis> axes;
    for (auto& [name, size] : c["mesh"].items()) axes.push_back({name, size.get<int64_t>()});
    LogicalRules lr(rules);
    Mesh mesh(axes);
    LogicalAxes names = names_of(c["logical"]);
    EXPECT_EQ(lr.resolve(names, mesh), spec_of(c["expected"]));
    EXPECT_EQ(lr.logical_to_mesh_axes(names), spec_of(c["expected"]));
    EXPECT_EQ(lr.resolve(names, mesh, {.remove_size_one_axes = true}), spec_of(c["expected_remove_size_one_axes"]));
    EXPECT_EQ(lr.explain(names, mesh).spec, spec_of(c["expected"]));
  }
}

// Flax Linen's _logical_to_mesh_axes, transcribed literally (every rule, every time, sets of
// assigned axes) as an oracle for the indexed implementation.
PartitionSpec flax_reference(const std::vector<LogicalRule>& rules, const LogicalAxes& names) {
  std::vector<std::optional<std::vector<std::string>>> result(names.size());
  for (const LogicalRule& rule : rules) {
    auto it = std::find(names.begin(), names.end(), std::optional(rule.logical));
    if (it == names.end()) continue;
    size_t pos = static_cast<size_t>(it - names.begin());
    std::set<std::string> existing;
    for (const auto& r : result)
      if (r) existing.insert(r->begin(), r->end());
    bool free = std::none_of(rule.mesh_axes.begin(), rule.mesh_axes.end(),
                             [&](const std::string& a) { return existing.count(a) > 0; });
    if (free && !result[pos]) result[pos] = rule.mesh_axes;
  }
  std::vector<DimSharding> dims;
  for (const auto& r : result) dims.push_back(r.value_or(DimSharding{}));
  return PartitionSpec(dims);
}

TEST(LogicalRules, PropertyMatchesLiteralFlaxOnRandomRules) {
  std::mt19937 rng(99);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::string> logical{"batch", "embed", "mlp", "heads", "kv", "vocab", "layers"};
  const std::vector<std::string> mesh_axes{"data", "fsdp", "tensor", "stage"};
  Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2,stage=1");
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<LogicalRule> rules;
    for (int r = 0, n = pick(0, 10); r < n; ++r) {
      std::vector<std::string> axes = mesh_axes;
      std::shuffle(axes.begin(), axes.end(), rng);
      axes.resize(static_cast<size_t>(pick(0, 3)));
      rules.push_back({logical[static_cast<size_t>(pick(0, 6))], axes});
    }
    std::vector<std::string> pool = logical;
    std::shuffle(pool.begin(), pool.end(), rng);
    LogicalAxes names;
    for (int d = 0, rank = pick(0, 4); d < rank; ++d)
      names.push_back(pick(0, 4) == 0 ? std::nullopt : std::optional(pool[static_cast<size_t>(d)]));
    LogicalRules lr(rules);
    PartitionSpec expected = flax_reference(rules, names);
    ASSERT_EQ(lr.resolve(names, mesh), expected) << "iteration " << iter;
    ASSERT_EQ(lr.explain(names, mesh).spec, expected) << "iteration " << iter;
  }
}

TEST(LogicalRules, ScalarResolvesToEmptySpec) {
  LogicalRules rules{{"embed", {"fsdp"}}};
  EXPECT_EQ(rules.resolve({}, Mesh::parse("fsdp=4")), PartitionSpec());
  EXPECT_EQ(rules.resolve({}, Mesh::parse("fsdp=4"), {.drop_indivisible = true}, Shape{}), PartitionSpec());
}

TEST(LogicalRules, DuplicateLogicalNameIsAnError) {
  LogicalRules rules{{"embed", {"fsdp"}}};
  EXPECT_THAT([&] { rules.resolve({"embed", "mlp", "embed"}, Mesh::parse("fsdp=4"), {}, std::nullopt, "p/w"); },
              ThrowsMessage<ShardingError>(HasSubstr("p/w: logical axis 'embed' names both dimension 0 and dimension 2")));
}

TEST(LogicalRules, RuleValidation) {
  EXPECT_THAT([] { LogicalRules({{"", {"x"}}}); }, ThrowsMessage<ValueError>(HasSubstr("empty logical name")));
  EXPECT_THAT([] { LogicalRules({{"a", {"x", "x"}}}); }, ThrowsMessage<ValueError>(HasSubstr("'x' twice")));
  EXPECT_THAT([] { LogicalRules({{"a", {""}}}); }, ThrowsMessage<ValueError>(HasSubstr("empty mesh axis")));
  EXPECT_THAT([] { LogicalRules({}, {"x", "x"}); }, ThrowsMessage<ValueError>(HasSubstr("mesh_axes lists 'x' twice")));
}

TEST(LogicalRules, MissingMeshAxisIsAnErrorOnlyWhenUsed) {
  // 'activation_batch' names axes the mesh lacks; parameters that do not use it are fine.
  LogicalRules rules{{"activation_batch", {"data", "expert"}}, {"embed", {"fsdp"}}, {"mlp", {"tensor"}}};
  Mesh mesh = Mesh::parse("fsdp=4");
  EXPECT_EQ(rules.resolve({"embed"}, mesh), (PartitionSpec{{"fsdp"}}));
  EXPECT_THAT([&] { rules.resolve({"embed", "mlp"}, mesh, {}, std::nullopt, "w"); },
              ThrowsMessage<ShardingError>(AllOf(HasSubstr("w: dimension 1 ('mlp') resolves to mesh axis 'tensor'"),
                                                 HasSubstr("rule #3"), HasSubstr("Mesh(fsdp=4) has no such axis"))));
  // With size-1 removal a missing axis counts as size 1 (MaxText's mesh.shape.get(axis, 1)).
  EXPECT_EQ(rules.resolve({"embed", "mlp"}, mesh, {.remove_size_one_axes = true}), (PartitionSpec{{"fsdp"}, {}}));
}

TEST(LogicalRules, RemoveSizeOneAxesNormalizesTuples) {
  LogicalRules rules{{"embed", {"fsdp", "context", "expert"}}, {"mlp", {"stage"}}, {"heads", {"tensor", "x"}}};
  Mesh mesh = Mesh::parse("stage=1,fsdp=4,context=1,expert=1,tensor=2,x=2");
  EXPECT_EQ(rules.resolve({"embed", "mlp", "heads"}, mesh, {.remove_size_one_axes = true}),
            (PartitionSpec{{"fsdp"}, {}, {"tensor", "x"}}));
}

TEST(LogicalRules, DropIndivisibleKeepsAxesWhoseProductDivides) {
  LogicalRules rules{{"vocab", {"tensor", "fsdp"}}, {"embed", {"data"}}};
  Mesh mesh = Mesh::parse("data=3,fsdp=2,tensor=4");
  // 10: tensor (4) does not divide, fsdp (2) does.
  EXPECT_EQ(rules.resolve({"vocab", "embed"}, mesh, {.drop_indivisible = true}, Shape{10, 9}),
            (PartitionSpec{{"fsdp"}, {"data"}}));
  // 12: tensor (4) divides, then tensor*fsdp = 8 does not.
  EXPECT_EQ(rules.resolve({"vocab", "embed"}, mesh, {.drop_indivisible = true}, Shape{12, 8}),
            (PartitionSpec{{"tensor"}, {}}));
  Resolution r = rules.explain({"vocab", "embed"}, mesh, {.drop_indivisible = true}, Shape{12, 8});
  EXPECT_EQ(r.dims[0].dropped_indivisible, (std::vector<std::string>{"fsdp"}));
  EXPECT_THAT(rules.describe(r, mesh, Shape{12, 8}), HasSubstr("dropped mesh axes that do not divide 12: fsdp (size 2)"));
  EXPECT_THAT([&] { rules.resolve({"vocab"}, mesh, {.drop_indivisible = true}); },
              ThrowsMessage<ValueError>(HasSubstr("needs the array's shape")));
  EXPECT_THAT([&] { rules.resolve({"vocab"}, mesh, {}, Shape{4, 4}); },
              ThrowsMessage<ValueError>(HasSubstr("1 logical axes given for shape [4, 4] of rank 2")));
}

TEST(LogicalRules, StrictModeRejectsBlockedNamesAndNamesWithoutRules) {
  LogicalRules rules({{"embed", {"fsdp", "stage"}, 3}, {"mlp", {"fsdp"}, 4}, {"mlp", {"stage"}, 5}}, {}, "r.yml");
  Mesh mesh = Mesh::parse("fsdp=4,stage=2");
  EXPECT_EQ(rules.resolve({"embed", "mlp"}, mesh), (PartitionSpec{{"fsdp", "stage"}, {}}));
  EXPECT_THAT([&] { rules.resolve({"embed", "mlp"}, mesh, {.strict = true}, std::nullopt, "w"); },
              ThrowsMessage<ShardingError>(AllOf(
                  HasSubstr("w: dimension 1 ('mlp') ends unsharded because every rule for 'mlp' is blocked"),
                  HasSubstr("rule #2 mlp -> fsdp [r.yml:4] needs mesh axis 'fsdp', already used by dimension 0 ('embed')"),
                  HasSubstr("rule #3 mlp -> stage [r.yml:5] needs mesh axis 'stage'"))));
  EXPECT_THAT([&] { rules.resolve({"embd"}, mesh, {.strict = true}); },
              ThrowsMessage<ShardingError>(AllOf(HasSubstr("no rule maps logical axis 'embd'"),
                                                 HasSubstr("did you mean 'embed'?"))));
  // A fallback that succeeds, an explicit [] and an unnamed dimension are all fine.
  LogicalRules fallback{{"mlp", {"fsdp"}}, {"embed", {"fsdp"}}, {"embed", {"stage"}}, {"kv", {}}};
  EXPECT_EQ(fallback.resolve({"embed", "mlp", "kv", std::nullopt}, mesh, {.strict = true}),
            (PartitionSpec{{"stage"}, {"fsdp"}, {}, {}}));
}

TEST(LogicalRules, ExplainRecordsEveryTrialAndItsReason) {
  LogicalRules rules{{"mlp", {"fsdp_transpose", "tensor"}}, {"embed", {"fsdp", "fsdp_transpose"}},
                     {"embed", {"fsdp"}}, {"embed", {"data"}}};
  Mesh mesh = Mesh::parse("data=1,fsdp=4,fsdp_transpose=2,tensor=2");
  Resolution r = rules.explain({"embed", "mlp", std::nullopt, "foo"}, mesh);
  ASSERT_EQ(r.dims.size(), 4u);
  const auto& embed = r.dims[0].trials;
  ASSERT_EQ(embed.size(), 3u);
  EXPECT_EQ(embed[0].outcome, RuleTrial::Outcome::kAxisTaken);
  EXPECT_EQ(embed[0].axis, "fsdp_transpose");
  EXPECT_EQ(embed[0].holder_dim, 1u);
  EXPECT_EQ(embed[1].outcome, RuleTrial::Outcome::kApplied);
  EXPECT_EQ(embed[2].outcome, RuleTrial::Outcome::kDimensionAssigned);
  EXPECT_EQ(embed[2].holder_rule, 2u);
  EXPECT_EQ(r.dims[1].applied_rule, 0u);
  EXPECT_EQ(r.spec, (PartitionSpec{{"fsdp"}, {"fsdp_transpose", "tensor"}, {}, {}}));
  std::string text = rules.describe(r, mesh);
  EXPECT_THAT(text, HasSubstr("rule #2 embed -> (fsdp, fsdp_transpose): skipped, mesh axis 'fsdp_transpose' is already used by dim 1 'mlp' (rule #1)"));
  EXPECT_THAT(text, HasSubstr("rule #3 embed -> fsdp: applied"));
  EXPECT_THAT(text, HasSubstr("rule #4 embed -> data: skipped, dim 0 was already assigned by rule #3"));
  EXPECT_THAT(text, HasSubstr("dim 2 (no name)\n    no logical name: unsharded"));
  EXPECT_THAT(text, HasSubstr("no rule for 'foo': unsharded"));
  EXPECT_THAT(text, HasSubstr("spec: PartitionSpec('fsdp', ('fsdp_transpose', 'tensor'), None, None)"));
}

}  // namespace
}  // namespace tessel
