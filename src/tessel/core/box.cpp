#include "tessel/core/box.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"

namespace tessel {

Box::Box(std::vector<int64_t> start, std::vector<int64_t> stop)
    : start_(std::move(start)), stop_(std::move(stop)) {
  if (start_.size() != stop_.size())
    throw ValueError(fmt::format("box start has rank {} but stop has rank {}", start_.size(),
                                 stop_.size()));
  for (size_t d = 0; d < start_.size(); ++d)
    if (start_[d] < 0 || start_[d] > stop_[d])
      throw ValueError(fmt::format("box dimension {} is [{}, {}): need 0 <= start <= stop", d,
                                   start_[d], stop_[d]));
}

Box Box::full(const Shape& shape) { return Box(std::vector<int64_t>(shape.rank(), 0), shape.dims()); }

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
  std::vector<int64_t> lo(rank()), hi(rank());
  for (size_t d = 0; d < rank(); ++d) {
    lo[d] = std::max(start_[d], other.start_[d]);
    hi[d] = std::max(lo[d], std::min(stop_[d], other.stop_[d]));
  }
  return Box(std::move(lo), std::move(hi));
}

bool Box::contains(std::span<const int64_t> point) const {
  check_rank(point.size(), "point");
  for (size_t d = 0; d < rank(); ++d)
    if (point[d] < start_[d] || point[d] >= stop_[d]) return false;
  return true;
}

bool Box::contains(const Box& other) const {
  check_rank(other.rank(), "box");
  if (other.empty()) return true;
  for (size_t d = 0; d < rank(); ++d)
    if (other.start_[d] < start_[d] || other.stop_[d] > stop_[d]) return false;
  return true;
}

int64_t Box::offset_of(std::span<const int64_t> point) const {
  if (!contains(point))
    throw ValueError(fmt::format("point [{}] lies outside box {}", fmt::join(point, ", "), to_string()));
  int64_t offset = 0;
  for (size_t d = 0; d < rank(); ++d) offset = offset * extent(d) + (point[d] - start_[d]);
  return offset;
}

Box Box::relative_to(const Box& outer) const {
  check_rank(outer.rank(), "box");
  bool inside = true;
  for (size_t d = 0; d < rank(); ++d)
    inside = inside && outer.start_[d] <= start_[d] && stop_[d] <= outer.stop_[d];
  if (!inside)
    throw ValueError(fmt::format("box {} is not inside box {}", to_string(), outer.to_string()));
  std::vector<int64_t> lo(rank()), hi(rank());
  for (size_t d = 0; d < rank(); ++d) {
    lo[d] = start_[d] - outer.start_[d];
    hi[d] = stop_[d] - outer.start_[d];
  }
  return Box(std::move(lo), std::move(hi));
}

std::string Box::to_string() const {
  std::string out = "[";
  for (size_t d = 0; d < rank(); ++d)
    out += fmt::format("{}{}:{}", d ? ", " : "", start_[d], stop_[d]);
  return out + "]";
}

}  // namespace tessel
