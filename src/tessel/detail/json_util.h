// Internal (not installed): JSON helpers shared by every layer's parsers, so JSON errors read alike.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tessel::json_util {

// Insertion-ordered, so files keep their order when read and written back.
using Json = nlohmann::ordered_json;

// Parses text; a syntax error becomes ParseError(source, line, column, what went wrong).
Json parse(std::string_view text, std::string_view source);
// "null", "string", "array", ... for messages.
std::string kind(const Json& j);
// Dumps with invalid UTF-8 replaced rather than thrown on.
std::string dump(const Json& j, int indent = -1);

// The string member `name` of object j, or "" where it is absent or no string (for answers whose
// fields are optional and checked by the caller).
inline std::string string_member(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace tessel::json_util
