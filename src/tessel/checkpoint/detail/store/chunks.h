// Internal (not installed): one saved array's chunks wherever they are stored (files, OCDBT, a
// safetensors tensor), located, bounded and checked alike for restore and verify.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "tessel/checkpoint/detail/store/kvstore.h"
#include "tessel/checkpoint/detail/store/zarr.h"

namespace tessel::detail {

struct ChunkSource {
  std::string path;    // the leaf's path, for messages
  const KvStore* store = nullptr;
  std::string prefix;  // the array's keys start with it: "<name>/"
  ZarrArray zarr;
  const std::map<std::string, uint32_t>* crc32c = nullptr;  // the saved CRC-32C by chunk key (tessel's)

  bool has_crc(const std::string& key) const { return crc32c && crc32c->contains(key); }
};

// The most stored bytes a compressed chunk of `chunk_bytes` may have: anything larger is not one
// of this array's chunks, and is refused before it is read.
inline int64_t max_stored_bytes(int64_t chunk_bytes) { return chunk_bytes + chunk_bytes / 8 + (int64_t{1} << 20); }

// "'<path>' chunk <key> (<where it is stored>)", for messages.
std::string chunk_what(const ChunkSource& p, const std::string& key);
// Compares a chunk's CRC-32C with the saved one, when the checkpoint has it.
void check_crc(const ChunkSource& p, const std::string& key, uint32_t crc);
// The stored bytes of chunk `index`: a whole value, or its part of a zarr3 shard (found through
// the shard's index, whose CRC-32C is checked). nullopt when the chunk was never written.
std::optional<StoredValue> locate_chunk(const ChunkSource& p, std::span<const int64_t> index, const std::string& key);
// zarr3's crc32c codec: the chunk's bytes end in their CRC-32C, checked and cut off.
std::span<const std::byte> strip_chunk_crc(const ChunkSource& p, const std::string& key,
                                           std::span<const std::byte> stored);

}  // namespace tessel::detail
