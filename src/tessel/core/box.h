// A box in an N-D index space: per dimension the half-open range [start, stop). Shards, chunks
// and reshard pieces are all Boxes, and this is the one place their arithmetic lives.
//
//   tessel::Box a({0, 4}, {8, 8}), b({4, 0}, {12, 6});
//   a.intersect(b) == tessel::Box({4, 4}, {8, 6}); a.volume() == 32
//   a.offset_of({5, 6}) == 5 * 4 + 2   // row-major offset inside a's own buffer
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/shape.h"

namespace tessel {

class Box {
 public:
  Box() = default;  // rank 0: the single element of a scalar
  // Throws ValueError unless the ranks agree and 0 <= start[d] <= stop[d].
  Box(std::vector<int64_t> start, std::vector<int64_t> stop);
  static Box full(const Shape& shape);  // [0, shape[d]) in every dimension

  size_t rank() const { return rank_; }
  int64_t start(size_t dim) const { return data()[dim]; }
  int64_t stop(size_t dim) const { return data()[rank_ + dim]; }
  int64_t extent(size_t dim) const { return stop(dim) - start(dim); }
  std::span<const int64_t> starts() const { return {data(), rank_}; }
  std::span<const int64_t> stops() const { return {data() + rank_, rank_}; }
  Shape shape() const;
  int64_t volume() const;  // 1 for a rank-0 box
  bool empty() const { return volume() == 0; }

  // The common part; in a dimension where the two are disjoint it is empty (start == stop).
  Box intersect(const Box& other) const;
  bool contains(std::span<const int64_t> point) const;
  bool contains(const Box& other) const;  // an empty box is contained in any box of its rank
  // Row-major offset of a point (global coordinates) in a buffer holding exactly this box.
  int64_t offset_of(std::span<const int64_t> point) const;
  // Where `inner` lies in a buffer holding exactly this box, when its elements there are one
  // run (leading dimensions of extent 1, then one partial dimension, then whole ones): the run's
  // first element. nullopt when `inner` is empty, not inside, or spread over several runs.
  std::optional<int64_t> run_offset(const Box& inner) const;
  // This box in the coordinates of `outer` (which must contain it).
  Box relative_to(const Box& outer) const;

  std::string to_string() const;  // "[0:8, 4:8]"
  friend bool operator==(const Box& a, const Box& b);

 private:
  // Boxes are made and copied for every shard, transfer and chunk: up to kInlineRank dimensions
  // live inside the object, so the common case never allocates.
  static constexpr size_t kInlineRank = 6;
  explicit Box(size_t rank);  // all zeros, unchecked
  const int64_t* data() const { return rank_ <= kInlineRank ? inline_.data() : heap_.data(); }
  int64_t* data() { return rank_ <= kInlineRank ? inline_.data() : heap_.data(); }
  void check_rank(size_t rank, const char* what) const;

  size_t rank_ = 0;
  std::array<int64_t, 2 * kInlineRank> inline_{};  // starts, then stops
  std::vector<int64_t> heap_;                      // the same, past kInlineRank dimensions
};

}  // namespace tessel
