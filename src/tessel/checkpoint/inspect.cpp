// Verifying a saved item: a full read of every chunk that checks sizes, decoding and checksums.
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/store/chunks.h"
#include "tessel/core/error.h"

namespace tessel {
using detail::chunk_what;
using detail::locate_chunk;
using detail::max_stored_bytes;
using detail::strip_chunk_crc;

VerifyReport verify(const CheckpointItem& item) {
  VerifyReport report;
  const ItemMetadata& meta = item.metadata();
  for (const auto& p : meta.params) {
    if (p.skip_deserialize || !holds_array(p.value_type)) continue;
    report.arrays += 1;
    std::optional<detail::ChunkSource> source;
    try {
      source = item.chunks(p);
    } catch (const Error& e) {
      report.faults.push_back(e.what());
      continue;
    }
    const detail::ZarrArray& z = source->zarr;
    for (const auto& index : z.chunks_in(Box::full(z.shape()))) {
      const std::string key = z.chunk_key(index);
      report.chunks += 1;
      try {
        const std::optional<detail::StoredValue> value = locate_chunk(*source, index, key);
        if (!value) {
          if (meta.store_array_data_equal_to_fill_value || !z.fill_value()) {
            report.faults.push_back(chunk_what(*source, key) + " is missing");
          }
          continue;
        }
        const int64_t size = value->size();
        if (size > max_stored_bytes(z.chunk_bytes())) {
          report.faults.push_back(chunk_what(*source, key) + ": " + std::to_string(size) +
                                  " bytes, too many for a chunk of " + std::to_string(z.chunk_bytes()));
          continue;
        }
        std::vector<std::byte> stored(static_cast<size_t>(size));
        value->read(0, stored);
        report.bytes += size;
        auto it = p.crc32c.find(key);
        if (it != p.crc32c.end()) {
          report.checksums += 1;
          if (detail::crc32c(stored) != it->second) {
            report.faults.push_back(chunk_what(*source, key) + ": CRC-32C mismatch");
            continue;
          }
        }
        if (z.chunk_checksum()) report.checksums += 1;
        if (it == p.crc32c.end() && !z.chunk_checksum()) report.unchecked += 1;
        std::vector<std::byte> decoded(static_cast<size_t>(z.chunk_bytes()));
        decompress(z.compression(), strip_chunk_crc(*source, key, stored), decoded, chunk_what(*source, key));
      } catch (const Error& e) {
        report.faults.push_back(e.what());
      }
    }
  }
  return report;
}

}  // namespace tessel
