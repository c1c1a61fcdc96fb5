// Internal (not installed): Hugging Face safetensors files as a store: an 8-byte little-endian
// header length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {str: str}} and the tensors' bytes (C order, little endian) packed one after
// another. A sharded set is several such files and `model.safetensors.index.json`
// ({"metadata": ..., "weight_map": {name: file}}). Every header is validated as the format's
// reference reader does before a byte of it is trusted.
//
//   auto set = tessel::detail::open_safetensors("llama/model.safetensors.index.json");
//   for (const auto& t : set.tensors) std::cout << t.name << " " << t.shape.to_string() << "\n";
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/location.h"
#include "tessel/core/shape.h"

namespace tessel::detail {

inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;  // the format's own limit

struct SafetensorsTensor {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0;  // byte offsets within the file's data section
  int64_t end = 0;
  size_t file = 0;    // index into SafetensorsSet::files
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;      // by data offset
  std::map<std::string, std::string> metadata;  // `__metadata__`
  int64_t data_start = 0;                       // 8 + header length
};

// The safetensors dtype name of a DType ("F32", "BF16", "BOOL", ...); throws ValueError for one
// the format lacks.
std::string_view safetensors_dtype(DType dtype);
// Throws ValueError naming `what` for an unknown name or one tessel cannot hold (F8_*, F4, ...).
DType parse_safetensors_dtype(std::string_view text, std::string_view what);

// Validates a header as the format's reference reader does: JSON object; each tensor's dtype,
// shape and offsets; byte counts equal to shape x item size; tensors tiling the data section
// [0, data_bytes) exactly, without gaps or overlaps; `__metadata__` a map of strings. Throws
// ParseError / ValueError naming `source` and the tensor.
SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t data_bytes, std::string_view source);

// Reads and validates one file's header (length, bounds, then the above).
SafetensorsHeader read_safetensors_header(const Location& file);
// The same from the first bytes of a file of `file_size` bytes (the fuzzers' entry point):
// `head` holds the 8-byte length and at least that many header bytes.
SafetensorsHeader parse_safetensors_head(std::span<const std::byte> head, int64_t file_size, std::string_view source);

// One file, or the files of a sharded set, as one collection of tensors.
struct SafetensorsSet {
  std::vector<Location> files;
  std::vector<int64_t> data_starts;             // per file
  std::vector<SafetensorsTensor> tensors;       // sorted by name
  std::map<std::string, std::string> metadata;  // the first file's `__metadata__`, else the index's "metadata"
  Location source;                              // what was opened
};

// True for a `*.safetensors` file, a `*.safetensors.index.json` file, or a directory holding
// `model.safetensors` or `model.safetensors.index.json` (and no Orbax `_METADATA`).
bool is_safetensors(const Location& path);

// Opens a file, an index (its files named relative to it, never outside its directory) or a
// directory as is_safetensors() accepts. Throws ValueError / IoError naming the file: a tensor in
// two files, a weight_map entry whose file lacks it, a name that is not a path
// (empty level, '/').
SafetensorsSet open_safetensors(const Location& path);

}  // namespace tessel::detail
