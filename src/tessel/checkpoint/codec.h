// Chunk compression, as zarr v2 names it in `.zarray` ("compressor"): none, zstd (what Orbax
// writes, level 1 by default) and, for reading, blosc (zarr's own default). Decoding checks the
// decoded size against the chunk size before trusting a single byte.
//
//   auto c = tessel::Compression::parse("zstd:3");      // or "none", "zstd"
//   std::vector<std::byte> packed = tessel::compress(c, raw);
//   tessel::decompress(c, packed, out, "params/w chunk 0.1");   // out.size() == raw.size()
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

struct Compression {
  enum class Kind { kNone, kZstd, kBlosc };
  Kind kind = Kind::kNone;
  int level = 1;  // zstd level (1..22, negative: fast modes); blosc: informative only

  static Compression none() { return {}; }
  static Compression zstd(int level = 1) { return {Kind::kZstd, level}; }
  // "none", "zstd", "zstd:<level>". Throws ValueError naming the text.
  static Compression parse(std::string_view text);
  std::string to_string() const;  // the parse() form
  friend bool operator==(const Compression&, const Compression&) = default;
};

// Encodes one chunk. Throws ValueError for blosc (tessel reads blosc, it does not write it).
std::vector<std::byte> compress(const Compression& compression, std::span<const std::byte> raw);

// Decodes `encoded` into `out`, which must receive exactly out.size() bytes. Throws ValueError
// naming `what` when the data is corrupt or decodes to another size. Frames without a content
// size (as TensorStore writes them) are accepted.
void decompress(const Compression& compression, std::span<const std::byte> encoded,
                std::span<std::byte> out, std::string_view what);

}  // namespace tessel
