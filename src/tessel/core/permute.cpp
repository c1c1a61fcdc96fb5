// Permuted copies of row-major arrays: a (batched) matrix transpose in cache-sized tiles where
// the permutation is one, else element by element.
#include "tessel/core/permute.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

// out[b][c][r] = in[b][r][c] for `batch` matrices of rows x cols, in tiles that stay in cache.
template <class T>
void transpose_matrices(const std::byte* src, std::byte* dst, int64_t batch, int64_t rows, int64_t cols) {
  // 8 x 8 blocks through registers inside 64 x 64 tiles: each row read and each row written is
  // 8 contiguous elements.
  constexpr int64_t kTile = 64, kBlock = 8;
  const T* __restrict in = reinterpret_cast<const T*>(src);
  T* __restrict out = reinterpret_cast<T*>(dst);
  for (int64_t b = 0; b < batch; ++b, in += rows * cols, out += rows * cols)
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
        for (int64_t rb = r0; rb < r1; rb += kBlock)
          for (int64_t cb = c0; cb < c1; cb += kBlock) {
            if (rb + kBlock <= r1 && cb + kBlock <= c1) {
              T block[kBlock][kBlock];
              for (int64_t i = 0; i < kBlock; ++i)
                for (int64_t j = 0; j < kBlock; ++j) block[j][i] = in[(rb + i) * cols + cb + j];
              for (int64_t j = 0; j < kBlock; ++j)
                for (int64_t i = 0; i < kBlock; ++i) out[(cb + j) * rows + rb + i] = block[j][i];
              continue;
            }
            for (int64_t c = cb; c < std::min(c1, cb + kBlock); ++c)
              for (int64_t r = rb; r < std::min(r1, rb + kBlock); ++r) out[c * rows + r] = in[r * cols + c];
          }
      }
}

// Every element copied to its place, for permutations that are no (batched) matrix transpose.
template <class T>
void permute_elements(const std::byte* src, std::byte* dst, const Shape& o, const std::vector<int64_t>& stride) {
  const size_t rank = o.rank();
  const T* in = reinterpret_cast<const T*>(src);
  T* out = reinterpret_cast<T*>(dst);
  std::vector<int64_t> at(rank, 0);
  const int64_t inner = o[rank - 1], inner_stride = stride[rank - 1];
  for (int64_t row = 0, rows = o.num_elements() / inner; row < rows; ++row) {
    int64_t base = 0;
    for (size_t k = 0; k + 1 < rank; ++k) base += at[k] * stride[k];
    for (int64_t j = 0; j < inner; ++j) *out++ = in[base + j * inner_stride];
    for (size_t k = rank - 1; k-- > 0;) {
      if (++at[k] < o[k]) break;
      at[k] = 0;
    }
  }
}

template <class Fn>
void by_item_size(size_t item, Fn&& fn) {
  switch (item) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: throw ValueError(fmt::format("cannot transpose elements of {} bytes", item));
  }
}

}  // namespace

void permute_copy(const std::byte* src, const Shape& s, size_t item, std::span<const int64_t> perm, std::byte* dst) {
  const size_t rank = s.rank();
  if (perm.size() != rank) throw ValueError(fmt::format("a permutation of {} axes for a rank-{} array", perm.size(), rank));
  if (s.num_elements() == 0) return;
  // Runs of output dimensions whose input dimensions are consecutive: (first input dim, extent).
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (size_t k = 0; k < rank; ++k) {
    if (!groups.empty() && perm[k] == perm[k - 1] + 1) {
      groups.back().second *= s[static_cast<size_t>(perm[k])];
    } else {
      groups.emplace_back(perm[k], s[static_cast<size_t>(perm[k])]);
    }
  }
  if (groups.size() <= 1) {  // no dimension moves
    std::memcpy(dst, src, static_cast<size_t>(s.num_elements()) * item);
    return;
  }
  const bool matrix = groups.size() == 2 && groups[0].first > groups[1].first;
  const bool batched = groups.size() == 3 && groups[0].first == 0 && groups[1].first > groups[2].first;
  if (matrix || batched) {
    const int64_t batch = batched ? groups[0].second : 1;
    const int64_t rows = groups[groups.size() - 1].second, cols = groups[groups.size() - 2].second;
    by_item_size(item, [&](auto t) { transpose_matrices<decltype(t)>(src, dst, batch, rows, cols); });
    return;
  }
  std::vector<int64_t> in_strides(rank, 1);
  for (size_t d = rank; d-- > 1;) in_strides[d - 1] = in_strides[d] * s[d];
  std::vector<int64_t> stride(rank);  // input stride of each output dimension
  std::vector<int64_t> out_dims(rank);
  for (size_t k = 0; k < rank; ++k) {
    stride[k] = in_strides[static_cast<size_t>(perm[k])];
    out_dims[k] = s[static_cast<size_t>(perm[k])];
  }
  by_item_size(item, [&](auto t) { permute_elements<decltype(t)>(src, dst, Shape(out_dims), stride); });
}

}  // namespace tessel
