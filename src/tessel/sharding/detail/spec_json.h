// Internal (not installed): PartitionSpec <-> JSON, shared by partition_spec.cpp and spec_io.cpp.
#pragma once

#include <string_view>

#include "tessel/detail/json_util.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel::spec_json {

using json_util::Json;

// A partition spec as an array of null, "axis" or ["a", "b"] per dimension ([] also means null).
PartitionSpec from_json(const Json& j, std::string_view what);
// JAX-normalized: a single axis as its name, no axes as null.
Json to_json(const PartitionSpec& spec);

}  // namespace tessel::spec_json
