#include "tessel/sharding/named_sharding.h"

#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::vector<Box> boxes(const NamedSharding& s, const Shape& shape) {
  std::vector<Box> out;
  for (auto& [id, box] : s.devices_indices_map(shape)) out.push_back(box);
  return out;
}

TEST(NamedSharding, RankZeroIsReplicatedEverywhere) {
  NamedSharding s(Mesh::parse("data=2,fsdp=2"), PartitionSpec());
  for (const Box& b : boxes(s, Shape{})) EXPECT_EQ(b, Box());
  EXPECT_TRUE(s.is_fully_replicated());
  EXPECT_EQ(s.distinct_shards(Shape{}).size(), 1u);
  EXPECT_EQ(s.replica_id(3), 3);
}

TEST(NamedSharding, RankOneSplitsIntoContiguousBlocks) {
  NamedSharding s(Mesh::parse("fsdp=4"), {{"fsdp"}});
  EXPECT_EQ(boxes(s, Shape{8}),
            (std::vector<Box>{Box({0}, {2}), Box({2}, {4}), Box({4}, {6}), Box({6}, {8})}));
  EXPECT_EQ(s.shard_shape(Shape{8}), (Shape{2}));
}

TEST(NamedSharding, RankTwoOnTwoAxes) {
  // Mesh data=2, fsdp=4: device 5 has data=1, fsdp=1.
  NamedSharding s(Mesh::parse("data=2,fsdp=4"), {{"fsdp"}, {"data"}});
  EXPECT_EQ(s.device_box(5, Shape{16, 8}), Box({4, 4}, {8, 8}));
  EXPECT_EQ(s.device_box(0, Shape{16, 8}), Box({0, 0}, {4, 4}));
  EXPECT_EQ(s.device_box(3, Shape{16, 8}), Box({12, 0}, {16, 4}));
  EXPECT_EQ(s.shard_shape(Shape{16, 8}), (Shape{4, 4}));
  EXPECT_FALSE(s.is_fully_replicated());
}

TEST(NamedSharding, TupleOfAxesHasTheFirstAxisMajor) {
  Mesh mesh = Mesh::parse("data=2,fsdp=2");
  // ('data', 'fsdp'): block = data * 2 + fsdp, which is the device order.
  NamedSharding major(mesh, {{"data", "fsdp"}});
  EXPECT_EQ(boxes(major, Shape{8}),
            (std::vector<Box>{Box({0}, {2}), Box({2}, {4}), Box({4}, {6}), Box({6}, {8})}));
  // ('fsdp', 'data'): block = fsdp * 2 + data, so devices 1 and 2 swap blocks.
  NamedSharding minor(mesh, {{"fsdp", "data"}});
  EXPECT_EQ(boxes(minor, Shape{8}),
            (std::vector<Box>{Box({0}, {2}), Box({4}, {6}), Box({2}, {4}), Box({6}, {8})}));
}

TEST(NamedSharding, RankThreeAndFourWithReplication) {
  Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2");
  NamedSharding s3(mesh, {{}, {"tensor"}, {"fsdp"}});
  // Device 6: data=1, fsdp=1, tensor=0. Replicated over data.
  EXPECT_EQ(s3.device_box(6, Shape{3, 4, 6}), Box({0, 0, 3}, {3, 2, 6}));
  EXPECT_EQ(s3.device_box(2, Shape{3, 4, 6}), s3.device_box(6, Shape{3, 4, 6}));
  EXPECT_EQ(s3.replica_id(2), 0);
  EXPECT_EQ(s3.replica_id(6), 1);
  EXPECT_EQ(s3.distinct_shards(Shape{3, 4, 6}).size(), 4u);

  NamedSharding s4(mesh, {{"data"}, {}, {"fsdp", "tensor"}, {}});
  // Device 7: data=1, fsdp=1, tensor=1 -> dim 0 block 1, dim 2 block 3.
  EXPECT_EQ(s4.device_box(7, Shape{4, 2, 8, 5}), Box({2, 0, 6, 0}, {4, 2, 8, 5}));
  EXPECT_EQ(s4.shard_shape(Shape{4, 2, 8, 5}), (Shape{2, 2, 2, 5}));
}

TEST(NamedSharding, UnevenSizesUseCeilBlocksWithShortOrEmptyTails) {
  NamedSharding s(Mesh::parse("fsdp=4"), {{"fsdp"}});
  EXPECT_EQ(boxes(s, Shape{10}),
            (std::vector<Box>{Box({0}, {3}), Box({3}, {6}), Box({6}, {9}), Box({9}, {10})}));
  EXPECT_EQ(boxes(s, Shape{2}),
            (std::vector<Box>{Box({0}, {1}), Box({1}, {2}), Box({2}, {2}), Box({2}, {2})}));
  EXPECT_EQ(s.shard_shape(Shape{10}), (Shape{3}));
  EXPECT_THAT([&] { s.check_divisible(Shape{10}, "w"); },
              ThrowsMessage<ValueError>(HasSubstr("w: dimension 0 of shape [10] has size 10, not divisible by the 4 blocks")));
  s.check_divisible(Shape{12});
}

TEST(NamedSharding, SizeOneAxesReplicate) {
  NamedSharding s(Mesh::parse("stage=1,fsdp=4"), {{"stage"}, {}});
  EXPECT_TRUE(s.is_fully_replicated());
  EXPECT_EQ(s.distinct_shards(Shape{8, 2}).size(), 1u);
  EXPECT_EQ(s.distinct_shards(Shape{8, 2})[0].devices, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(NamedSharding, ZeroSizedDimensionsMakeTheirAxesReplicasAsInJax) {
  // JAX numbers the devices holding equal blocks; every block of a 0-sized dimension is empty.
  NamedSharding s(Mesh::parse("x=2,y=2"), {{"x"}, {"y"}});
  EXPECT_EQ(s.replica_id(3), 0);
  EXPECT_EQ(s.replica_id(3, Shape{4, 6}), 0);
  EXPECT_EQ(s.replica_id(1, Shape{0, 6}), 0);
  EXPECT_EQ(s.replica_id(2, Shape{0, 6}), 1);  // x=1, y=0: same block as device 0
  EXPECT_EQ(s.replica_id(3, Shape{0, 6}), 1);
  EXPECT_EQ(s.replica_id(3, Shape{0, 0}), 3);
  EXPECT_EQ(s.replica_id(3, Shape{4, 0}), 1);
}

TEST(NamedSharding, ErrorsNameSpecShapeAndAxis) {
  Mesh mesh = Mesh::parse("fsdp=4");
  EXPECT_THAT([&] { NamedSharding(mesh, {{"tensor"}}); },
              ThrowsMessage<ValueError>(HasSubstr("mesh axis 'tensor'")));
  NamedSharding s(mesh, {{"fsdp"}, {}});
  EXPECT_THAT([&] { s.device_box(0, Shape{8}); },
              ThrowsMessage<ValueError>(HasSubstr("2 entries but the array shape [8] has rank 1")));
  EXPECT_THAT([&] { s.device_box(9, Shape{8, 1}); }, ThrowsMessage<ValueError>(HasSubstr("device 9")));
}

TEST(NamedSharding, EqualityIgnoresTrailingUnshardedDimensions) {
  Mesh mesh = Mesh::parse("fsdp=4");
  EXPECT_EQ(NamedSharding(mesh, {{"fsdp"}}), NamedSharding(mesh, {{"fsdp"}, {}}));
  EXPECT_FALSE(NamedSharding(mesh, {{"fsdp"}}) == NamedSharding(mesh, {{}, {"fsdp"}}));
  EXPECT_FALSE(NamedSharding(mesh, {{"fsdp"}}) == NamedSharding(Mesh::parse("fsdp=4,x=1"), {{"fsdp"}}));
}

// Random meshes (1 to 8 devices), random specs and shapes of rank 0 to 4 with uneven sizes: the
// distinct boxes tile the array exactly, every device's box fits the shard shape (equal to it
// when the dimension divides), and replica ids count copies in mesh order.
TEST(NamedSharding, PropertyDistinctBoxesTileTheArray) {
  std::mt19937 rng(1234);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::string> names{"a", "b", "c"};
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<MeshAxis> axes;
    int64_t devices = 1;
    for (int i = 0, n = pick(1, 3); i < n; ++i) {
      int64_t size = pick(1, 3);
      if (devices * size > 8) size = 1;
      devices *= size;
      axes.push_back({names[static_cast<size_t>(i)], size});
    }
    Mesh mesh(axes);
    size_t rank = static_cast<size_t>(pick(0, 4));
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) d = pick(0, 11);
    Shape shape(dims);
    std::vector<DimSharding> spec(rank);
    std::vector<std::string> free = mesh.axis_names();
    std::shuffle(free.begin(), free.end(), rng);
    for (const std::string& a : free)
      if (rank > 0 && pick(0, 2) > 0) spec[static_cast<size_t>(pick(0, static_cast<int>(rank) - 1))].push_back(a);
    NamedSharding s(mesh, PartitionSpec(spec));
    SCOPED_TRACE(s.to_string() + " shape " + shape.to_string());

    std::vector<ShardPlacement> shards = s.distinct_shards(shape);
    int64_t covered = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      covered += shards[i].box.volume();
      for (size_t j = 0; j < i; ++j) EXPECT_EQ(shards[i].box.intersect(shards[j].box).volume(), 0);
      for (size_t r = 0; r < shards[i].devices.size(); ++r)
        EXPECT_EQ(s.replica_id(shards[i].devices[r]), static_cast<int64_t>(r));
    }
    EXPECT_EQ(covered, shape.num_elements());
    int64_t copies = devices / static_cast<int64_t>(shards.size());
    for (const auto& sh : shards) EXPECT_EQ(static_cast<int64_t>(sh.devices.size()), copies);

    Shape block = s.shard_shape(shape);
    for (auto& [id, box] : s.devices_indices_map(shape)) {
      EXPECT_TRUE(Box::full(shape).contains(box));
      for (size_t d = 0; d < rank; ++d) {
        EXPECT_LE(box.extent(d), block[d]);
        if (shape[d] % s.num_blocks(d) == 0) EXPECT_EQ(box.extent(d), block[d]);
      }
    }
  }
}

}  // namespace
}  // namespace tessel
