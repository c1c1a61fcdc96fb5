// Strided copies between buffers that each hold one Box of a global array, row-major. The one
// place device_put, to_host, reshard, collectives and checkpoint chunk I/O walk sub-boxes.
//
//   // copy rows 2..4 of a [4, 6] array from a buffer holding [0:4, 0:6] into one holding
//   // [2:4, 0:6]
//   tessel::copy_region(src, Box({0, 0}, {4, 6}), dst, Box({2, 0}, {4, 6}),
//                       Box({2, 0}, {4, 6}), /*item_size=*/4);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "tessel/core/box.h"

namespace tessel {

// Calls fn(src_offset, dst_offset, count), offsets and count in elements, once per contiguous run
// of `region` in a buffer holding `src_box` and one holding `dst_box`. Dimensions that both
// buffers and the region span fully are merged into longer runs. `region` must lie in both
// boxes (same coordinate frame) and have their rank; an empty region makes no calls.
template <class Fn>
void for_each_run(const Box& region, const Box& src_box, const Box& dst_box, Fn&& fn) {
  const size_t rank = region.rank();
  if (region.empty()) return;
  if (rank == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  // Row-major strides of both buffers, and the odometer; on the stack for the usual ranks.
  constexpr size_t kStack = 8;
  int64_t stack[3 * kStack];
  std::vector<int64_t> heap(rank > kStack ? 3 * rank : 0);
  int64_t* src_stride = rank > kStack ? heap.data() : stack;
  int64_t* dst_stride = src_stride + rank;
  int64_t* idx = dst_stride + rank;
  int64_t s = 1, d = 1;
  for (size_t k = rank; k-- > 0;) {
    src_stride[k] = s;
    dst_stride[k] = d;
    idx[k] = 0;
    s *= src_box.extent(k);
    d *= dst_box.extent(k);
  }
  // Merge inner dimensions while the region covers both buffers' full extent there.
  size_t outer = rank - 1;  // dimensions [0, outer) are iterated, [outer, rank) form one run
  int64_t run = region.extent(rank - 1);
  while (outer > 0 && region.extent(outer) == src_box.extent(outer) &&
         region.extent(outer) == dst_box.extent(outer)) {
    --outer;
    run *= region.extent(outer);
  }
  int64_t src_off = 0, dst_off = 0;
  for (size_t k = 0; k < rank; ++k) {
    src_off += (region.start(k) - src_box.start(k)) * src_stride[k];
    dst_off += (region.start(k) - dst_box.start(k)) * dst_stride[k];
  }
  for (;;) {
    fn(src_off, dst_off, run);
    size_t k = outer;
    for (; k-- > 0;) {
      if (++idx[k] < region.extent(k)) {
        src_off += src_stride[k];
        dst_off += dst_stride[k];
        break;
      }
      src_off -= (region.extent(k) - 1) * src_stride[k];
      dst_off -= (region.extent(k) - 1) * dst_stride[k];
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return;
  }
}

// Throws ValueError unless `region` lies in both boxes; `what` starts the message ("copy").
void check_region_inside(const Box& region, const Box& src_box, const Box& dst_box,
                         std::string_view what);

// Copies `region` from `src` (holding src_box) to `dst` (holding dst_box).
void copy_region(const std::byte* src, const Box& src_box, std::byte* dst, const Box& dst_box,
                 const Box& region, size_t item_size);

// Splits `region` along its outermost dimension of extent > 1 into pieces of at most about
// `max_elements` elements each (never finer than one index of that dimension).
std::vector<Box> split_box(const Box& region, int64_t max_elements);

}  // namespace tessel
