#include "tessel/core/box.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"

namespace tessel {

Box::Box(size_t rank) : rank_(rank) {
  if (rank > kInlineRank) heap_.assign(2 * rank, 0);
}

Box::Box(std::vector<int64_t> start, std::vector<int64_t> stop) : Box(start.size()) {
  if (start.size() != stop.size())
    throw ValueError(fmt::format("box start has rank {} but stop has rank {}", start.size(),
                                 stop.size()));
  for (size_t d = 0; d < rank_; ++d) {
    if (start[d] < 0 || start[d] > stop[d])
      throw ValueError(fmt::format("box dimension {} is [{}, {}): need 0 <= start <= stop", d,
                                   start[d], stop[d]));
    data()[d] = start[d];
    data()[rank_ + d] = stop[d];
  }
}

Box Box::full(const Shape& shape) {
  Box b(shape.rank());
  for (size_t d = 0; d < shape.rank(); ++d) b.data()[b.rank_ + d] = shape[d];
  return b;
}

bool operator==(const Box& a, const Box& b) {
  return a.rank_ == b.rank_ && std::equal(a.data(), a.data() + 2 * a.rank_, b.data());
}

Shape Box::shape() const {
  std::vector<int64_t> dims(rank());
  for (size_t d = 0; d < rank(); ++d) dims[d] = extent(d);
  return Shape(std::move(dims));
}

int64_t Box::volume() const {
  int64_t n = 1;
  for (size_t d = 0; d < rank(); ++d)
    if (__builtin_mul_overflow(n, extent(d), &n))
      throw ValueError(fmt::format("box {} has more elements than int64 can count", to_string()));
  return n;
}

void Box::check_rank(size_t other, const char* what) const {
  if (other != rank())
    throw ValueError(fmt::format("{} of rank {} used with box {} of rank {}", what, other,
                                 to_string(), rank()));
}

Box Box::intersect(const Box& other) const {
  check_rank(other.rank(), "box");
  Box out(rank_);
  int64_t* o = out.data();
  for (size_t d = 0; d < rank_; ++d) {
    o[d] = std::max(start(d), other.start(d));
    o[rank_ + d] = std::max(o[d], std::min(stop(d), other.stop(d)));
  }
  return out;
}

bool Box::contains(std::span<const int64_t> point) const {
  check_rank(point.size(), "point");
  for (size_t d = 0; d < rank(); ++d)
    if (point[d] < start(d) || point[d] >= stop(d)) return false;
  return true;
}

bool Box::contains(const Box& other) const {
  check_rank(other.rank(), "box");
  if (other.empty()) return true;
  for (size_t d = 0; d < rank(); ++d)
    if (other.start(d) < start(d) || other.stop(d) > stop(d)) return false;
  return true;
}

int64_t Box::offset_of(std::span<const int64_t> point) const {
  if (!contains(point))
    throw ValueError(fmt::format("point [{}] lies outside box {}", fmt::join(point, ", "), to_string()));
  int64_t offset = 0;
  for (size_t d = 0; d < rank(); ++d) offset = offset * extent(d) + (point[d] - start(d));
  return offset;
}

std::optional<int64_t> Box::run_offset(const Box& inner) const {
  check_rank(inner.rank(), "box");
  if (inner.empty() || !contains(inner)) return std::nullopt;
  size_t d = 0;
  while (d + 1 < rank() && inner.extent(d) == 1) ++d;
  for (size_t e = d + 1; e < rank(); ++e)
    if (inner.start(e) != start(e) || inner.stop(e) != stop(e)) return std::nullopt;
  return offset_of(inner.starts());
}

Box Box::relative_to(const Box& outer) const {
  check_rank(outer.rank(), "box");
  bool inside = true;
  for (size_t d = 0; d < rank(); ++d)
    inside = inside && outer.start(d) <= start(d) && stop(d) <= outer.stop(d);
  if (!inside)
    throw ValueError(fmt::format("box {} is not inside box {}", to_string(), outer.to_string()));
  Box out(rank_);
  for (size_t d = 0; d < rank_; ++d) {
    out.data()[d] = start(d) - outer.start(d);
    out.data()[rank_ + d] = stop(d) - outer.start(d);
  }
  return out;
}

std::string Box::to_string() const {
  std::string out = "[";
  for (size_t d = 0; d < rank(); ++d)
    out += fmt::format("{}{}:{}", d ? ", " : "", start(d), stop(d));
  return out + "]";
}

}  // namespace tessel
