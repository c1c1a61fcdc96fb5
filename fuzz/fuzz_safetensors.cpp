// libFuzzer target for safetensors files: the 8-byte length, the JSON header and the data section's
// size (the input's own). Every input must parse or throw tessel::Error, never crash; what parses
// must be tiled exactly and become one-chunk arrays that plan their chunk keys.
#include <cstddef>
#include <cstdint>
#include <span>

#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const tessel::detail::SafetensorsHeader h = tessel::detail::parse_safetensors_head(bytes, static_cast<int64_t>(size), "fuzz.safetensors");
    int64_t at = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != at || t.end < t.begin) __builtin_trap();
      at = t.end;
      const tessel::detail::ZarrArray z = tessel::detail::ZarrArray::one_chunk(t.shape, t.dtype);
      // One chunk holds the tensor (an empty tensor's chunk is a placeholder of size-1 dimensions).
      if (z.num_chunks() != (t.shape.num_elements() > 0 ? 1 : 0)) __builtin_trap();
      if (t.shape.num_elements() > 0 && z.chunk_bytes() != t.end - t.begin) __builtin_trap();
    }
    if (h.data_start + at != static_cast<int64_t>(size)) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
