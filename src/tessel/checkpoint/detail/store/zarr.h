// Internal (not installed): zarr array metadata and its chunk grid: what one saved parameter looks like on disk, as zarr v2
// (`.zarray`) or zarr v3 (`zarr.json`, also with the `sharding_indexed` codec Orbax uses). Chunks
// tile the array from the origin; every chunk holds a full chunk (edge chunks included), C order,
// little endian, possibly compressed. With sharding, chunks() are the inner chunks (the unit that
// is read and decoded) and each stored value, a shard, holds shard_shape() / chunks() of them
// followed (or preceded) by an index of (offset, length) pairs and its CRC-32C.
//
//   auto z = tessel::detail::ZarrArray::parse(text, "params.w/.zarray");
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

namespace tessel::detail {

class ZarrArray {
 public:
  // Throws ValueError unless chunks has the shape's rank and positive sizes, and one chunk's
  // bytes fit in int64.
  ZarrArray(Shape shape, Shape chunks, DType dtype, Compression compression);

  // Reads a `.zarray` or a `zarr.json`. Throws ParseError (bad JSON) or ValueError naming
  // `source` and the field: another zarr_format, Fortran order, filters, big-endian or unknown
  // dtypes, unknown compressors or codecs, mismatched ranks, absurd sizes.
  static ZarrArray parse(std::string_view text, std::string_view source);
  // zarr v3 with one `sharding_indexed` codec (inner chunks `chunks`, shards `shard_shape`), as
  // Orbax writes it: inner codecs bytes + zstd (or none), index bytes + crc32c at the end.
  static ZarrArray sharded_v3(Shape shape, Shape shard_shape, Shape chunks, DType dtype, Compression compression);
  // The whole array as one uncompressed chunk (a safetensors tensor); zero-sized dimensions get
  // chunk size 1.
  static ZarrArray one_chunk(const Shape& shape, DType dtype);
  // What TensorStore writes: compact JSON, keys sorted (v2: fill_value and filters null; v3:
  // fill_value 0).
  std::string to_json() const;
  // The metadata's key beside the chunks: ".zarray" or "zarr.json".
  const char* metadata_key() const { return format_ == 2 ? ".zarray" : "zarr.json"; }

  const Shape& shape() const { return shape_; }
  const Shape& chunks() const { return chunks_; }
  DType dtype() const { return dtype_; }
  const Compression& compression() const { return compression_; }
  char separator() const { return separator_; }
  // The fill value for chunks that are absent (zarr's fill_value); none when it was null.
  const std::optional<double>& fill_value() const { return fill_value_; }

  int zarr_format() const { return format_; }
  bool sharded() const { return sharded_; }
  const Shape& shard_shape() const { return shard_shape_; }
  int64_t chunks_per_shard() const;
  // Where chunk `index` sits in its shard (C order of the shard's inner grid).
  int64_t position_in_shard(std::span<const int64_t> index) const;
  bool index_at_end() const { return index_at_end_; }
  bool index_checksum() const { return index_crc_; }
  int64_t shard_index_bytes() const { return chunks_per_shard() * 16 + (index_crc_ ? 4 : 0); }
  // Decodes a shard's index (shard_index_bytes() bytes, checked against its CRC-32C) and returns
  // where inner chunk `position` lies in a shard of `shard_size` bytes, or nullopt when the chunk
  // was never written. Throws ValueError naming `what` for a corrupt index or a range outside the
  // shard's data.
  struct Range {
    int64_t offset = 0, length = 0;
  };
  std::optional<Range> inner_chunk_range(std::span<const std::byte> index, int64_t position, int64_t shard_size,
                                         std::string_view what) const;
  // The chunk bytes end in their own CRC-32C (zarr v3's crc32c codec).
  bool chunk_checksum() const { return chunk_crc_; }
  // Each chunk stored as its raw bytes (no codec, no checksum of its own): any part of it can be
  // read as a byte range; otherwise a chunk is read and decoded whole.
  bool raw_chunks() const { return compression_.kind == Compression::Kind::kNone && !chunk_crc_; }

  int64_t chunk_bytes() const { return chunk_bytes_; }
  std::vector<int64_t> grid() const;  // ceil(shape / chunks) per dimension
  int64_t num_chunks() const;
  Box chunk_box(std::span<const int64_t> index) const;  // full chunk, may pass the array's end
  // The key of the stored value holding chunk `index` (its shard, when sharded).
  std::string chunk_key(std::span<const int64_t> index) const;
  // Grid indices of the chunks that intersect `region` (row-major order).
  std::vector<std::vector<int64_t>> chunks_in(const Box& region) const;

 private:
  friend struct ZarrV3Parser;
  Shape shape_;
  Shape chunks_;
  DType dtype_;
  Compression compression_;
  char separator_ = '.';
  int format_ = 2;
  bool v3_default_keys_ = true;  // "c/i/j" (else v2 style "i.j")
  bool sharded_ = false;
  Shape shard_shape_;  // sharded: the chunk grid's shape
  bool index_at_end_ = true;
  bool index_crc_ = true;
  bool chunk_crc_ = false;
  std::optional<double> fill_value_;
  int64_t chunk_bytes_ = 0;
};

// Orbax's choose_chunk_shape: a chunk shape that divides `write_shape` exactly and holds at
// most `max_bytes`, shrinking the dimensions listed in `prefer` (the sharded ones) first, the
// largest first, by their smallest divisors. Zero-sized dimensions become 1.
Shape choose_chunk_shape(const Shape& write_shape, size_t item_size, int64_t max_bytes,
                         std::span<const size_t> prefer);

}  // namespace tessel::detail
