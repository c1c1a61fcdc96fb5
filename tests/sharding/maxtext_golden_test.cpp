// MaxText's golden dumps (qwen3-0.6b, 16 chips, base.yml rules) reproduced through the library.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/sharding/spec_io.h"

namespace tessel {
namespace {

const char* kDump = "maxtext/qwen3-0.6b_tpu7x-16_default/";

class MaxTextGolden : public ::testing::Test {
 protected:
  LogicalRules rules = load_rules(testing::testdata("maxtext/base.yml"));
  std::vector<LogicalEntry> logical = load_logical_dump(testing::testdata(std::string(kDump) + "logical_shardings.json"));
  std::vector<NamedDumpEntry> golden =
      parse_named_dump(testing::read_file(testing::testdata(std::string(kDump) + "named_shardings.json")));
};

TEST_F(MaxTextGolden, EveryEntryMatchesFlax) {
  ASSERT_EQ(logical.size(), golden.size());
  ASSERT_EQ(logical.size(), 42u);
  Mesh mesh(golden[0].mesh);
  // The short --mesh form, completed from base.yml's mesh_axes, is the same mesh.
  EXPECT_EQ(Mesh::parse("fsdp=16", rules.mesh_axes()), mesh);
  for (size_t i = 0; i < logical.size(); ++i) {
    SCOPED_TRACE(logical[i].path);
    ASSERT_EQ(logical[i].path, golden[i].entry.path);
    EXPECT_EQ(golden[i].mesh, mesh);
    EXPECT_EQ(logical[i].shape, golden[i].entry.shape);
    PartitionSpec spec = rules.resolve(logical[i].axes, mesh, {}, logical[i].shape, logical[i].path);
    EXPECT_EQ(spec, golden[i].entry.spec);
    // Fallbacks that succeed are not conflicts: strict mode accepts the whole state.
    EXPECT_EQ(rules.resolve(logical[i].axes, mesh, {.strict = true}, logical[i].shape), spec);
    EXPECT_EQ(rules.explain(logical[i].axes, mesh, {}, logical[i].shape).spec, spec);
  }
}

TEST_F(MaxTextGolden, SizeOneRemovalFiltersTheGoldenSpecs) {
  // Expected value derived from the golden spec alone: keep the axes of size > 1.
  Mesh mesh(golden[0].mesh);
  for (size_t i = 0; i < logical.size(); ++i) {
    SCOPED_TRACE(logical[i].path);
    std::vector<DimSharding> expected;
    for (const DimSharding& axes : golden[i].entry.spec.dims()) {
      DimSharding kept;
      for (const auto& a : axes)
        if (mesh.axis_size(a) > 1) kept.push_back(a);
      expected.push_back(kept);
    }
    PartitionSpec spec = rules.resolve(logical[i].axes, mesh, {.remove_size_one_axes = true}, logical[i].shape);
    EXPECT_EQ(spec, PartitionSpec(expected));
    // On this mesh every parameter ends sharded over fsdp alone, or replicated.
    for (const DimSharding& axes : spec.dims()) EXPECT_TRUE(axes.empty() || axes == DimSharding{"fsdp"});
  }
}

TEST_F(MaxTextGolden, EmbeddingBoxesOnTheGoldenMesh) {
  Mesh mesh(golden[0].mesh);
  const NamedDumpEntry* embedding = nullptr;
  for (const auto& e : golden)
    if (e.entry.path == ".params/['params']/['token_embedder']/['embedding']") embedding = &e;
  ASSERT_NE(embedding, nullptr);
  NamedSharding s(mesh, embedding->entry.spec);
  // vocab over size-1 axes, embed over fsdp=16: 1024 / 16 = 64 columns per device.
  EXPECT_EQ(s.shard_shape(embedding->entry.shape), (Shape{151936, 64}));
  EXPECT_EQ(s.device_box(5, embedding->entry.shape), Box({0, 320}, {151936, 384}));
  EXPECT_EQ(s.distinct_shards(embedding->entry.shape).size(), 16u);
}

}  // namespace
}  // namespace tessel
