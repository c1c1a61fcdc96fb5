// Internal (not installed): the stages of a restore after its plan (restore.cpp matches the trees
// and plans one LeafRead per leaf): blocks that are exactly their uncompressed chunks are mapped
// (restore_map.cpp), every other local block is read from the chunks that intersect it
// (restore_read.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/checkpoint/detail/store/chunks.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/state/variable.h"

namespace tessel::detail {

// One local block of a leaf, written from the chunks (its other local replicas share its buffer).
struct Destination {
  std::byte* data;
  Box box;
};

// One leaf to restore: where its chunks are, what it becomes, and its local blocks.
struct LeafRead : ChunkSource {
  explicit LeafRead(ChunkSource source) : ChunkSource(std::move(source)) {}
  DType target_dtype = DType::kF32;
  bool allow_missing = false;  // absent chunks take the fill value
  std::unique_ptr<ArrayBuilder> builder;  // null: `dests` are given (read_box)
  std::vector<Destination> dests;  // the blocks read_chunks fills
  std::string kind;
  Partitioning partitioning;
};

struct ReadCounters {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> chunks{0};
};

// Blocks whose uncompressed chunks, side by side, are the block's bytes (the same mesh) map them
// copy-on-write, read their pages in (from 8 threads when any is cold) and check each chunk's
// CRC-32C; their builders adopt the mappings. `readers` as RestoreOptions::readers. Returns the
// bytes mapped; `counters` count them as read.
int64_t map_chunks(std::vector<LeafRead>& leaves, int readers, bool verify, ReadCounters& counters);

// Every local block a builder still fills (or, without a builder, every destination given) is
// read from the chunks that intersect it, one task
// per chunk listing every block that needs it (a compressed chunk decoded once), with host
// staging bounded by `staging_bytes`. Returns the staging peak.
int64_t read_chunks(std::vector<LeafRead>& leaves, int readers, int64_t staging_bytes, bool verify,
                    ReadCounters& counters);

}  // namespace tessel::detail
