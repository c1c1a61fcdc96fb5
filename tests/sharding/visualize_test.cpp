#include "tessel/sharding/visualize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessel {
namespace {

using ::testing::HasSubstr;

TEST(Visualize, OneDimensionalIsOneRow) {
  std::string text = visualize(NamedSharding(Mesh::parse("fsdp=4"), {{"fsdp"}}), Shape{8});
  EXPECT_EQ(text,
            "shape [8] PartitionSpec('fsdp') on Mesh(fsdp=4): 4 distinct shards, 1 copy each\n"
            "  0:2   2:4   4:6   6:8  \n"
            "┌─────┬─────┬─────┬─────┐\n"
            "│  0  │  1  │  2  │  3  │\n"
            "└─────┴─────┴─────┴─────┘\n");
}

TEST(Visualize, TwoDimensionalGridWithReplicas) {
  std::string text = visualize(NamedSharding(Mesh::parse("data=2,fsdp=2"), {{"fsdp"}, {}}), Shape{4, 6});
  EXPECT_EQ(text,
            "shape [4, 6] PartitionSpec('fsdp', None) on Mesh(data=2, fsdp=2): 2 distinct shards, 2 copies each\n"
            "      0:6  \n"
            "    ┌─────┐\n"
            "0:2 │ 0,2 │\n"
            "    ├─────┤\n"
            "2:4 │ 1,3 │\n"
            "    └─────┘\n");
}

TEST(Visualize, FullyReplicatedIsOneCell) {
  std::string text = visualize(NamedSharding(Mesh::parse("data=4"), PartitionSpec()), Shape{3});
  EXPECT_THAT(text, HasSubstr("1 distinct shard, 4 copies each"));
  EXPECT_THAT(text, HasSubstr("  0:3  \n┌─────┐\n│ 0-3 │\n└─────┘\n"));
}

TEST(Visualize, HigherRankDrawsOneGridPerOuterBlock) {
  NamedSharding s(Mesh::parse("a=2,b=2,c=2"), {{"a"}, {}, {"b"}, {"c"}});
  std::string text = visualize(s, Shape{4, 3, 4, 2});
  EXPECT_THAT(text, HasSubstr("dim 0 = 0:2\n"));
  EXPECT_THAT(text, HasSubstr("dim 0 = 2:4\n"));
  EXPECT_THAT(text, HasSubstr("0:2 │  0  │  1  │"));
  EXPECT_THAT(text, HasSubstr("2:4 │  6  │  7  │"));
}

TEST(Visualize, EmptyTailBlocksKeepTheirOwnCells) {
  std::string text = visualize(NamedSharding(Mesh::parse("x=4"), {{"x"}}), Shape{2});
  EXPECT_THAT(text, HasSubstr("│  0  │  1  │  2  │  3  │"));
  EXPECT_THAT(text, HasSubstr("2:2   2:2"));
}

}  // namespace
}  // namespace tessel
