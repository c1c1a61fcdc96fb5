// Inspecting a saved item without restoring it: its abstract state, per-array storage facts, and
// a full read of every chunk that checks sizes, decoding and checksums.
#include <set>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/chunk_source.h"
#include "tessel/checkpoint/detail/crc32c.h"
#include "tessel/checkpoint/detail/kvstore.h"
#include "tessel/core/error.h"

namespace tessel {
namespace fs = std::filesystem;
using detail::chunk_what;
using detail::key_prefix;
using detail::locate_chunk;
using detail::max_stored_bytes;
using detail::open_zarr;
using detail::strip_chunk_crc;


State saved_abstract_state(const fs::path& item_dir) {
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  State out;
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    ZarrArray z = open_zarr(store, item_dir, item, p);
    std::optional<NamedSharding> s;
    if (p.sharding) s = NamedSharding(p.sharding->mesh, p.sharding->spec);
    out.insert(p.path, Variable::abstract(p.kind, z.shape(), z.dtype(), s, p.partitioning));
  }
  return out;
}

std::vector<SavedArrayInfo> describe_item(const fs::path& item_dir) {
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  std::vector<SavedArrayInfo> out;
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    ZarrArray z = open_zarr(store, item_dir, item, p);
    SavedArrayInfo info{p, z.shape(), z.dtype(), z.chunks(), z.compression(), z.num_chunks(), 0};
    std::set<std::string> keys;  // a zarr3 shard holds several chunks
    for (const auto& index : z.chunks_in(Box::full(z.shape()))) keys.insert(z.chunk_key(index));
    for (const auto& key : keys) {
      if (const auto v = store.get(key_prefix(p) + key)) info.stored_bytes += v->size();
    }
    out.push_back(std::move(info));
  }
  return out;
}

VerifyReport verify(const fs::path& item_dir) {
  VerifyReport report;
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    report.arrays += 1;
    std::optional<ZarrArray> z;
    try {
      z = open_zarr(store, item_dir, item, p);
    } catch (const Error& e) {
      report.faults.push_back(e.what());
      continue;
    }
    const detail::ChunkSource plan{p.path, &p, &store, key_prefix(p), *z};
    for (const auto& index : z->chunks_in(Box::full(z->shape()))) {
      const std::string key = z->chunk_key(index);
      report.chunks += 1;
      try {
        const std::optional<detail::StoredValue> value = locate_chunk(plan, index, key);
        if (!value) {
          if (item.store_array_data_equal_to_fill_value || !z->fill_value()) {
            report.faults.push_back(chunk_what(plan, key) + " is missing");
          }
          continue;
        }
        const int64_t size = value->size();
        if (size > max_stored_bytes(z->chunk_bytes())) {
          report.faults.push_back(chunk_what(plan, key) + ": " + std::to_string(size) + " bytes, too many for a chunk of " +
                                  std::to_string(z->chunk_bytes()));
          continue;
        }
        std::vector<std::byte> stored(static_cast<size_t>(size));
        value->read(0, stored);
        report.bytes += size;
        auto it = p.crc32c.find(key);
        if (it != p.crc32c.end()) {
          report.checksums += 1;
          if (detail::crc32c(stored) != it->second) {
            report.faults.push_back(chunk_what(plan, key) + ": CRC-32C mismatch");
            continue;
          }
        }
        if (z->chunk_checksum()) report.checksums += 1;
        std::vector<std::byte> decoded(static_cast<size_t>(z->chunk_bytes()));
        decompress(z->compression(), strip_chunk_crc(plan, key, stored), decoded, chunk_what(plan, key));
      } catch (const Error& e) {
        report.faults.push_back(e.what());
      }
    }
  }
  return report;
}


}  // namespace tessel
