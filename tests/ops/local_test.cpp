// compute_blocks_once over several layouts (ops/detail/local.h): an op's outputs of different
// shapes written together device by device, once per distinct block, and refused when their
// shardings do not split the devices alike.
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>

#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

using ops::detail::compute_blocks_once;
using ops::detail::OutputLayout;

TEST(ComputeBlocksOnce, WritesOutputsOfDifferentShapesTogetherOncePerBlock) {
  Runtime rt = Runtime::host(4);
  const Mesh mesh = Mesh::parse("x=2,y=2");
  // Both split their first dimension over x and are replicated over y.
  const std::vector<OutputLayout> layouts{{Shape{4, 6}, NamedSharding(mesh, {{"x"}})},
                                          {Shape{4, 2, 3}, NamedSharding(mesh, {{"x"}, {}, {}})}};
  std::mutex mu;
  std::set<int64_t> calls;
  const std::vector<Array> out = compute_blocks_once(
      rt, layouts, DType::kF32, [&](int64_t device, const std::vector<Box>& boxes, const std::vector<std::byte*>& outs) {
        ASSERT_EQ(boxes.size(), 2u);
        EXPECT_EQ(boxes[0].start(0), boxes[1].start(0));
        EXPECT_EQ(boxes[0].volume(), 12);
        EXPECT_EQ(boxes[1].volume(), 12);
        for (size_t i = 0; i < 2; ++i) {
          for (int64_t e = 0; e < 12; ++e) {
            const float v = static_cast<float>(100 * i + boxes[0].start(0) * 6 + e);
            std::memcpy(outs[i] + e * 4, &v, 4);
          }
        }
        std::lock_guard lock(mu);
        EXPECT_TRUE(calls.insert(device).second);
      });
  EXPECT_EQ(calls.size(), 2u);  // one call per distinct block: the y replicas share it
  ASSERT_EQ(out.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].shape(), layouts[i].shape);
    for (const Shard& shard : out[i].shards()) {
      for (int64_t e = 0; e < 12; ++e) {
        float v = 0;
        std::memcpy(&v, shard.buffer.data() + e * 4, 4);
        EXPECT_EQ(v, static_cast<float>(100 * i + shard.box.start(0) * 6 + e)) << "device " << shard.device;
      }
    }
  }
}

// An output with a dimension of size 0 has empty blocks everywhere: the others are still written.
TEST(ComputeBlocksOnce, AnEmptyOutputDoesNotStopTheOthers) {
  Runtime rt = Runtime::host(4);
  const Mesh mesh = Mesh::parse("x=2,y=2");
  const std::vector<OutputLayout> layouts{{Shape{4, 0}, NamedSharding(mesh, {{"x"}})},
                                          {Shape{4, 6}, NamedSharding(mesh, {{"x"}})}};
  std::atomic<int> calls{0};
  const std::vector<Array> out = compute_blocks_once(
      rt, layouts, DType::kF32, [&](int64_t, const std::vector<Box>& boxes, const std::vector<std::byte*>& outs) {
        EXPECT_EQ(boxes[0].volume(), 0);
        std::memset(outs[1], 0, static_cast<size_t>(boxes[1].volume()) * 4);
        ++calls;
      });
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(out[0].shape(), Shape({4, 0}));
  EXPECT_EQ(out[1].shape(), Shape({4, 6}));
}

TEST(ComputeBlocksOnce, RefusesOutputsWhoseBlocksDoNotGoTogether) {
  Runtime rt = Runtime::host(4);
  const Mesh mesh = Mesh::parse("x=2,y=2");
  const std::vector<OutputLayout> layouts{{Shape{4, 6}, NamedSharding(mesh, {{"x"}})},
                                          {Shape{4, 6}, NamedSharding(mesh, {{"y"}})}};
  std::atomic<int> calls{0};
  EXPECT_THROW(compute_blocks_once(rt, layouts, DType::kF32,
                                   [&](int64_t, const std::vector<Box>&, const std::vector<std::byte*>&) { ++calls; }),
               Error);
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace tessel
