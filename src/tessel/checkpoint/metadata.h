// The metadata of one saved PyTree item, in Orbax's layout: `_METADATA` (the tree: each leaf's
// keys, value type and write shape, plus custom_metadata where tessel keeps the logical axes, the
// mesh and rules at save time and a CRC-32C per chunk), `_sharding` (each array's saved
// NamedSharding, keyed by the URL-safe base64 of its dotted name) and
// `array_metadatas/process_0`. Reading never trusts a name: each becomes one checked path
// component.
//
//   auto item = tessel::read_item_metadata("ckpt/7/default");
//   for (const auto& p : item.params) std::cout << p.path << " " << p.name << "\n";
//   // decoder/layers/mlp/wi/kernel decoder.layers.mlp.wi.kernel
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/partition_spec.h"
#include "tessel/state/variable.h"

namespace tessel {

// A NamedSharding as `_sharding` records it: the mesh shape and axis names, and the spec.
struct SavedSharding {
  Mesh mesh;
  PartitionSpec spec;
};

// Orbax's KeyType of each key in a leaf's path: a list/tuple index or a dict key.
inline constexpr int kSequenceKey = 1;
inline constexpr int kDictKey = 2;

struct ParamMetadata {
  std::string path;               // tessel path: the keys joined by '/'
  std::string name;               // Orbax's param name: the keys joined by '.' (its directory)
  std::vector<std::string> keys;  // one per nesting level
  std::vector<int> key_types;     // per key: kSequenceKey or kDictKey
  std::string value_type;         // "jax.Array", "np.ndarray", "scalar", ...
  bool skip_deserialize = false;  // Orbax: no data stored under the name (empty node, aggregate)
  std::optional<Shape> write_shape;
  std::string kind = kParam;            // tessel: the variable's kind
  Partitioning partitioning;            // tessel: logical axes or explicit mesh axes
  std::optional<SavedSharding> sharding;  // from `_sharding`, when it holds a NamedSharding
  std::map<std::string, uint32_t> crc32c;  // tessel: chunk key -> CRC-32C of the stored bytes
  std::optional<DType> dtype;  // safetensors: the stored dtype (an Orbax item keeps it in its zarr metadata)
};

// Where an item's arrays are: Orbax's zarr arrays (in an OCDBT database or files), or the tensors
// of a safetensors file or set, each read as an array of one uncompressed chunk.
enum class StorageFormat { kOrbax, kSafetensors };

struct ItemMetadata {
  std::vector<ParamMetadata> params;  // in natural path order
  bool use_ocdbt = false;
  bool use_zarr3 = false;
  bool store_array_data_equal_to_fill_value = false;  // every chunk was written
  std::optional<Mesh> mesh;                 // tessel: the mesh at save time
  std::optional<LogicalRules> rules;        // tessel: the rules at save time
  bool written_by_tessel = false;
  StorageFormat format = StorageFormat::kOrbax;
  std::map<std::string, std::string> format_metadata;  // safetensors: `__metadata__`

  const ParamMetadata* find(std::string_view path) const;  // nullptr if absent
};

// Reads `_METADATA` and, when present, `_sharding`; for a safetensors file, set or directory
// (is_safetensors), the tensors' headers instead. Throws ParseError/ValueError/IoError naming the
// file.
ItemMetadata read_item_metadata(const std::filesystem::path& item_dir);

// The same from text (the fuzzers' entry point); `sharding_json` may be empty (no `_sharding`).
ItemMetadata parse_item_metadata(std::string_view metadata_json, std::string_view sharding_json,
                                 std::string_view source);

// Parses a `_sharding` value (the inner JSON string): a NamedSharding, or nullopt for a
// SingleDeviceSharding. Throws ValueError naming `what` otherwise.
std::optional<SavedSharding> parse_saved_sharding(std::string_view text, std::string_view what);

// URL-safe base64 with padding, as `_sharding` keys are written.
std::string base64_url_encode(std::string_view bytes);
// Throws ValueError on characters outside the URL-safe alphabet or bad padding.
std::string base64_url_decode(std::string_view text);

}  // namespace tessel
