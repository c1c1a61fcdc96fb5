// The metadata of one saved PyTree item, in Orbax's layout: `_METADATA` (the tree: each leaf's
// keys, value type and write shape, plus custom_metadata where tessel keeps the logical axes, the
// mesh and rules at save time and a CRC-32C per chunk), `_sharding` (each array's saved
// NamedSharding, keyed by the URL-safe base64 of its dotted name) and
// `array_metadatas/process_0`. Reading never trusts a name: each becomes one checked path
// component.
//
//   auto item = tessel::parse_item_metadata(metadata_text, sharding_text, "ckpt/7/default/_METADATA");
//   for (const auto& p : item.params) std::cout << p.path << " " << p.name << "\n";
//   // decoder/layers/mlp/wi/kernel decoder.layers.mlp.wi.kernel
// (CheckpointItem, item.h, reads them from a directory.)
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

// Orbax's value_metadata.value_type of a leaf (its type handler's typestr).
enum class ValueType {
  kJaxArray,     // "jax.Array"
  kNumpyArray,   // "np.ndarray"
  kScalar,       // "scalar"
  kString,       // "string"
  kPlaceholder,  // "placeholder": a leaf left out on purpose
  kNone,         // "None", "Dict", "List", "Tuple", "NamedTuple": an empty node of the tree
  kDict,
  kList,
  kTuple,
  kNamedTuple,
  kUnknown,  // none recorded ("Unknown")
  kOther,    // another type handler's name
};
ValueType parse_value_type(std::string_view text);
// Orbax's name of it ("jax.Array", ...); "other" for kOther.
std::string_view value_type_name(ValueType type);
// An empty node of the tree (Orbax's is_empty_typestr): restored as the empty container.
bool is_empty_node(ValueType type);
// A leaf a restore without a target reads as an array.
bool holds_array(ValueType type);

// Orbax's KeyType of each key in a leaf's path: a list/tuple index or a dict key.
inline constexpr int kSequenceKey = 1;
inline constexpr int kDictKey = 2;

struct ParamMetadata {
  std::string path;               // tessel path: the keys joined by '/'
  std::string name;               // Orbax's param name: the keys joined by '.' (its directory)
  std::vector<std::string> keys;  // one per nesting level
  std::vector<int> key_types;     // per key: kSequenceKey or kDictKey
  ValueType value_type = ValueType::kUnknown;
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

// An item's `_METADATA` and `_sharding` texts (the fuzzers' entry point); `sharding_json` may be
// empty (no `_sharding`). Throws ParseError/ValueError naming `source`.
ItemMetadata parse_item_metadata(std::string_view metadata_json, std::string_view sharding_json,
                                 std::string_view source);

// The `_METADATA` text for an item that lost its own, from its stored keys: one jax.Array leaf per
// array (a key `<name>/.zarray` or `<name>/zarr.json`, each '.' of the name a level, as Orbax
// joins them); "" when there is none.
std::string metadata_from_array_keys(const std::vector<std::string>& stored_keys, bool use_ocdbt);

// Parses a `_sharding` value (the inner JSON string): a NamedSharding, or nullopt for a
// SingleDeviceSharding. Throws ValueError naming `what` otherwise.
std::optional<SavedSharding> parse_saved_sharding(std::string_view text, std::string_view what);

// URL-safe base64 with padding, as `_sharding` keys are written.
std::string base64_url_encode(std::string_view bytes);
// Throws ValueError on characters outside the URL-safe alphabet or bad padding.
std::string base64_url_decode(std::string_view text);

}  // namespace tessel
