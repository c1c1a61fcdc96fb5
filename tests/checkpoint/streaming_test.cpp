// What a streaming conversion stands on: a leaf written a slab at a time in several calls (an
// Orbax block grid, or any boxes of a safetensors tensor), and boxes of saved arrays read into
// host memory without a mesh, equal to the slices of what was saved, in every layout.
#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.h"
#include "../test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::TempDir;

HostArray slice(const HostArray& whole, const Box& box) {
  HostArray out(box.shape(), whole.dtype());
  copy_region(whole.bytes().data(), Box::full(whole.shape()), out.mutable_bytes().data(), box, box,
              item_size(whole.dtype()));
  return out;
}

// A random box of `shape` (possibly empty).
Box random_box(std::mt19937& rng, const Shape& shape) {
  std::vector<int64_t> start, stop;
  for (int64_t d : shape.dims()) {
    const int64_t a = std::uniform_int_distribution<int64_t>(0, d)(rng);
    start.push_back(a);
    stop.push_back(std::uniform_int_distribution<int64_t>(a, d)(rng));
  }
  return Box(std::move(start), std::move(stop));
}

// The boxes of a grid of `block` over `shape`, in a random order.
std::vector<Box> grid_boxes(std::mt19937& rng, const Shape& shape, const Shape& block) {
  std::vector<Box> out{Box(std::vector<int64_t>(shape.rank(), 0), std::vector<int64_t>(shape.rank(), 0))};
  for (size_t d = 0; d < shape.rank(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out)
      for (int64_t at = 0; at < shape[d]; at += block[d]) {
        std::vector<int64_t> start(b.starts().begin(), b.starts().end()), stop(b.stops().begin(), b.stops().end());
        start[d] = at;
        stop[d] = std::min(at + block[d], shape[d]);
        next.emplace_back(std::move(start), std::move(stop));
      }
    out = std::move(next);
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

struct Layout {
  std::string name;
  SaveOptions options;
};

std::vector<Layout> layouts() {
  return {{"ocdbt zarr2", {}},
          {"files zarr2 zstd", {.compression = Compression::zstd(), .use_ocdbt = false}},
          {"ocdbt zarr3", {.use_zarr3 = true}},
          {"small chunks", {.max_chunk_bytes = 64}}};
}

TEST(Streaming, AnOrbaxLeafComesASlabAtATimeAndBoxesReadBack) {
  Runtime rt = Runtime::host(2);
  std::mt19937 rng(20261129);
  for (const Layout& layout : layouts()) {
    for (int iter = 0; iter < 6; ++iter) {
      TempDir tmp;
      Shape shape({std::uniform_int_distribution<int64_t>(1, 6)(rng), std::uniform_int_distribution<int64_t>(1, 7)(rng),
                   std::uniform_int_distribution<int64_t>(1, 9)(rng)});
      const DType dtype = iter % 2 ? DType::kBF16 : DType::kF32;
      const HostArray value = testing::random_host(rng, shape, dtype);
      const HostArray other = testing::random_host(rng, Shape({5}), dtype);
      std::vector<int64_t> block = shape.dims();
      block[1] = std::uniform_int_distribution<int64_t>(1, shape[1])(rng);  // a slab of layers
      if (iter % 3 == 0) block[0] = 1;                                       // and of experts
      SaveOptions options = layout.options;
      options.block_shapes["stack/w"] = Shape(block);
      const NamedSharding one(Mesh({{"x", 1}}), PartitionSpec{});
      State abstract;
      abstract.insert("stack/w", Variable::abstract(kParam, shape, dtype, one));
      abstract.insert("b", Variable::abstract(kParam, other.shape(), dtype, one));
      const fs::path dir = tmp.path() / "item";
      {
        CheckpointWriter w(dir, abstract, options);
        const std::vector<Box> boxes = grid_boxes(rng, shape, Shape(block));
        for (size_t i = 0; i < boxes.size(); ++i) {
          const HostArray part = slice(value, boxes[i]);
          w.write("stack/w", std::vector<HostBlock>{{boxes[i], part.bytes()}});
          if (i == 0) {
            EXPECT_THAT([&] { w.write("stack/w", std::vector<HostBlock>{{boxes[i], part.bytes()}}); },
                        ThrowsMessage<ValueError>(HasSubstr("is given twice")));
            const Box whole = Box::full(shape);
            if (whole != boxes[i]) {
              const HostArray all = slice(value, whole);
              EXPECT_THAT([&] { w.write("stack/w", std::vector<HostBlock>{{whole, all.bytes()}}); },
                          ThrowsMessage<ValueError>(HasSubstr("is not one of the blocks of the grid")));
            }
          }
        }
        w.write("b", device_put(rt, other, one));
        w.commit();
      }
      EXPECT_TRUE(verify(CheckpointItem::open(dir)).faults.empty()) << layout.name;
      const CheckpointItem item = CheckpointItem::open(dir);
      EXPECT_EQ(read_box(item, "stack/w", Box::full(shape)), value) << layout.name;
      for (int k = 0; k < 8; ++k) {
        const Box box = random_box(rng, shape);
        EXPECT_EQ(read_box(item, "stack/w", box), slice(value, box)) << layout.name << " " << box.to_string();
      }
      const HostArray as_f32 = read_box(item, "b", Box::full(other.shape()), DType::kF32);
      EXPECT_EQ(as_f32.dtype(), DType::kF32);
    }
  }
}

TEST(Streaming, ALeafLeftPartlyUnwrittenIsNotCommitted) {
  std::mt19937 rng(3);
  TempDir tmp;
  const Shape shape({2, 4, 3});
  const HostArray value = testing::random_host(rng, shape, DType::kF32);
  const NamedSharding one(Mesh({{"x", 1}}), PartitionSpec{});
  State abstract;
  abstract.insert("w", Variable::abstract(kParam, shape, DType::kF32, one));
  {
    SaveOptions options;
    options.block_shapes["w"] = Shape({2, 1, 3});
    CheckpointWriter w(tmp.path() / "item", abstract, options);
    const Box first({0, 0, 0}, {2, 1, 3});
    const HostArray part = slice(value, first);
    w.write("w", std::vector<HostBlock>{{first, part.bytes()}});
    EXPECT_THAT([&] { w.commit(); }, ThrowsMessage<ValueError>(HasSubstr("'w': 6 of its 24 elements were written")));
  }
  EXPECT_TRUE(fs::is_empty(tmp.path()));
  SaveOptions bad;
  bad.block_shapes["w"] = Shape({2, 5, 3});
  EXPECT_THAT([&] { CheckpointWriter(tmp.path() / "item", abstract, bad); },
              ThrowsMessage<ValueError>(HasSubstr("block shape [2, 5, 3] does not fit its shape [2, 4, 3]")));
  // safetensors: any boxes, several calls; a shortfall is refused the same way.
  {
    State plain;  // safetensors records no sharding: any boxes
    plain.insert("w", Variable::abstract(kParam, shape, DType::kF32));
    SafetensorsWriter w(tmp.path() / "st", plain);
    const Box rows({0, 0, 0}, {1, 4, 3});
    const HostArray part = slice(value, rows);
    w.write("w", std::vector<HostBlock>{{rows, part.bytes()}});
    EXPECT_THAT([&] { w.commit(); }, ThrowsMessage<ValueError>(HasSubstr("12 of its 24 elements")));
  }
  EXPECT_FALSE(fs::exists(tmp.path() / "st"));
}

TEST(Streaming, SafetensorsTensorsComeInAnyBoxesAndBoxesReadBack) {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 8; ++iter) {
    TempDir tmp;
    const Shape shape({std::uniform_int_distribution<int64_t>(1, 5)(rng), std::uniform_int_distribution<int64_t>(1, 6)(rng),
                       std::uniform_int_distribution<int64_t>(1, 7)(rng)});
    const HostArray value = testing::random_host(rng, shape, DType::kBF16);
    State abstract;
    abstract.insert("w", Variable::abstract(kParam, shape, DType::kBF16));
    {
      SafetensorsWriter w(tmp.path() / "st", abstract, {.max_file_bytes = 64});
      std::vector<int64_t> block = shape.dims();
      block[1] = 1;
      for (const Box& b : grid_boxes(rng, shape, Shape(block))) {
        const HostArray part = slice(value, b);
        w.write("w", std::vector<HostBlock>{{b, part.bytes()}});
      }
      w.commit();
    }
    const CheckpointItem item = CheckpointItem::find(tmp.path() / "st");
    for (int k = 0; k < 8; ++k) {
      const Box box = random_box(rng, shape);
      EXPECT_EQ(read_box(item, "w", box), slice(value, box)) << box.to_string();
    }
    EXPECT_THAT([&] { read_box(item, "w", Box({0, 0, 0}, {shape[0] + 1, 1, 1})); },
                ThrowsMessage<ValueError>(HasSubstr("is not a box of its shape")));
    EXPECT_THAT([&] { read_box(item, "nope", Box::full(shape)); },
                ThrowsMessage<ValueError>(HasSubstr("'nope' is not one of the arrays")));
  }
}

}  // namespace
}  // namespace tessel
