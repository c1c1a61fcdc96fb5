// Internal (not installed): JSON helpers shared by the parsers, so every JSON error reads alike.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessel/sharding/partition_spec.h"

namespace tessel::json_util {

// Insertion-ordered, so files keep their order when read and written back.
using Json = nlohmann::ordered_json;

// Parses text; a syntax error becomes ParseError(source, line, column, what went wrong).
Json parse(std::string_view text, std::string_view source);
// "null", "string", "array", ... for messages.
std::string kind(const Json& j);
// Dumps with invalid UTF-8 replaced rather than thrown on.
std::string dump(const Json& j, int indent = -1);

// A partition spec entry list: null, "axis", or ["a", "b"] per dimension.
PartitionSpec spec_from_json(const Json& j, std::string_view what);
Json spec_to_json(const PartitionSpec& spec);

}  // namespace tessel::json_util
