// Internal (not installed): the JSON texts of a saved item, written by the checkpointer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/shape.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/state/variable.h"

namespace tessel::detail {

struct ParamRecord {
  std::string path;  // '/'-joined
  std::vector<std::string> keys;
  std::vector<int> key_types;  // Orbax's KeyType per key: 1 a sequence index, 2 a dict key
  std::string name;  // '.'-joined
  Shape write_shape;
  Shape chunk_shape;
  NamedSharding sharding;
  std::string kind;
  Partitioning partitioning;
  std::map<std::string, uint32_t> crc32c;
};

// A node of the tree with no leaves (optax's EmptyState, an empty dict): Orbax records it with
// value_type "None" and skip_deserialize, so a restore rebuilds the tree's structure.
struct EmptyNode {
  std::vector<std::string> keys;
  std::vector<int> key_types;
};

// `_METADATA`; use_ocdbt and use_zarr3 say how the arrays are stored, as Orbax records it.
std::string tree_metadata_json(const std::vector<ParamRecord>& params, const std::vector<EmptyNode>& empty_nodes,
                               const Mesh& mesh, const std::optional<LogicalRules>& rules, bool use_ocdbt,
                               bool use_zarr3);
std::string sharding_json(const std::vector<ParamRecord>& params);
std::string array_metadatas_json(const std::vector<ParamRecord>& params);
// `_CHECKPOINT_METADATA`: item_handlers is a handler name or {item: handler}; `commit_ns` 0
// leaves commit_timestamp_nsecs out (not committed yet).
std::string checkpoint_metadata_json(const std::map<std::string, std::string>& item_handlers,
                                     int64_t init_ns, int64_t commit_ns);

}  // namespace tessel::detail
