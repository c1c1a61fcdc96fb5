#include "tessel/runtime/collectives.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/half.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/reshard.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Every device holds its own contribution: value(device, global flat index), so a wrong source
// device or a wrong element shows up in the result.
double contribution(int64_t device, int64_t flat) { return static_cast<double>(device * 1000 + flat) * 0.5 - 7; }

int64_t flat_index(const Shape& shape, std::span<const int64_t> p) {
  return Box::full(shape).offset_of(p);
}

// Calls fn(point) for every point of `box`.
void for_each_point(const Box& box, const std::function<void(const std::vector<int64_t>&)>& fn) {
  if (box.empty()) return;
  std::vector<int64_t> p(box.starts().begin(), box.starts().end());
  for (;;) {
    fn(p);
    size_t d = box.rank();
    for (; d-- > 0;) {
      if (++p[d] < box.stop(d)) break;
      p[d] = box.start(d);
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

void store(DType dtype, double v, std::byte* p) {
  switch (dtype) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::kBF16: { uint16_t h = f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    case DType::kI32: { auto i = static_cast<int32_t>(std::lround(v * 2)); std::memcpy(p, &i, 4); return; }
    case DType::kBool: { auto b = static_cast<uint8_t>(std::lround(v * 2) % 3 == 0); std::memcpy(p, &b, 1); return; }
    default: FAIL() << "unused dtype";
  }
}

double load(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::kF32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case DType::kI32: { int32_t i; std::memcpy(&i, p, 4); return i; }
    case DType::kBool: { uint8_t b; std::memcpy(&b, p, 1); return b; }
    default: return NAN;
  }
}

Array per_device_input(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& s) {
  const size_t item = item_size(dtype);
  return make_array_from_device_callback(rt, shape, dtype, s, [&](int64_t device, const Box& box, std::span<std::byte> out) {
    for_each_point(box, [&](const std::vector<int64_t>& p) {
      store(dtype, contribution(device, flat_index(shape, p)), out.data() + box.offset_of(p) * static_cast<int64_t>(item));
    });
  });
}

double element(const Array& a, int64_t device, const std::vector<int64_t>& p) {
  const Shard& s = a.shard(device);
  return load(a.dtype(), s.buffer.data() + s.box.offset_of(p) * static_cast<int64_t>(item_size(a.dtype())));
}

// The group of `device` over `axes`, from the mesh's coordinates (independent of subgroups()).
std::vector<int64_t> group_of(const Mesh& mesh, int64_t device, const std::vector<std::string>& axes) {
  std::vector<int64_t> out;
  auto c = mesh.coords(device);
  for (int64_t other : mesh.device_ids()) {
    auto o = mesh.coords(other);
    bool same = true;
    for (size_t a = 0; a < mesh.rank(); ++a)
      if (std::find(axes.begin(), axes.end(), mesh.axes()[a].name) == axes.end() && o[a] != c[a]) same = false;
    if (same) out.push_back(other);
  }
  // Group order: row-major over `axes` as listed.
  std::sort(out.begin(), out.end(), [&](int64_t x, int64_t y) {
    auto cx = mesh.coords(x), cy = mesh.coords(y);
    for (const auto& name : axes) {
      size_t a = mesh.axis_index(name);
      if (cx[a] != cy[a]) return cx[a] < cy[a];
    }
    return false;
  });
  return out;
}

// Reference reduction of a group's contributions at `flat`, in the storage type's arithmetic.
double reduce_reference(DType dtype, Reduction op, const std::vector<int64_t>& group, int64_t flat) {
  std::vector<std::byte> tmp(8);
  std::vector<double> v;
  for (int64_t m : group) {
    store(dtype, contribution(m, flat), tmp.data());
    v.push_back(load(dtype, tmp.data()));
  }
  if (dtype == DType::kBool) {
    bool any = false, all = true;
    for (double x : v) any |= x != 0, all &= x != 0;
    return op == Reduction::kMax ? any : all;
  }
  if (op == Reduction::kMax) return *std::max_element(v.begin(), v.end());
  if (op == Reduction::kMin) return *std::min_element(v.begin(), v.end());
  if (dtype == DType::kI32) {
    int64_t s = 0;
    for (double x : v) s += static_cast<int64_t>(x);
    return static_cast<double>(static_cast<int32_t>(s));
  }
  float acc = static_cast<float>(v[0]);  // f32 and bf16 accumulate in float, in group order
  for (size_t i = 1; i < v.size(); ++i) acc += static_cast<float>(v[i]);
  if (op == Reduction::kMean) acc /= static_cast<float>(v.size());
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(acc));
  return acc;
}

const Mesh kMesh = Mesh::parse("a=2,b=2,c=2");

// Every non-empty subset of the 2x2x2 mesh's axes, also in a non-mesh order.
std::vector<std::vector<std::string>> axis_sets() {
  return {{"a"}, {"b"}, {"c"}, {"a", "b"}, {"b", "c"}, {"a", "c"}, {"c", "a"}, {"a", "b", "c"}, {"c", "b", "a"}};
}

std::vector<std::string> others(const std::vector<std::string>& axes) {
  std::vector<std::string> out;
  for (const std::string& a : kMesh.axis_names())
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) out.push_back(a);
  return out;
}

// Every element of y on device d came from the member of d's group whose shard of x holds it:
// the result of a collective that moves data within groups without reducing it.
void expect_taken_from_group(const Array& x, const Array& y, const std::vector<std::string>& axes) {
  for (int64_t d : kMesh.device_ids()) {
    auto group = group_of(kMesh, d, axes);
    for_each_point(y.shard(d).box, [&](const std::vector<int64_t>& p) {
      int64_t source = -1;
      for (int64_t m : group)
        if (x.shard(m).box.contains(p)) source = m;
      ASSERT_GE(source, 0) << "device " << d;
      ASSERT_EQ(element(y, d, p), static_cast<float>(contribution(source, flat_index(x.shape(), p))));
    });
  }
}

TEST(Collectives, AllGatherMatchesTheHostReferenceForEveryAxisSet) {
  auto rt = Runtime::host(8);
  const Shape shape{8, 4, 3};
  for (const auto& axes : axis_sets()) {
    // Gathered axes as the minor part of dimension 0, the rest on dimension 1.
    for (bool rest_first : {false, true}) {
      std::vector<DimSharding> dims(2);
      if (rest_first) {
        dims[0] = others(axes);
        dims[0].insert(dims[0].end(), axes.begin(), axes.end());
      } else {
        dims[0] = axes;
        dims[1] = others(axes);
      }
      NamedSharding s(kMesh, PartitionSpec(dims));
      SCOPED_TRACE(s.to_string());
      Array x = per_device_input(rt, shape, DType::kF32, s);
      Array y = all_gather(x, axes);
      std::vector<DimSharding> want = dims;
      want[0].resize(want[0].size() - axes.size());
      EXPECT_EQ(y.sharding(), NamedSharding(kMesh, PartitionSpec(want)));
      expect_taken_from_group(x, y, axes);
      testing::expect_accounts_match(rt, {&x, &y});
    }
  }
}

TEST(Collectives, ReduceScatterMatchesTheHostReferenceForEveryAxisSet) {
  auto rt = Runtime::host(8);
  const Shape shape{8, 4};
  for (const auto& axes : axis_sets()) {
    NamedSharding s(kMesh, PartitionSpec({{}, others(axes)}));
    Array x = per_device_input(rt, shape, DType::kF32, s);
    Array y = reduce_scatter(x, axes, 0);
    SCOPED_TRACE(y.sharding().to_string());
    EXPECT_EQ(y.sharding(), NamedSharding(kMesh, PartitionSpec({axes, others(axes)})));
    for (int64_t d : kMesh.device_ids()) {
      auto group = group_of(kMesh, d, axes);
      EXPECT_EQ(y.shard(d).box.volume() * static_cast<int64_t>(group.size()), x.shard(d).box.volume());
      for_each_point(y.shard(d).box, [&](const std::vector<int64_t>& p) {
        ASSERT_EQ(element(y, d, p), reduce_reference(DType::kF32, Reduction::kSum, group, flat_index(shape, p)));
      });
    }
    testing::expect_accounts_match(rt, {&x, &y});
  }
}

// Split on an inner dimension, each device's block is a strip of short rows of the inputs (the
// group's runs are summed together, joined in input order): small arrays summed inline, a large
// one on the pool, with every op the strips' joins could get wrong.
TEST(Collectives, ReduceScatterOverAnInnerDimensionMatchesTheHostReference) {
  auto rt = Runtime::host(8);
  struct Case {
    Shape shape;
    DType dtype;
    Reduction op;
    std::vector<std::string> axes;
    std::optional<size_t> dim = std::nullopt;  // the last, unless given
  };
  const Case cases[] = {{Shape{5, 3, 16}, DType::kF32, Reduction::kSum, {"a"}},
                        {Shape{5, 3, 16}, DType::kF32, Reduction::kMean, {"b", "c"}},
                        {Shape{7, 8}, DType::kBF16, Reduction::kSum, {"a", "b", "c"}},
                        {Shape{7, 8}, DType::kI32, Reduction::kMax, {"c", "a"}},
                        {Shape{12288, 48}, DType::kF32, Reduction::kSum, {"a", "b", "c"}},  // two pieces
                        {Shape{1024, 96}, DType::kF32, Reduction::kMin, {"b", "c"}},
                        {Shape{6, 16, 4}, DType::kF32, Reduction::kSum, {"a", "b", "c"}, 1}};
  for (const Case& c : cases) {
    const size_t last = c.dim ? *c.dim : c.shape.rank() - 1;
    NamedSharding s(kMesh, PartitionSpec({others(c.axes)}));
    Array x = per_device_input(rt, c.shape, c.dtype, s);
    Array y = reduce_scatter(x, c.axes, last, c.op);
    SCOPED_TRACE(std::string(name(c.dtype)) + " " + std::string(name(c.op)) + " " + y.sharding().to_string());
    for (int64_t d : kMesh.device_ids()) {
      auto group = group_of(kMesh, d, c.axes);
      EXPECT_EQ(y.shard(d).box.volume() * static_cast<int64_t>(group.size()), x.shard(d).box.volume());
      for_each_point(y.shard(d).box, [&](const std::vector<int64_t>& p) {
        ASSERT_EQ(element(y, d, p), reduce_reference(c.dtype, c.op, group, flat_index(c.shape, p)));
      });
    }
    testing::expect_accounts_match(rt, {&x, &y});
  }
}

TEST(Collectives, AllReduceMatchesTheHostReferenceForEveryAxisSetOpAndDtype) {
  auto rt = Runtime::host(8);
  const Shape shape{6, 5};  // 30 elements: pieces of unequal size for 4 and 8 members
  struct Case { DType dtype; Reduction op; };
  const Case cases[] = {{DType::kF32, Reduction::kSum}, {DType::kF32, Reduction::kMean},
                        {DType::kF32, Reduction::kMax}, {DType::kF32, Reduction::kMin},
                        {DType::kBF16, Reduction::kSum}, {DType::kBF16, Reduction::kMean},
                        {DType::kI32, Reduction::kSum}, {DType::kI32, Reduction::kMax},
                        {DType::kBool, Reduction::kMax}, {DType::kBool, Reduction::kMin}};
  for (const auto& axes : axis_sets()) {
    for (const Case& c : cases) {
      NamedSharding s(kMesh, PartitionSpec({others(axes)}));
      Array x = per_device_input(rt, shape, c.dtype, s);
      auto received_before = rt.device(0).memory_stats().bytes_received;
      Array y = all_reduce(x, axes, c.op);
      SCOPED_TRACE(std::string(name(c.dtype)) + " " + std::string(name(c.op)) + " " + s.to_string());
      EXPECT_EQ(y.sharding(), x.sharding());
      for (int64_t d : kMesh.device_ids()) {
        auto group = group_of(kMesh, d, axes);
        for_each_point(y.shard(d).box, [&](const std::vector<int64_t>& p) {
          ASSERT_EQ(element(y, d, p), reduce_reference(c.dtype, c.op, group, flat_index(shape, p)));
        });
      }
      // Device 0 receives 2 (n - 1) / n of its block, the all-reduce lower bound.
      int64_t n = static_cast<int64_t>(group_of(kMesh, 0, axes).size());
      int64_t v = x.shard(0).box.volume();
      int64_t mine = v / n;  // device 0 owns piece 0: [0, v / n)
      EXPECT_EQ(rt.device(0).memory_stats().bytes_received - received_before,
                static_cast<int64_t>(item_size(c.dtype)) * ((n - 1) * mine + (v - mine)));
      testing::expect_accounts_match(rt, {&x, &y});
    }
  }
}

// Calls that write more than the caches hold go out with streaming stores: rows of an odd length,
// so runs start at every alignment, and the values must be the same as through the cache.
TEST(Collectives, LargeCallsGiveTheSameValues) {
  auto rt = Runtime::host(8);
  const std::vector<std::string> all = {"a", "b", "c"};
  auto fill = [](int64_t device, const Box& box, std::span<std::byte> out) {
    auto* f = reinterpret_cast<float*>(out.data());
    const int64_t cols = box.stop(1) - box.start(1);
    for (int64_t r = box.start(0); r < box.stop(0); ++r)
      for (int64_t c = 0; c < cols; ++c)
        f[(r - box.start(0)) * cols + c] = static_cast<float>(contribution(device, r * box.stop(1) + box.start(1) + c));
  };
  {  // all_gather: 8 x 4.9 MB written
    const Shape shape{1200, 1031};
    Array x = make_array_from_device_callback(rt, shape, DType::kF32, NamedSharding(kMesh, PartitionSpec({all})), fill);
    Array y = all_gather(x, all);
    for (int64_t d : kMesh.device_ids()) {
      const auto* got = reinterpret_cast<const float*>(y.shard(d).buffer.data());
      for (int64_t i = 0; i < shape.num_elements(); ++i)
        ASSERT_EQ(got[i], static_cast<float>(contribution(i / 1031 / 150, i))) << "device " << d << " element " << i;
    }
  }
  {  // all_reduce (sum) of 8 blocks of 4.5 MB, each written to all 8 devices
    const Shape shape{1100, 1031};
    Array x = make_array_from_device_callback(rt, shape, DType::kF32, NamedSharding(kMesh, PartitionSpec()), fill);
    Array y = all_reduce(x, all, Reduction::kSum);
    const std::vector<int64_t> group = group_of(kMesh, 0, all);
    std::vector<float> want(static_cast<size_t>(shape.num_elements()));
    for (int64_t i = 0; i < shape.num_elements(); ++i)
      want[static_cast<size_t>(i)] = static_cast<float>(reduce_reference(DType::kF32, Reduction::kSum, group, i));
    for (int64_t d : kMesh.device_ids())
      ASSERT_EQ(std::memcmp(y.shard(d).buffer.data(), want.data(), want.size() * 4), 0) << "device " << d;
  }
}

// In one process the members of a group that end up with equal bytes share them, charged to
// each; members of different groups do not (a partial sum over other axes differs between groups).
TEST(Collectives, EqualResultsInAGroupShareMemory) {
  auto rt = Runtime::host(8);
  const Shape shape{8, 6};
  auto fill = [&](int64_t device, const Box& box, std::span<std::byte> out) {
    for (int64_t i = 0; i < box.volume(); ++i) {
      const float v = static_cast<float>(contribution(device, i));
      std::memcpy(out.data() + i * 4, &v, 4);
    }
  };
  Array x = make_array_from_device_callback(rt, shape, DType::kF32, NamedSharding(kMesh, PartitionSpec()), fill);
  Array y = all_reduce(x, {"a", "b"}, Reduction::kSum);  // groups: devices with equal c
  for (int64_t d : kMesh.device_ids()) {
    const std::vector<int64_t> group = group_of(kMesh, d, {"a", "b"});
    for (int64_t e : kMesh.device_ids())
      EXPECT_EQ(y.shard(d).buffer.data() == y.shard(e).buffer.data(),
                std::find(group.begin(), group.end(), e) != group.end()) << d << " " << e;
    EXPECT_EQ(rt.device(d).memory_stats().in_use, 2 * shape.num_elements() * 4) << d;
  }
  Array rows = make_array_from_device_callback(rt, shape, DType::kF32, NamedSharding(kMesh, PartitionSpec({{"a", "b", "c"}})), fill);
  Array g = all_gather(rows, {"b", "c"});  // 'a' still splits the rows: two distinct blocks
  for (int64_t d : kMesh.device_ids())
    for (int64_t e : kMesh.device_ids())
      EXPECT_EQ(g.shard(d).buffer.data() == g.shard(e).buffer.data(), g.shard(d).box == g.shard(e).box) << d << " " << e;
  Array r = reshard(rows, NamedSharding(kMesh, PartitionSpec({{"c"}})));
  for (int64_t d : kMesh.device_ids())
    for (int64_t e : kMesh.device_ids())
      EXPECT_EQ(r.shard(d).buffer.data() == r.shard(e).buffer.data(), r.shard(d).box == r.shard(e).box) << d << " " << e;
  EXPECT_EQ(to_host(r), to_host(rows));
}

TEST(Collectives, AllToAllMatchesTheHostReferenceForEveryAxisSet) {
  auto rt = Runtime::host(8);
  const Shape shape{8, 8, 2};
  for (const auto& axes : axis_sets()) {
    NamedSharding s(kMesh, PartitionSpec({others(axes), axes}));
    Array x = per_device_input(rt, shape, DType::kF32, s);
    Array y = all_to_all(x, axes, 0, 1);
    std::vector<std::string> split = others(axes);
    split.insert(split.end(), axes.begin(), axes.end());
    EXPECT_EQ(y.sharding(), NamedSharding(kMesh, PartitionSpec({split})));
    expect_taken_from_group(x, y, axes);
    // And back.
    Array z = all_to_all(y, axes, 1, 0);
    EXPECT_EQ(z.sharding(), x.sharding());
    for (int64_t d : kMesh.device_ids())
      EXPECT_TRUE(std::equal(z.shard(d).buffer.bytes().begin(), z.shard(d).buffer.bytes().end(),
                             x.shard(d).buffer.bytes().begin()));
    testing::expect_accounts_match(rt, {&x, &y, &z});
  }
}

TEST(Collectives, PpermuteShiftsAlongEachAxis) {
  auto rt = Runtime::host(8);
  const Shape shape{4, 6};
  for (const std::string& axis : kMesh.axis_names()) {
    for (int64_t shift : {1, -1, 3, 2}) {
      NamedSharding s(kMesh, PartitionSpec({{axis}}));
      Array x = per_device_input(rt, shape, DType::kF32, s);
      Array y = ppermute(x, axis, shift);
      size_t a = kMesh.axis_index(axis);
      for (int64_t d : kMesh.device_ids()) {
        auto c = kMesh.coords(d);
        c[a] = ((c[a] - shift) % 2 + 2) % 2;
        const Shard& src = x.shard(kMesh.device_at(c));
        auto got = y.shard(d).buffer.bytes();
        EXPECT_TRUE(std::equal(got.begin(), got.end(), src.buffer.bytes().begin())) << axis << shift << d;
      }
      if (shift == 2) EXPECT_TRUE(y.shard(0).buffer.shares_with(x.shard(0).buffer));  // identity
      testing::expect_accounts_match(rt, {&x, &y});
    }
  }
  // A shift along a 4-device axis rolls the blocks: the global value is rolled by a block.
  Mesh ring = Mesh::parse("r=4");
  Array x = device_put(rt, testing::iota(Shape{8}), NamedSharding(ring, {{"r"}}));
  HostArray host = to_host(ppermute(x, "r", 1));
  auto rolled = host.values<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(rolled.begin(), rolled.end()), (std::vector<int32_t>{7, 8, 1, 2, 3, 4, 5, 6}));
}

TEST(Collectives, AllGatherThenReshardAgreeOnTheGlobalValue) {
  auto rt = Runtime::host(8);
  Array x = device_put(rt, testing::iota(Shape{16, 8}), NamedSharding(kMesh, {{"a", "b"}, {"c"}}));
  Array g = all_gather(x, {"b"});
  EXPECT_EQ(to_host(g), testing::iota(Shape{16, 8}));
  Array gathered_all = all_gather(x, {"c", "a", "b"});
  EXPECT_TRUE(gathered_all.sharding().is_fully_replicated());
  EXPECT_EQ(to_host(gathered_all), testing::iota(Shape{16, 8}));
}

TEST(Collectives, SizeOneGroupsCopyNothing) {
  auto rt = Runtime::host(4);
  Mesh mesh = Mesh::parse("one=1,d=4");
  Array x = device_put(rt, testing::iota(Shape{8}), NamedSharding(mesh, {{"d", "one"}}));
  Array g = all_gather(x, {"one"});
  EXPECT_TRUE(g.shard(2).buffer.shares_with(x.shard(2).buffer));
  EXPECT_TRUE(all_reduce(g, {"one"}, Reduction::kSum).shard(0).buffer.shares_with(x.shard(0).buffer));
  Array r = reduce_scatter(g, {"one"}, 0);
  EXPECT_TRUE(r.shard(1).buffer.shares_with(x.shard(1).buffer));
}

TEST(Collectives, BadCallsNameTheProblem) {
  auto rt = Runtime::host(8);
  Array x = device_put(rt, testing::iota(Shape{8, 8}), NamedSharding(kMesh, {{"a", "b"}}));
  EXPECT_THAT([&] { all_gather(x, {"c"}); },
              ThrowsMessage<ValueError>(HasSubstr("all_gather over 'c': i32[8,8] is not sharded over it")));
  EXPECT_THAT([&] { all_gather(x, {"a"}); },
              ThrowsMessage<ValueError>(HasSubstr("'b' is more minor than the axes to move")));
  EXPECT_THAT([&] { all_gather(x, {"z"}); },
              ThrowsMessage<ValueError>(HasSubstr("all_gather over 'z': Mesh(a=2, b=2, c=2) has no such axis")));
  EXPECT_THAT([&] { all_gather(x, {}); }, ThrowsMessage<ValueError>(HasSubstr("no mesh axes given")));
  EXPECT_THAT([&] { all_gather(x, {"a", "a"}); }, ThrowsMessage<ValueError>(HasSubstr("'a' is listed twice")));
  EXPECT_THAT([&] { all_reduce(x, {"b"}, Reduction::kSum); },
              ThrowsMessage<ValueError>(HasSubstr("sharded over 'b' in dimension 0")));
  EXPECT_THAT([&] { reduce_scatter(x, {"c"}, 2); },
              ThrowsMessage<ValueError>(HasSubstr("dimension 2 is out of range for i32[8,8] (rank 2)")));
  EXPECT_THAT([&] { all_reduce(x, {"c"}, Reduction::kMean); },
              ThrowsMessage<ValueError>(HasSubstr("mean of int32 is not defined")));
  EXPECT_THAT([&] { all_to_all(x, {"b"}, 0, 0); }, ThrowsMessage<ValueError>(HasSubstr("both 0")));
  EXPECT_THAT([&] { all_to_all(x, {"c"}, 1, 0); },
              ThrowsMessage<ValueError>(HasSubstr("'c' must shard the concat dimension 0")));
  Array flags = device_put(rt, HostArray(Shape{8}, DType::kBool), NamedSharding(kMesh, {}));
  EXPECT_THAT([&] { all_reduce(flags, {"a"}, Reduction::kSum); },
              ThrowsMessage<ValueError>(HasSubstr("sum of bool is not defined")));
  Array uneven = device_put(rt, testing::iota(Shape{5}), NamedSharding(kMesh, {{"a"}}));
  EXPECT_THAT([&] { ppermute(uneven, "a", 1); },
              ThrowsMessage<ValueError>(HasSubstr("must divide evenly")));
  Array odd = device_put(rt, testing::iota(Shape{10}), NamedSharding(kMesh, {{"a", "b"}}));
  EXPECT_THAT([&] { all_gather(odd, {"b"}); }, ThrowsMessage<ValueError>(HasSubstr("do not nest evenly")));
  Array flat = device_put(rt, testing::iota(Shape{10}), NamedSharding(kMesh, {{"a"}}));
  EXPECT_THAT([&] { reduce_scatter(flat, {"b", "c"}, 0); },
              ThrowsMessage<ValueError>(HasSubstr("does not split evenly")));
}

}  // namespace
}  // namespace tessel
