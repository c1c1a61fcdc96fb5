// A checkpoint item opened once: an Orbax PyTree item (zarr v2 or zarr3 arrays, in an OCDBT
// database or in files) or a safetensors file or set. Opening detects the format, reads the
// metadata, opens the key-value store and parses every saved array's zarr metadata; restore,
// verify, describe, targets, convert and the Python package all take the opened item, so none of
// it is read twice. The item may be local or in a bucket (s3://bucket/prefix).
//
//   auto item = tessel::CheckpointItem::find("ckpt", std::nullopt, "items");  // latest step's 'items'
//   std::cout << item.dir() << " (" << item.storage() << ")\n";
//   for (const auto& [path, v] : item.abstract_state()) std::cout << path << " " << v.shape().to_string() << "\n";
//   tessel::State state = tessel::restore(rt, item, target);
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/core/location.h"
#include "tessel/state/state.h"

namespace tessel {

namespace detail {
class KvStore;
class ZarrArray;
struct ChunkSource;
}  // namespace detail

// What `tessel ckpt info` shows per saved array.
struct SavedArrayInfo {
  ParamMetadata param;
  Shape shape;
  DType dtype = DType::kF32;
  Shape chunks;
  Compression compression;
  int64_t num_chunks = 0;
  int64_t stored_bytes = 0;  // sum of the stored chunks' sizes
};

class CheckpointItem {
 public:
  // The item in `item_dir` itself. Throws IoError / ParseError / ValueError naming the file for
  // a directory that is no item, or metadata that cannot be read.
  static CheckpointItem open(const Location& item_dir);
  // The item `path` names, as find_item_dir (items.h) finds it: an item, a step's item `item` (or
  // its only PyTree item), or a directory of steps' step `step` (else the latest).
  static CheckpointItem find(const Location& path, std::optional<int64_t> step = std::nullopt,
                             const std::optional<std::string>& item = std::nullopt);

  const Location& dir() const;
  const ItemMetadata& metadata() const;
  StorageFormat format() const { return metadata().format; }
  // How the arrays are stored: "OCDBT, zarr v2", "files, zarr3", "safetensors".
  std::string storage() const;

  // The saved arrays (the leaves that hold one: not Orbax's empty nodes, strings or other
  // handlers' values) as abstract variables: kind, shape,
  // dtype, partitioning, and the saved sharding where `_sharding` has one. Throws for a leaf
  // whose array metadata could not be read (naming it).
  State abstract_state() const;
  // Per saved array: shape, dtype, chunks, codec and the stored bytes (which looks up every chunk).
  std::vector<SavedArrayInfo> describe() const;

  // For the library's readers (restore, verify): the item's key-value store, and a leaf's zarr
  // array and chunks. A leaf whose array metadata could not be read throws what reading it threw.
  const detail::KvStore& store() const;
  const detail::ZarrArray& zarr(const ParamMetadata& leaf) const;
  detail::ChunkSource chunks(const ParamMetadata& leaf) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// CheckpointItem::open(item_dir).metadata().
ItemMetadata read_item_metadata(const Location& item_dir);

}  // namespace tessel
