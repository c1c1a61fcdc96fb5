#include "tessel/core/box_copy.h"

#include <algorithm>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {

void check_region_inside(const Box& region, const Box& src_box, const Box& dst_box,
                         std::string_view what) {
  if (!src_box.contains(region) || !dst_box.contains(region))
    throw ValueError(fmt::format("{} region {} is not inside both the source box {} and the "
                                 "destination box {}",
                                 what, region.to_string(), src_box.to_string(), dst_box.to_string()));
}

void copy_region(const std::byte* src, const Box& src_box, std::byte* dst, const Box& dst_box,
                 const Box& region, size_t item_size) {
  check_region_inside(region, src_box, dst_box, "copy");
  const auto item = static_cast<int64_t>(item_size);
  for_each_run(region, src_box, dst_box, [&](int64_t s, int64_t d, int64_t n) {
    std::memcpy(dst + d * item, src + s * item, static_cast<size_t>(n * item));
  });
}

std::vector<Box> split_box(const Box& region, int64_t max_elements) {
  const int64_t volume = region.volume();
  size_t dim = 0;
  while (dim < region.rank() && region.extent(dim) <= 1) ++dim;
  if (dim == region.rank() || volume <= max_elements) return {region};
  const int64_t slice = volume / region.extent(dim);  // elements per index of `dim`
  const int64_t per_piece = std::max<int64_t>(1, max_elements / slice);
  const int64_t parts = (region.extent(dim) + per_piece - 1) / per_piece;
  std::vector<Box> out;
  out.reserve(static_cast<size_t>(parts));
  std::vector<int64_t> lo(region.starts().begin(), region.starts().end());
  std::vector<int64_t> hi(region.stops().begin(), region.stops().end());
  for (int64_t p = 0; p < parts; ++p) {
    lo[dim] = region.start(dim) + p * per_piece;
    hi[dim] = std::min(region.stop(dim), lo[dim] + per_piece);
    out.emplace_back(lo, hi);
  }
  return out;
}

}  // namespace tessel
