// Internal (not installed): CRC-32C (Castagnoli), the checksum of TensorStore, OCDBT and zarr3,
// used for tessel's per-chunk checksums. The SSE4.2 instruction where the CPU has it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tessel::detail {

// Extends `crc` (the value returned for the bytes before) over `data`; start from 0.
uint32_t crc32c(std::span<const std::byte> data, uint32_t crc = 0);

// The same, a byte at a time from a table: the reference the fast path is tested against.
uint32_t crc32c_bytewise(std::span<const std::byte> data, uint32_t crc = 0);

}  // namespace tessel::detail
