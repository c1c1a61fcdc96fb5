#include "tessel/checkpoint/detail/store/chunks.h"

#include <array>
#include <cstring>
#include <vector>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;

std::string chunk_what(const ChunkSource& p, const std::string& key) {
  return "'" + p.path + "' chunk " + key + " (" + p.store->describe(p.prefix + key) + ")";
}

void check_crc(const ChunkSource& p, const std::string& key, uint32_t crc) {
  if (!p.crc32c) return;
  auto it = p.crc32c->find(key);
  if (it != p.crc32c->end() && crc != it->second) {
    throw ValueError(chunk_what(p, key) + ": CRC-32C mismatch (the chunk is corrupt)");
  }
}

std::optional<StoredValue> locate_chunk(const ChunkSource& p, std::span<const int64_t> index, const std::string& key) {
  std::optional<StoredValue> value = p.store->get(p.prefix + key);
  if (!value || !p.zarr.sharded()) return value;
  const ZarrArray& z = p.zarr;
  const int64_t index_bytes = z.shard_index_bytes();
  if (value->size() < index_bytes) {
    throw ValueError(chunk_what(p, key) + ": a shard of " + std::to_string(value->size()) + " bytes cannot hold its index of " +
                     std::to_string(index_bytes));
  }
  std::vector<std::byte> table(static_cast<size_t>(index_bytes));
  value->read(z.index_at_end() ? value->size() - index_bytes : 0, table);
  const int64_t pos = z.position_in_shard(index);
  const auto range = z.inner_chunk_range(table, pos, value->size(), chunk_what(p, key));
  if (!range) return std::nullopt;
  return value->slice(range->offset, range->length,
                      chunk_what(p, key) + " inner chunk " + std::to_string(pos));
}

std::span<const std::byte> strip_chunk_crc(const ChunkSource& p, const std::string& key, std::span<const std::byte> stored) {
  if (!p.zarr.chunk_checksum()) return stored;
  if (stored.size() < 4) throw ValueError(chunk_what(p, key) + ": too short for its CRC-32C");
  uint32_t crc = 0;
  std::memcpy(&crc, stored.data() + stored.size() - 4, 4);
  const auto body = stored.first(stored.size() - 4);
  if (detail::crc32c(body) != crc) throw ValueError(chunk_what(p, key) + ": CRC-32C mismatch (the chunk is corrupt)");
  return body;
}

}  // namespace tessel::detail
