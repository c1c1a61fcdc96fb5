// libFuzzer target for what a checkpoint directory feeds tessel: `_METADATA` (with `_sharding`),
// `.zarray`, saved sharding strings, chunk bytes through the none/zstd/blosc decoders, and the
// data position `tessel train` saves beside the state.
// The first byte picks the parser; tessel::Error is the expected outcome of bad input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/checkpoint/zarr.h"
#include "tessel/core/error.h"
#include "tessel/nn/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 7;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (mode) {
      case 0: {  // _METADATA, then _sharding after a NUL
        const size_t nul = text.find('\0');
        auto item = tessel::parse_item_metadata(text.substr(0, nul),
                                                nul == std::string_view::npos ? std::string_view() : text.substr(nul + 1),
                                                "_METADATA");
        for (const auto& p : item.params) (void)p.name.size();
        break;
      }
      case 1: {
        auto z = tessel::ZarrArray::parse(text, ".zarray");
        (void)z.to_json();
        (void)z.num_chunks();
        break;
      }
      case 2:
        (void)tessel::parse_saved_sharding(text, "_sharding");
        break;
      case 3:
      case 4:
      case 5: {  // chunk bytes: two bytes of decoded size, then the stored bytes
        if (text.size() < 2) return 0;
        const size_t n = static_cast<uint8_t>(text[0]) | (static_cast<size_t>(static_cast<uint8_t>(text[1])) << 8);
        std::vector<std::byte> out(n * 4);
        const auto* p = reinterpret_cast<const std::byte*>(text.data() + 2);
        const tessel::Compression c = mode == 3 ? tessel::Compression::none()
                                      : mode == 4 ? tessel::Compression::zstd()
                                                  : tessel::Compression{tessel::Compression::Kind::kBlosc, 0};
        tessel::decompress(c, {p, text.size() - 2}, out, "chunk");
        break;
      }
      case 6:
        (void)tessel::nn::DataPosition::from_json(std::string(text), nullptr);
        break;
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
