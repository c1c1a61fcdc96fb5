// A restore's mapping stage: a block that is exactly its uncompressed chunks, side by side, maps
// their file bytes copy-on-write instead of copying them into fresh memory, so the restored buffer
// is the page cache's pages.
#include <unistd.h>

#include <optional>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/restore_plan.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace {

// A block that may map its chunks' file bytes: uncompressed chunks of its dtype that lie side by
// side in the block's buffer, in order (one chunk, or runs of rows of a shard split into chunks).
struct MappedBlock {
  size_t param;
  size_t shard;  // the block's first local holder (its local replicas share its buffer)
  std::vector<std::vector<int64_t>> chunks;  // in the order of their bytes in the block
  std::optional<MappedBytes> bytes;  // once mapped; read in and checked chunk by chunk

  // Chunk k's bytes in the mapping.
  std::span<const std::byte> chunk(size_t k, int64_t chunk_bytes) const {
    return {bytes->data() + static_cast<int64_t>(k) * chunk_bytes, static_cast<size_t>(chunk_bytes)};
  }
};

// Below this, reading into the device's cached blocks costs less than a mapping per chunk.
constexpr int64_t kMinMappedBytes = int64_t{1} << 20;

// The blocks of `p` whose stored chunks, side by side, are the block's bytes
// (RestoreOptions::map_chunks): found from the metadata alone, no file opened yet. A block of
// several chunks is mapped chunk by chunk into one range, so each chunk must be whole pages.
void mappable_blocks(const LeafRead& p, size_t param, std::vector<MappedBlock>& out) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  if (!p.zarr.raw_chunks() || p.zarr.sharded() ||
      p.zarr.dtype() != p.target_dtype || chunk_bytes < kMinMappedBytes) {
    return;
  }
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t chunk_elements = chunk_bytes / static_cast<int64_t>(item_size(p.target_dtype));
  for (const ArrayBuilder::LocalBlock& block : p.builder->local_blocks()) {
    const Box& box = p.builder->shard(block.first).box;
    if (!p.builder->fills(block.first)) continue;
    auto indices = p.zarr.chunks_in(box);
    if (indices.empty() || (indices.size() > 1 && (page <= 0 || chunk_bytes % page != 0))) continue;
    // Chunk k must be the k-th run of the block's elements.
    bool side_by_side = true;
    for (size_t k = 0; k < indices.size() && side_by_side; ++k)
      side_by_side = box.run_offset(p.zarr.chunk_box(indices[k])) == static_cast<int64_t>(k) * chunk_elements;
    if (!side_by_side || static_cast<int64_t>(indices.size()) * chunk_elements != box.volume()) continue;
    out.push_back({param, block.first, std::move(indices), std::nullopt});
  }
}

// Locates a candidate's chunks and maps them side by side. A block with a chunk that is absent,
// of the wrong size or cannot be mapped stays unmapped: the reads take it and report what is
// wrong with it. The files are closed again (the mappings keep them): a checkpoint may have more
// chunk files than a process may hold open.
void map_block(const LeafRead& p, MappedBlock& m) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  const size_t n = m.chunks.size();
  std::optional<MappedBytes> range;
  if (n > 1) {
    std::optional<MappedBytes> reserved = reserve_mapping(chunk_bytes * static_cast<int64_t>(n));
    if (!reserved) return;
    range.emplace(std::move(*reserved));
  }
  for (size_t k = 0; k < n; ++k) {  // one file open at a time
    const std::string key = p.zarr.chunk_key(m.chunks[k]);
    std::optional<StoredValue> value;
    try {
      value = locate_chunk(p, m.chunks[k], key);
    } catch (const IoError& e) {  // a file the store names is gone: which array's chunk needed it
      throw IoError(chunk_what(p, key) + ": " + e.what());
    }
    if (!value || value->size() != chunk_bytes) return;
    if (n > 1) {
      if (!value->map_into(range->data() + static_cast<int64_t>(k) * chunk_bytes)) return;
    } else {
      std::optional<MappedBytes> mapped = value->map();
      if (!mapped) return;
      range.emplace(std::move(*mapped));
    }
  }
  m.bytes.emplace(std::move(*range));
}

// Reads chunk k of a mapped block in (from the disk when its pages are not cached: `cached` is
// what resident() said before) and compares it with its saved CRC-32C.
void check_mapped_chunk(const LeafRead& p, const MappedBlock& m, size_t k, bool cached, bool verify) {
  const std::string key = p.zarr.chunk_key(m.chunks[k]);
  const std::span<const std::byte> view = m.chunk(k, p.zarr.chunk_bytes());
  if (!cached) {  // read() brings it in faster than the mapping's page faults
    if (auto value = locate_chunk(p, m.chunks[k], key)) value->read_into_cache();
  }
  populate(view, chunk_what(p, key));
  if (verify && p.has_crc(key)) check_crc(p, key, crc32c(view));
}

}  // namespace

int64_t map_chunks(std::vector<LeafRead>& leaves, int readers, bool verify, ReadCounters& counters) {
  std::vector<MappedBlock> candidates;
  for (size_t pi = 0; pi < leaves.size(); ++pi) mappable_blocks(leaves[pi], pi, candidates);
  const int threads = default_threads(readers, 2);
  run_parallel(static_cast<int64_t>(candidates.size()), threads, [&](int64_t t) {
    MappedBlock& m = candidates[static_cast<size_t>(t)];
    map_block(leaves[m.param], m);
  });
  struct MappedChunk {
    size_t candidate, chunk;
    bool cached;  // every page in the page cache already
  };
  std::vector<MappedChunk> mapped_chunks;
  bool all_cached = true;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (!candidates[c].bytes) continue;
    for (size_t k = 0; k < candidates[c].chunks.size(); ++k) {
      const bool cached = resident(candidates[c].chunk(k, leaves[candidates[c].param].zarr.chunk_bytes()));
      mapped_chunks.push_back({c, k, cached});
      all_cached = all_cached && cached;
    }
  }
  // Cached, populating the mappings is the cores' work; reading chunks in mostly waits on the
  // disk, and more threads than cores keep more of it busy (2 cores, 2 GiB in 16 MiB chunk files,
  // 4 cold rounds: 8 threads 1.71 to 2.00 GB/s, 4 threads 1.40 to 1.88; OCDBT's 4 data files
  // 1.70 to 1.82 and 1.72 to 1.93).
  const int map_threads = all_cached ? threads : default_threads(readers, 8);
  run_parallel(static_cast<int64_t>(mapped_chunks.size()), map_threads, [&](int64_t t) {
    const MappedChunk& m = mapped_chunks[static_cast<size_t>(t)];
    check_mapped_chunk(leaves[candidates[m.candidate].param], candidates[m.candidate], m.chunk, m.cached, verify);
  });
  int64_t bytes_mapped = 0;
  for (MappedBlock& m : candidates) {
    if (!m.bytes) continue;
    bytes_mapped += m.bytes->size();
    counters.chunks += static_cast<int64_t>(m.chunks.size());
    leaves[m.param].builder->adopt(m.shard, std::move(*m.bytes));
  }
  counters.bytes += bytes_mapped;
  return bytes_mapped;
}

}  // namespace tessel::detail
