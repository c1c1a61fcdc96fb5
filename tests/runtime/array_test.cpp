#include "tessel/runtime/array.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/inspect.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Array, DevicePutGivesEachDeviceExactlyItsBox) {
  auto rt = Runtime::host(8);
  NamedSharding s(Mesh::parse("data=2,fsdp=4"), {{"fsdp"}, {"data"}});
  HostArray host = testing::iota(Shape{8, 4});
  Array x = device_put(rt, host, s);
  EXPECT_EQ(x.shape(), (Shape{8, 4}));
  EXPECT_EQ(x.dtype(), DType::kI32);
  EXPECT_EQ(x.nbytes(), 128);
  ASSERT_EQ(x.shards().size(), 8u);
  // Device 5: data=1, fsdp=1 -> rows 2:4, columns 2:4.
  const Shard& s5 = x.shard(5);
  EXPECT_EQ(s5.box, Box({2, 2}, {4, 4}));
  EXPECT_EQ(s5.buffer.device(), 5);
  auto v = s5.buffer.as<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.end()), (std::vector<int32_t>{11, 12, 15, 16}));
  EXPECT_EQ(to_host(x), host);
  EXPECT_TRUE(x.is_fully_addressable());
  EXPECT_EQ(x.addressable_shards().size(), 8u);
}

// In one process the replicas of a block are stored once, yet each device is charged for its
// copy as a real device would be: limits and statistics do not depend on the sharing.
TEST(Array, ReplicasShareTheirBytesAndEachDeviceIsCharged) {
  auto rt = Runtime::host(4);
  NamedSharding s(Mesh::parse("data=2,fsdp=2"), {{"fsdp"}});
  std::optional<Array> x = device_put(rt, testing::iota(Shape{4}), s);
  EXPECT_EQ(x->shard(0).box, x->shard(2).box);
  EXPECT_EQ(x->shard(2).replica_id, 1);
  EXPECT_EQ(x->shard(0).buffer.data(), x->shard(2).buffer.data());
  EXPECT_NE(x->shard(0).buffer.data(), x->shard(1).buffer.data());
  EXPECT_FALSE(x->shard(0).buffer.shares_with(x->shard(2).buffer));
  EXPECT_EQ(x->shard(2).buffer.device(), 2);
  EXPECT_EQ(x->shard(2).buffer.size(), 8);
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(rt.device(d).memory_stats().in_use, 8) << d;
    EXPECT_EQ(rt.device(d).memory_stats().buffers, 1) << d;
  }
  EXPECT_EQ(to_host(*x), testing::iota(Shape{4}));
  // The first holder may go before its replica: the bytes stay while any device holds them.
  Shard kept = x->shard(2);
  kept.replica_id = 0;
  Array replica_only(rt, Shape{2}, x->dtype(), NamedSharding(Mesh({{"one", 1}}, {2}), {}), {kept});
  x.reset();
  for (int64_t d : {0, 1, 3}) EXPECT_EQ(rt.device(d).memory_stats().in_use, 0) << d;
  EXPECT_EQ(rt.device(2).memory_stats().in_use, 8);
  EXPECT_EQ(to_host(replica_only), testing::iota(Shape{2}));  // the first half of iota(4)
  testing::expect_accounts_match(rt, {&replica_only});
}

// A replica charged past its device's limit fails like any allocation and leaves no trace.
TEST(Array, AReplicaPastItsDevicesLimitIsOutOfMemory) {
  auto rt = Runtime::host(4);
  rt.device(3).set_memory_limit(100);
  NamedSharding s(Mesh::parse("data=2,fsdp=2"), {{"fsdp"}});
  EXPECT_THAT([&] { device_put(rt, testing::iota(Shape{64}), s, "w"); },
              ThrowsMessage<OutOfMemoryError>(HasSubstr("device 3: out of memory: cannot allocate 128 B for w")));
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(rt.device(d).memory_stats().in_use, 0) << d;
    EXPECT_EQ(rt.device(d).memory_stats().buffers, 0) << d;
  }
}

TEST(Array, CallbackRunsOncePerDistinctBlock) {
  auto rt = Runtime::host(8);
  NamedSharding s(Mesh::parse("data=2,fsdp=4"), {{"fsdp"}});
  std::mutex mu;
  std::vector<Box> seen;
  Array x = make_array_from_callback(rt, Shape{8, 3}, DType::kI32, s, [&](const Box& box, std::span<std::byte> out) {
    {
      std::lock_guard lock(mu);
      seen.push_back(box);
    }
    ASSERT_EQ(out.size(), static_cast<size_t>(box.volume()) * 4);
    auto* p = reinterpret_cast<int32_t*>(out.data());
    for (int64_t r = box.start(0); r < box.stop(0); ++r)
      for (int64_t c = 0; c < 3; ++c) *p++ = static_cast<int32_t>(r * 3 + c + 1);
  });
  EXPECT_EQ(seen.size(), 4u);  // 4 blocks, each on 2 devices
  EXPECT_EQ(to_host(x), testing::iota(Shape{8, 3}));
  for (int64_t d = 0; d < 8; ++d)
    EXPECT_EQ(x.shard(d).buffer.as<int32_t>()[0], 1 + 6 * (d % 4)) << d;
}

TEST(Array, DeviceCallbackLetsReplicasDiffer) {
  auto rt = Runtime::host(2);
  NamedSharding s(Mesh::parse("d=2"), {});
  Array x = make_array_from_device_callback(rt, Shape{2}, DType::kI32, s,
                                            [](int64_t device, const Box&, std::span<std::byte> out) {
                                              auto* p = reinterpret_cast<int32_t*>(out.data());
                                              p[0] = p[1] = static_cast<int32_t>(device + 10);
                                            });
  EXPECT_EQ(x.shard(0).buffer.as<int32_t>()[0], 10);
  EXPECT_EQ(x.shard(1).buffer.as<int32_t>()[1], 11);
}

TEST(Array, ScalarsAndEmptyArrays) {
  auto rt = Runtime::host(4);
  NamedSharding s(Mesh::parse("a=4"), {});
  HostArray scalar = HostArray::from<float>(Shape{}, {2.5f});
  Array x = device_put(rt, scalar, s);
  EXPECT_EQ(x.shard(3).buffer.as<float>()[0], 2.5f);
  EXPECT_EQ(to_host(x), scalar);
  NamedSharding rows(Mesh::parse("a=4"), {{"a"}});
  Array e = device_put(rt, HostArray(Shape{0, 5}, DType::kF32), rows);
  EXPECT_EQ(e.shard(2).buffer.size(), 0);
  EXPECT_EQ(to_host(e).nbytes(), 0);
  // Uneven: 5 rows over 4 devices are blocks of 2, 2, 1, 0.
  Array u = device_put(rt, testing::iota(Shape{5}), rows);
  EXPECT_EQ(u.shard(2).box, Box({4}, {5}));
  EXPECT_EQ(u.shard(3).box, Box({5}, {5}));
  EXPECT_EQ(to_host(u), testing::iota(Shape{5}));
}

TEST(Array, BadInputsNameWhatIsWrong) {
  auto rt = Runtime::host(4);
  EXPECT_THAT([&] { device_put(rt, testing::iota(Shape{8}), NamedSharding(Mesh::parse("a=8"), {{"a"}})); },
              ThrowsMessage<ValueError>(HasSubstr("uses device 4, but the runtime has devices 0 to 3")));
  EXPECT_THAT([&] { device_put(rt, testing::iota(Shape{8}), NamedSharding(Mesh::parse("a=4"), {{"a"}, {}})); },
              ThrowsMessage<ValueError>(HasSubstr("has 2 entries but the array shape [8] has rank 1")));
  Array x = device_put(rt, testing::iota(Shape{8}), NamedSharding(Mesh::parse("a=4"), {{"a"}}));
  EXPECT_THAT([&] { (void)x.shard(7); }, ThrowsMessage<ValueError>(HasSubstr("device 7 holds no shard of i32[8]")));
  // The public constructor checks the shards against the sharding.
  std::vector<Shard> shards(x.shards().begin(), x.shards().end());
  std::swap(shards[0].buffer, shards[1].buffer);
  EXPECT_THAT([&] { Array(rt, Shape{8}, DType::kI32, x.sharding(), shards); },
              ThrowsMessage<ValueError>(HasSubstr("shard of device 0 has a buffer on device 1")));
  shards.assign(x.shards().begin(), x.shards().end());
  shards[2].box = Box({0}, {2});
  EXPECT_THAT([&] { Array(rt, Shape{8}, DType::kI32, x.sharding(), shards); },
              ThrowsMessage<ValueError>(HasSubstr("shard of device 2 has box [0:2], but the sharding gives [4:6]")));
  shards.assign(x.shards().begin(), x.shards().end());
  EXPECT_THAT([&] { Array(rt, Shape{8}, DType::kI64, x.sharding(), shards); },
              ThrowsMessage<ValueError>(HasSubstr("has 8 bytes, but box [0:2] of int64 needs 16")));
  shards[1].buffer = Buffer();
  EXPECT_THAT([&] { Array(rt, Shape{8}, DType::kI32, x.sharding(), shards); },
              ThrowsMessage<ValueError>(HasSubstr("shard of device 1 has no buffer")));
  shards.pop_back();
  EXPECT_THAT([&] { Array(rt, Shape{8}, DType::kI32, x.sharding(), shards); },
              ThrowsMessage<ValueError>(HasSubstr("has 4 devices but 3 shards were given")));
}

TEST(Array, VisualizeNamesTypeLabelAndLayout) {
  auto rt = Runtime::host(4);
  Array x = device_put(rt, testing::iota(Shape{4, 4}, DType::kF32),
                       NamedSharding(Mesh::parse("a=2,b=2"), {{"a"}, {"b"}}), "params/w");
  std::string text = visualize(x);
  EXPECT_THAT(text, HasSubstr("f32[4,4] params/w: NamedSharding(mesh=Mesh(a=2, b=2)"));
  EXPECT_THAT(text, HasSubstr("3"));
}

TEST(Array, CopiesShareBuffersAndFreeOnce) {
  auto rt = Runtime::host(2);
  NamedSharding s(Mesh::parse("d=2"), {{"d"}});
  std::optional<Array> a = device_put(rt, testing::iota(Shape{16}), s);
  Array b = *a;
  EXPECT_TRUE(b.shard(1).buffer.shares_with(a->shard(1).buffer));
  a.reset();
  EXPECT_EQ(rt.device(1).memory_stats().in_use, 32);
  testing::expect_accounts_match(rt, {&b});
}

}  // namespace
}  // namespace tessel
