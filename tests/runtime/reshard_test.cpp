#include "tessel/runtime/reshard.h"

#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/device.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// The lower bound, computed from boxes alone: every target byte a device does not already hold
// in its source shard must cross from another device.
int64_t lower_bound_received(const NamedSharding& src, const NamedSharding& dst, const Shape& shape,
                             int64_t device, size_t item) {
  Box t = dst.device_box(device, shape);
  int64_t held = src.mesh().contains(device) ? t.intersect(src.device_box(device, shape)).volume() : 0;
  return (t.volume() - held) * static_cast<int64_t>(item);
}

std::vector<int64_t> received_counters(const Runtime& rt) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < rt.device_count(); ++d) out.push_back(rt.device(d).memory_stats().bytes_received);
  return out;
}

TEST(Reshard, RandomShardingsRoundTripBitExactWithMinimalTraffic) {
  std::mt19937 rng(11);
  auto rt = Runtime::host(8);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kI64, DType::kU8, DType::kBool, DType::kF64};
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    Shape shape = testing::random_shape(rng);
    DType dtype = dtypes[trial % 6];
    Mesh mesh = testing::random_mesh(rng);
    NamedSharding src(mesh, testing::random_spec(rng, mesh, shape.rank()));
    // Half the targets live on another mesh over the same devices.
    Mesh target_mesh = trial % 2 ? testing::random_mesh_over(rng, mesh) : mesh;
    NamedSharding dst(target_mesh, testing::random_spec(rng, target_mesh, shape.rank()));
    SCOPED_TRACE(src.to_string() + " -> " + dst.to_string() + " " + shape.to_string());

    HostArray host = testing::iota(shape, dtype);
    Array x = device_put(rt, host, src);
    testing::expect_accounts_match(rt, {&x});
    ReshardPlan plan = plan_reshard(x, dst);
    auto before = received_counters(rt);
    Array y = reshard(x, dst);
    auto after = received_counters(rt);
    testing::expect_accounts_match(rt, {&x, &y});
    ASSERT_EQ(to_host(y), host);
    EXPECT_EQ(y.sharding(), dst);

    int64_t total = 0;
    for (int64_t d : target_mesh.device_ids()) {
      int64_t lb = lower_bound_received(src, dst, shape, d, item_size(dtype));
      EXPECT_EQ(plan.device(d).bytes_received, lb) << "device " << d;
      EXPECT_EQ(after[static_cast<size_t>(d)] - before[static_cast<size_t>(d)], lb) << "device " << d;
      EXPECT_EQ(plan.device(d).bytes_local + lb,
                dst.device_box(d, shape).volume() * static_cast<int64_t>(item_size(dtype)));
      total += lb;
    }
    EXPECT_EQ(plan.bytes_received(), total);
    // Every transfer reads from a device that holds the region in the source.
    for (const Transfer& t : plan.transfers())
      EXPECT_TRUE(src.device_box(t.src_device, shape).contains(t.region));
  }
  EXPECT_EQ(rt.device(0).memory_stats().in_use, 0);
}

TEST(Reshard, RowsToColumnsPlan) {
  auto rt = Runtime::host(4);
  Mesh mesh = Mesh::parse("fsdp=4");
  Array x = device_put(rt, testing::iota(Shape{8, 8}, DType::kF32), NamedSharding(mesh, {{"fsdp"}}));
  NamedSharding cols(mesh, {{}, {"fsdp"}});
  ReshardPlan plan = plan_reshard(x, cols);
  // Each device keeps its 2x2 corner and receives 3 pieces of 2x2 floats.
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(plan.device(d).bytes_local, 16);
    EXPECT_EQ(plan.device(d).bytes_received, 48);
    EXPECT_EQ(plan.device(d).bytes_sent, 48);
    EXPECT_EQ(plan.device(d).received_from.size(), 3u);
  }
  EXPECT_EQ(plan.bytes_received(), 192);
  std::string text = plan.to_string();
  EXPECT_THAT(text, HasSubstr("reshard f32[8,8]: PartitionSpec('fsdp') on Mesh(fsdp=4) -> "
                              "PartitionSpec(None, 'fsdp') on Mesh(fsdp=4)"));
  EXPECT_THAT(text, HasSubstr("total: 64 B already in place, 192 B copied across devices"));
  EXPECT_EQ(to_host(reshard(x, cols)), testing::iota(Shape{8, 8}, DType::kF32));
}

TEST(Reshard, PrefersTheLocalReplicaAndSpreadsTheSenders) {
  auto rt = Runtime::host(8);
  Mesh mesh = Mesh::parse("data=2,fsdp=4");
  Array x = device_put(rt, testing::iota(Shape{8, 8}), NamedSharding(mesh, {{"fsdp"}}));
  // Replicated -> sharded over both axes: all local.
  Array r = device_put(rt, testing::iota(Shape{8, 8}), NamedSharding(mesh, {}));
  ReshardPlan down = plan_reshard(r, NamedSharding(mesh, {{"data", "fsdp"}}));
  EXPECT_EQ(down.bytes_received(), 0);
  // Sharded on fsdp -> replicated: each block has two replicas; senders share the load.
  ReshardPlan up = plan_reshard(x, NamedSharding(mesh, {}));
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_EQ(up.device(d).bytes_received, 3 * 64);
    EXPECT_EQ(up.device(d).bytes_sent, 3 * 64) << d;
  }
}

TEST(Reshard, EqualShardingSharesEveryBuffer) {
  auto rt = Runtime::host(4);
  NamedSharding s(Mesh::parse("a=2,b=2"), {{"a"}});
  Array x = device_put(rt, testing::iota(Shape{4, 4}), s);
  auto before = rt.device(1).memory_stats().in_use;
  // Equal up to trailing unsharded dimensions.
  Array y = reshard(x, NamedSharding(Mesh::parse("a=2,b=2"), {{"a"}, {}}));
  EXPECT_TRUE(y.shard(1).buffer.shares_with(x.shard(1).buffer));
  EXPECT_EQ(rt.device(1).memory_stats().in_use, before);
}

TEST(Reshard, OntoASubsetOfDevices) {
  auto rt = Runtime::host(8);
  Array x = device_put(rt, testing::iota(Shape{16}), NamedSharding(Mesh::parse("a=8"), {{"a"}}));
  Mesh two(std::vector<MeshAxis>{{"b", 2}}, {6, 7});
  Array y = reshard(x, NamedSharding(two, {{"b"}}));
  EXPECT_EQ(y.shards().size(), 2u);
  EXPECT_EQ(y.shard(7).box, Box({8}, {16}));
  EXPECT_EQ(to_host(y), testing::iota(Shape{16}));
  ReshardPlan plan = plan_reshard(x, NamedSharding(two, {{"b"}}));
  EXPECT_EQ(plan.device(7).bytes_local, 8);      // its own block [14:16]
  EXPECT_EQ(plan.device(7).bytes_received, 24);  // [8:14] from devices 4, 5, 6
  EXPECT_EQ(plan.device(0).bytes_sent, 8);
  EXPECT_THAT([&] { (void)plan.device(9); }, ThrowsMessage<ValueError>(HasSubstr("device 9 takes no part")));
}

TEST(Reshard, RejectsTargetsThatDoNotFit) {
  auto rt = Runtime::host(4);
  Array x = device_put(rt, testing::iota(Shape{4}), NamedSharding(Mesh::parse("a=4"), {{"a"}}));
  EXPECT_THAT([&] { reshard(x, NamedSharding(Mesh::parse("a=4"), {{}, {"a"}})); },
              ThrowsMessage<ValueError>(HasSubstr("has 2 entries but the array shape [4] has rank 1")));
  EXPECT_THAT([&] { reshard(x, NamedSharding(Mesh::parse("a=16"), {{"a"}})); },
              ThrowsMessage<ValueError>(HasSubstr("uses device 4")));
}

TEST(Reshard, OutOfMemoryDuringReshardLeavesNoTrace) {
  RuntimeOptions options;
  options.devices = 4;
  options.memory_limit = 70;
  auto rt = Runtime::host(options);
  Mesh mesh = Mesh::parse("a=4");
  Array x = device_put(rt, testing::iota(Shape{16}), NamedSharding(mesh, {{"a"}}), "x");
  EXPECT_THAT([&] { reshard(x, NamedSharding(mesh, {})); },
              ThrowsMessage<OutOfMemoryError>(HasSubstr("cannot allocate 64 B for x (limit 70 B, in use 16 B by x 16 B")));
  testing::expect_accounts_match(rt, {&x});
}

}  // namespace
}  // namespace tessel
