#include "tessel/checkpoint/detail/chunk_source.h"

#include <array>
#include <cstring>
#include <vector>

#include "tessel/checkpoint/detail/crc32c.h"
#include "tessel/checkpoint/detail/file_io.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;

ZarrArray open_zarr(const KvStore& store, const fs::path& item_dir, const ItemMetadata& item,
                    const ParamMetadata& p) {
  if (item.format == StorageFormat::kSafetensors) return ZarrArray::one_chunk(*p.write_shape, *p.dtype);
  if (!store.is_ocdbt()) detail::reject_symlink(detail::child_path(item_dir, p.name, "parameter name"));
  const std::string prefix = key_prefix(p);
  std::string key;
  std::optional<std::string> text;
  if (!p.skip_deserialize) {
    for (const char* name : item.use_zarr3 ? std::array{"zarr.json", ".zarray"} : std::array{".zarray", "zarr.json"}) {
      key = prefix + name;
      text = store.get_small(key, int64_t{1} << 20);
      if (text) break;
    }
  }
  if (!text) {
    if (p.skip_deserialize || fs::exists(item_dir / "checkpoint")) {
      throw ValueError("'" + p.path + "' is not stored as a zarr array in '" + item_dir.string() +
                       "' (an Orbax aggregate msgpack value, which tessel does not read); restore the other "
                       "leaves with partial");
    }
    throw ValueError("'" + p.path + "' has no array data: neither " + store.describe(prefix + ".zarray") + " nor " +
                     store.describe(prefix + "zarr.json") + " exists");
  }
  ZarrArray z = ZarrArray::parse(*text, store.describe(key));
  if (p.write_shape && p.write_shape->rank() != z.shape().rank()) {
    throw ValueError("'" + p.path + "': _METADATA gives write_shape " + p.write_shape->to_string() + " but " + key +
                     " has shape " + z.shape().to_string());
  }
  return z;
}

std::string chunk_what(const ChunkSource& p, const std::string& key) {
  return "'" + p.path + "' chunk " + key + " (" + p.store->describe(p.prefix + key) + ")";
}

void check_crc(const ChunkSource& p, const std::string& key, uint32_t crc) {
  auto it = p.meta->crc32c.find(key);
  if (it != p.meta->crc32c.end() && crc != it->second) {
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
