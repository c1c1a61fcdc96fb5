#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/box.h"
#include "tessel/core/error.h"
#include "tessel/core/shape.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Shape, ScalarHasRankZeroAndOneElement) {
  Shape s;
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.num_elements(), 1);
  EXPECT_EQ(s.to_string(), "[]");
  EXPECT_EQ(Shape::parse(""), s);
  EXPECT_EQ(Shape::parse("[]"), s);
}

TEST(Shape, ParsesCommaListsAndBrackets) {
  EXPECT_EQ(Shape::parse("16,8"), (Shape{16, 8}));
  EXPECT_EQ(Shape::parse("[16, 8, 0]"), (Shape{16, 8, 0}));
  EXPECT_EQ(Shape::parse(" 3 "), (Shape{3}));
  EXPECT_EQ((Shape{16, 8}).num_elements(), 128);
  EXPECT_EQ((Shape{16, 0}).num_elements(), 0);
}

TEST(Shape, RejectsNegativeAndNonNumericSizes) {
  EXPECT_THAT([] { Shape::parse("16,-2"); }, ThrowsMessage<ValueError>(HasSubstr("dimension 1")));
  EXPECT_THAT([] { Shape::parse("16,x"); }, ThrowsMessage<ValueError>(HasSubstr("'x'")));
  EXPECT_THAT([] { Shape::parse("16,,2"); }, ThrowsMessage<ValueError>(HasSubstr("dimension 1")));
  EXPECT_THAT([] { Shape::parse("4.5"); }, ThrowsMessage<ValueError>(HasSubstr("'4.5'")));
  EXPECT_THROW(Shape({-1}), ValueError);
}

TEST(Shape, ElementCountOverflowIsAnError) {
  Shape big{int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT([&] { big.num_elements(); }, ThrowsMessage<ValueError>(HasSubstr("int64")));
}

TEST(Box, IntersectionVolumeAndContainment) {
  Box a({0, 4}, {8, 8}), b({4, 0}, {12, 6});
  EXPECT_EQ(a.intersect(b), Box({4, 4}, {8, 6}));
  EXPECT_EQ(a.volume(), 32);
  EXPECT_EQ(a.shape(), (Shape{8, 4}));
  EXPECT_TRUE(a.contains(Box({1, 5}, {2, 6})));
  EXPECT_FALSE(a.contains(b));
  EXPECT_TRUE(a.contains(std::vector<int64_t>{7, 7}));
  EXPECT_FALSE(a.contains(std::vector<int64_t>{8, 7}));
  EXPECT_EQ(a.to_string(), "[0:8, 4:8]");
}

TEST(Box, DisjointBoxesIntersectEmpty) {
  Box a({0}, {4}), b({6}, {9});
  Box i = a.intersect(b);
  EXPECT_TRUE(i.empty());
  EXPECT_EQ(i.volume(), 0);
  EXPECT_TRUE(a.contains(i));
}

TEST(Box, OffsetsAreRowMajorWithinTheBox) {
  Box a({0, 4}, {8, 8});
  EXPECT_EQ(a.offset_of(std::vector<int64_t>{0, 4}), 0);
  EXPECT_EQ(a.offset_of(std::vector<int64_t>{5, 6}), 5 * 4 + 2);
  EXPECT_EQ(a.offset_of(std::vector<int64_t>{7, 7}), 31);
  EXPECT_THAT([&] { a.offset_of(std::vector<int64_t>{0, 0}); }, ThrowsMessage<ValueError>(HasSubstr("outside")));
  Box inner({2, 5}, {4, 7});
  EXPECT_EQ(inner.relative_to(a), Box({2, 1}, {4, 3}));
  EXPECT_THROW(a.relative_to(inner), ValueError);
}

// run_offset against brute force: the offsets of every element of a random inner box in the
// outer box's buffer, which are one run exactly when run_offset says so.
TEST(Box, RunOffsetIsWhereAnInnerBoxIsOneRun) {
  std::mt19937 rng(11);
  int runs = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t rank = 1 + rng() % 4;
    std::vector<int64_t> start(rank), stop(rank), in_start(rank), in_stop(rank);
    for (size_t d = 0; d < rank; ++d) {
      start[d] = rng() % 3;
      stop[d] = start[d] + 1 + rng() % 4;
      in_start[d] = start[d] + rng() % (stop[d] - start[d]);
      in_stop[d] = rng() % 3 == 0 ? stop[d] : in_start[d] + 1 + rng() % (stop[d] - in_start[d]);
    }
    const Box outer(start, stop), inner(in_start, in_stop);
    std::vector<int64_t> offsets, point(in_start);
    for (int64_t i = 0; i < inner.volume(); ++i) {
      offsets.push_back(outer.offset_of(point));
      for (size_t d = rank; d-- > 0;) {
        if (++point[d] < in_stop[d]) break;
        point[d] = in_start[d];
      }
    }
    const bool one_run = offsets.back() - offsets.front() + 1 == inner.volume();
    runs += one_run;
    EXPECT_EQ(outer.run_offset(inner), one_run ? std::optional<int64_t>(offsets.front()) : std::nullopt)
        << inner.to_string() << " in " << outer.to_string();
  }
  EXPECT_GT(runs, 200);
  EXPECT_LT(runs, 1800);
  EXPECT_EQ(Box({0}, {4}).run_offset(Box({3}, {5})), std::nullopt);  // not inside
  EXPECT_EQ(Box({0}, {4}).run_offset(Box({2}, {2})), std::nullopt);  // empty
  EXPECT_EQ(Box().run_offset(Box()), 0);
}

TEST(Box, RankZeroBoxIsTheScalarElement) {
  Box scalar = Box::full(Shape{});
  EXPECT_EQ(scalar.volume(), 1);
  EXPECT_EQ(scalar.offset_of(std::vector<int64_t>{}), 0);
  EXPECT_EQ(scalar.intersect(Box()), scalar);
}

TEST(Box, InvalidBoxesAreRejected) {
  EXPECT_THAT([] { Box({0, 5}, {4, 3}); }, ThrowsMessage<ValueError>(HasSubstr("dimension 1")));
  EXPECT_THROW(Box({0}, {4, 3}), ValueError);
  EXPECT_THROW(Box({-1}, {3}), ValueError);
  EXPECT_THROW(Box({0}, {4}).intersect(Box({0, 0}, {1, 1})), ValueError);
}

}  // namespace
}  // namespace tessel
