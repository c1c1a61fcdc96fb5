// zarr v2 array metadata (`.zarray`) and its chunk grid: what one saved parameter looks like on
// disk. Chunks tile the array from the origin; every chunk file holds a full chunk (edge chunks
// included), C order, little endian, possibly compressed.
//
//   auto z = tessel::ZarrArray::parse(text, "params.w/.zarray");
//   z.grid() == std::vector<int64_t>{4, 1};             // chunks per dimension
//   z.chunk_box({2, 0}) == tessel::Box({8, 0}, {12, 16});
//   z.chunk_key({2, 0}) == "2.0"
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/codec.h"
#include "tessel/core/box.h"
#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"

namespace tessel {

class ZarrArray {
 public:
  // Throws ValueError unless chunks has the shape's rank and positive sizes, and one chunk's
  // bytes fit in int64.
  ZarrArray(Shape shape, Shape chunks, DType dtype, Compression compression);

  // Reads a `.zarray`. Throws ParseError (bad JSON) or ValueError naming `source` and the field:
  // another zarr_format, Fortran order, filters, big-endian or unknown dtypes, unknown
  // compressors, mismatched ranks, absurd sizes.
  static ZarrArray parse(std::string_view text, std::string_view source);
  // What TensorStore writes: compact JSON, keys sorted, fill_value and filters null.
  std::string to_json() const;

  const Shape& shape() const { return shape_; }
  const Shape& chunks() const { return chunks_; }
  DType dtype() const { return dtype_; }
  const Compression& compression() const { return compression_; }
  char separator() const { return separator_; }
  // The fill value for chunks that are absent (zarr's fill_value); none when it was null.
  const std::optional<double>& fill_value() const { return fill_value_; }

  int64_t chunk_bytes() const { return chunk_bytes_; }
  std::vector<int64_t> grid() const;  // ceil(shape / chunks) per dimension
  int64_t num_chunks() const;
  Box chunk_box(std::span<const int64_t> index) const;  // full chunk, may pass the array's end
  std::string chunk_key(std::span<const int64_t> index) const;
  // Grid indices of the chunks that intersect `region` (row-major order).
  std::vector<std::vector<int64_t>> chunks_in(const Box& region) const;

 private:
  Shape shape_;
  Shape chunks_;
  DType dtype_;
  Compression compression_;
  char separator_ = '.';
  std::optional<double> fill_value_;
  int64_t chunk_bytes_ = 0;
};

// Orbax's choose_chunk_shape: a chunk shape that divides `write_shape` exactly and holds at
// most `max_bytes`, shrinking the dimensions listed in `prefer` (the sharded ones) first, the
// largest first, by their smallest divisors. Zero-sized dimensions become 1.
Shape choose_chunk_shape(const Shape& write_shape, size_t item_size, int64_t max_bytes,
                         std::span<const size_t> prefer);

}  // namespace tessel
