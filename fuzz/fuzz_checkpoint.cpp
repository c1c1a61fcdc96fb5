// libFuzzer target for what a checkpoint directory feeds tessel: `_METADATA` (with `_sharding`),
// `.zarray` and `zarr.json`, saved sharding strings, chunk bytes through the none/zstd/blosc
// decoders, the data position `tessel train` saves beside the state, OCDBT manifests and B+tree
// nodes, zarr3 shard indexes, and a step's `_CHECKPOINT_METADATA` (Orbax's item handlers).
// The first byte picks the parser; tessel::Error is the expected outcome of bad input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"
#include "tessel/nn/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 11;
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
        auto z = tessel::detail::ZarrArray::parse(text, ".zarray");
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
      case 7: {
        const auto m = tessel::detail::decode_ocdbt_manifest({reinterpret_cast<const std::byte*>(text.data()), text.size()}, "manifest");
        (void)m.versions.size();
        break;
      }
      case 8: {
        const auto n = tessel::detail::decode_ocdbt_node({reinterpret_cast<const std::byte*>(text.data()), text.size()},
                                                 "ocdbt.process_0/", 1 << 20, "node");
        (void)n.entries.size();
        break;
      }
      case 9: {  // a zarr3 shard index: the byte after the mode gives the inner grid and position
        if (text.size() < 1) return 0;
        const int per = 1 + static_cast<uint8_t>(text[0]) % 4;
        const auto z = tessel::detail::ZarrArray::sharded_v3({16, 16}, {4 * per, 4}, {4, 4}, tessel::DType::kF32,
                                                     tessel::Compression::zstd());
        const auto index = text.substr(1, static_cast<size_t>(z.shard_index_bytes()));
        const int64_t shard = static_cast<int64_t>(text.size() - 1);
        (void)z.inner_chunk_range({reinterpret_cast<const std::byte*>(index.data()), index.size()},
                                  static_cast<uint8_t>(text[0]) / 4 % per, shard, "shard");
        break;
      }
      case 10:
        (void)tessel::parse_item_handlers(text, "_CHECKPOINT_METADATA");
        break;
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
