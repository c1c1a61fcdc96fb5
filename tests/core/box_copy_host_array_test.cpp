#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/host_array.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

Box random_box_in(std::mt19937& rng, const Box& outer) {
  std::vector<int64_t> lo(outer.rank()), hi(outer.rank());
  for (size_t d = 0; d < outer.rank(); ++d) {
    std::uniform_int_distribution<int64_t> pick(outer.start(d), outer.stop(d));
    int64_t a = pick(rng), b = pick(rng);
    lo[d] = std::min(a, b);
    hi[d] = std::max(a, b);
  }
  return Box(lo, hi);
}

// Element-by-element reference through Box::offset_of.
void naive_copy(const std::vector<int32_t>& src, const Box& sb, std::vector<int32_t>& dst,
                const Box& db, const Box& region) {
  if (region.empty()) return;
  std::vector<int64_t> p(region.starts().begin(), region.starts().end());
  for (;;) {
    dst[static_cast<size_t>(db.offset_of(p))] = src[static_cast<size_t>(sb.offset_of(p))];
    size_t d = region.rank();
    for (; d-- > 0;) {
      if (++p[d] < region.stop(d)) break;
      p[d] = region.start(d);
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

TEST(BoxCopy, MatchesElementwiseCopyForRandomBoxes) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    size_t rank = trial % 5;
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) d = std::uniform_int_distribution<int64_t>(0, 6)(rng);
    Box whole = Box::full(Shape(dims));
    Box region = random_box_in(rng, whole);
    // Source and destination boxes both contain the region, each grown by a random margin.
    auto grow = [&](const Box& r) {
      std::vector<int64_t> lo(rank), hi(rank);
      for (size_t d = 0; d < rank; ++d) {
        lo[d] = std::uniform_int_distribution<int64_t>(0, r.start(d))(rng);
        hi[d] = std::uniform_int_distribution<int64_t>(r.stop(d), dims[d])(rng);
      }
      return Box(lo, hi);
    };
    Box sb = grow(region), db = grow(region);
    std::vector<int32_t> src(static_cast<size_t>(sb.volume()));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i + 1);
    std::vector<int32_t> got(static_cast<size_t>(db.volume()), -1), want = got;
    copy_region(reinterpret_cast<const std::byte*>(src.data()), sb,
                reinterpret_cast<std::byte*>(got.data()), db, region, 4);
    naive_copy(src, sb, want, db, region);
    ASSERT_EQ(got, want) << "region " << region.to_string() << " src " << sb.to_string() << " dst "
                         << db.to_string();
  }
}

TEST(BoxCopy, RejectsARegionOutsideEitherBox) {
  std::vector<std::byte> a(64), b(64);
  EXPECT_THAT([&] { copy_region(a.data(), Box({0}, {4}), b.data(), Box({2}, {6}), Box({0}, {4}), 4); },
              ThrowsMessage<ValueError>(HasSubstr("not inside both")));
}

TEST(BoxCopy, SplitBoxTilesTheRegion) {
  Box region({1, 0, 2}, {9, 1, 7});
  for (int64_t max : {1, 3, 5, 7, 40, 1000}) {
    auto pieces = split_box(region, max);
    int64_t total = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_TRUE(region.contains(pieces[i]));
      EXPECT_TRUE(pieces[i].volume() <= std::max<int64_t>(max, 5)) << max;
      for (size_t j = 0; j < i; ++j) EXPECT_TRUE(pieces[i].intersect(pieces[j]).empty());
      total += pieces[i].volume();
    }
    EXPECT_EQ(total, region.volume());
  }
  EXPECT_EQ(split_box(Box(), 1).size(), 1u);
}

TEST(HostArray, TypedConstructionAndViews) {
  auto h = HostArray::from<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(h.dtype(), DType::kF32);
  EXPECT_EQ(h.nbytes(), 24);
  EXPECT_EQ(h.values<float>()[4], 4.0f);
  EXPECT_EQ(h.type_string(), "f32[2,3]");
  EXPECT_THAT([&] { (void)h.values<double>(); }, ThrowsMessage<ValueError>(HasSubstr("4 bytes each")));
  EXPECT_THAT([] { HostArray(Shape{2, 2}, DType::kF32, std::vector<std::byte>(15)); },
              ThrowsMessage<ValueError>(HasSubstr("f32[2,2] needs 16 bytes, got 15")));
  HostArray z(Shape{3}, DType::kBF16);
  EXPECT_EQ(z.values<uint16_t>().size(), 3u);
  EXPECT_EQ(z.values<uint16_t>()[2], 0);
}

}  // namespace
}  // namespace tessel
