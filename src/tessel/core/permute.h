// Permuted copies of row-major arrays (NumPy's transpose), for host-side layout changes such as
// a key map's: a (batched) matrix transpose runs in cache-sized tiles.
//
//   // a [2, 3] array of 4-byte elements into its [3, 2] transpose
//   tessel::permute_copy(src, tessel::Shape({2, 3}), 4, std::vector<int64_t>{1, 0}, dst);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "tessel/core/shape.h"

namespace tessel {

// Copies the elements of an array of `shape` (row-major, `item` bytes each: 1, 2, 4 or 8) from
// `src` to `dst` (not overlapping) with its dimensions permuted: dst's dimension k is src's
// dimension perm[k]. Throws ValueError for a permutation of another rank or another item size.
void permute_copy(const std::byte* src, const Shape& shape, size_t item, std::span<const int64_t> perm,
                  std::byte* dst);

}  // namespace tessel
